"""Connections: the pool, retrying a statement once after a lost connection, and the caller's own
connection for transactional enqueue."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ultimat3.core.clock import Clock
from ultimat3.core.errors import first_line
from ultimat3.core.throttle import ThrottledLog
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.postgres.rows import (
    _SCHEMES,
    Conn,
    T,
    _tuples,
)

_log = logging.getLogger("ultimat3.drivers.postgres.driver")
_throttled = ThrottledLog(_log)


#: Seconds the first connection may take before the driver reports the server unreachable.
CONNECT_TIMEOUT = 5

def conninfo_from_url(url: str) -> str:
    """The libpq URL for a ``postgres://``, ``postgresql://`` or ``postgresql+psycopg://`` URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise DriverError(
            f"{url!r} is not a PostgreSQL URL",
            "write postgresql://user:password@host:5432/database",
            code="X_DATABASE_URL",
        )
    return "postgresql://" + rest


#: What a transaction-mode pooler answers to a named prepared statement once the server connection
#: under a client changed: "already exists" (another client prepared the name there) or "does not
#: exist" (ours was prepared on the previous server connection). Neither ran the statement.
_POOLER_ERRORS = (pg_errors.DuplicatePreparedStatement, pg_errors.InvalidSqlStatementName)
#: psycopg's own default: a statement is prepared on the server after this many executions.
PREPARE_THRESHOLD = 5


class _Database:
    """The pool, the clock and the retry-once-on-a-lost-connection rule, shared by every part.

    Prepared statements: preparing the hot statements on the server saves planning them (about
    10% of claim/ack throughput on a direct connection, measured). But behind a transaction-mode
    pooler the server connection changes between transactions, and a prepared name is then missing,
    someone else's (an error), or, worst, someone else's statement with the same parameters (it
    runs). So preparation is OFF until the connection is proven to be a real session: the driver's
    listener, on this URL, hears a NOTIFY sent from another session (see :meth:`Listener`'s probe).
    Should a pooler error show up anyway, preparation goes off again and the operation is run
    once more (nothing of the failed statement ran).
    """

    def __init__(self, pool: ConnectionPool[Conn], clock: Clock) -> None:
        self.pool = pool
        self.clock = clock
        #: True once sessions on this URL are proven real (direct, or a session-mode pooler).
        self.prepared = False
        #: Called once when a pooler error shows up.
        self.on_pooler: Callable[[], None] | None = None

    def now(self) -> float:
        return self.clock.now()

    def run(self, op: Callable[[Conn, bool], T]) -> T:
        """``op(conn, retrying)`` on a pooled connection, once more on a fresh one if it was lost."""
        retrying = False
        while True:
            used: Conn | None = None
            preparing = False
            try:
                with self.pool.connection() as conn:
                    used = conn
                    preparing = self.prepared
                    conn.prepare_threshold = PREPARE_THRESHOLD if preparing else None
                    return op(conn, retrying)
            except _POOLER_ERRORS as exc:
                # Only an operation that could have prepared is run again; without preparation
                # these errors cannot recur, so this happens at most once per operation.
                if used is None or not preparing:
                    raise
                used.prepare_threshold = None
                if self.prepared:
                    self.prepared = False
                    _log.warning(
                        "X_DB_POOLER: a transaction-mode connection pooler is in front of PostgreSQL (%s);"
                        " server-side prepared statements are off for this driver from now on",
                        first_line(exc, type(exc).__name__), extra={"code": "X_DB_POOLER"},
                    )
                    if self.on_pooler is not None:
                        self.on_pooler()
                # Statements before the failed one may have committed (autocommit): say so.
                retrying = True
            except PoolClosed as exc:
                raise DriverError(
                    "the PostgresDriver was closed",
                    "use the driver before close(), or create a new one",
                    code="X_DRIVER_CLOSED",
                ) from exc
            except PoolTimeout as exc:
                raise DriverError(
                    f"no PostgreSQL connection within {self.pool.timeout:g}s: {exc}",
                    "check that the server at X_DATABASE_URL is up and accepts connections",
                    code="X_DATABASE_UNREACHABLE",
                ) from exc
            except psycopg.OperationalError as exc:
                # Only a dead connection is retried: a query error on a live one is the caller's.
                if used is None or not used.closed:
                    raise
                if retrying:
                    raise DriverError(
                        f"lost the PostgreSQL connection twice in a row: {exc}",
                        "check that the server at X_DATABASE_URL is up; the operation may be retried",
                        code="X_DATABASE_UNREACHABLE",
                    ) from exc
                first = first_line(exc, type(exc).__name__)
                _throttled.warning("connection", "PostgreSQL connection lost (%s); retrying once on a fresh one", first)
                # A restart kills every idle connection at once: drop them all, not one per call.
                self.pool.check()
                retrying = True


def _caller_connection(connection: Any) -> Conn:
    """The psycopg connection behind a caller's psycopg or SQLAlchemy ``Connection``."""
    if isinstance(connection, psycopg.Connection):
        return connection
    # Imported here: only transactional enqueues pay for loading SQLAlchemy.
    from sqlalchemy.engine import Connection as SAConnection

    if isinstance(connection, SAConnection):
        # What any execute on it would do ("autobegin"): the caller's commit() then covers the job.
        if not connection.in_transaction():
            connection.begin()
        raw = connection.connection.driver_connection
        if isinstance(raw, psycopg.Connection):
            return raw
        raise DriverError(
            f"the SQLAlchemy connection uses the {connection.dialect.driver!r} DBAPI, not psycopg 3",
            'create the engine as create_engine("postgresql+psycopg://...") to enqueue inside it',
            code="X_DRIVER_CONNECTION",
        )
    raise DriverError(
        f"cannot enqueue inside a {type(connection).__module__}.{type(connection).__qualname__}",
        "pass a psycopg (3) Connection or a SQLAlchemy Connection on a postgresql+psycopg engine,"
        " in the transaction the job must commit with (an async connection or AsyncSession goes to"
        " `await job.aenqueue(..., connection=...)`)",
        code="X_DRIVER_CONNECTION",
    )


@contextmanager
def _all_or_nothing(conn: Conn) -> Iterator[None]:
    """Make several statements on a caller's connection atomic without ending its transaction.

    In autocommit there is no caller transaction: open (and commit) our own. Otherwise a savepoint,
    so a failure undoes only our rows and the caller's transaction stays usable (and theirs to end).
    psycopg's ``transaction()`` is not used there: on an idle connection it would COMMIT on exit.
    """
    if conn.autocommit:
        with conn.transaction():
            yield
        return
    with _tuples(conn) as cur:
        cur.execute("SAVEPOINT x_enqueue")
        try:
            yield
        except BaseException:
            if not conn.closed:
                with suppress(psycopg.Error):
                    cur.execute("ROLLBACK TO SAVEPOINT x_enqueue")
                    cur.execute("RELEASE SAVEPOINT x_enqueue")
            raise
        cur.execute("RELEASE SAVEPOINT x_enqueue")
