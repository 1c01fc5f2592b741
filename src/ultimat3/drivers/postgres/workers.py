"""The PostgreSQL driver's worker registry. Liveness is a session-level advisory lock per worker,
held on a connection of its own that the worker keeps open for its whole life (on the driver's
``direct_url`` when it has one): the server frees the lock the moment that connection dies (the
process was killed, the host is gone, the network cut it), with no timer involved. Any other
session can tell by looking for the key in ``pg_locks``.

Behind a transaction-mode pooler a "session" is not one: the lock stays on whichever server
connection ran the statement, which the pooler hands to others and may close at any time. Each
beat checks that it runs on the server process that took the lock; once it does not, the row is
unpinned (``backend_pid`` NULL), one ``X_DB_SESSION_POOLED`` line says what to set, and nobody
rescues that worker (its jobs come back at their visibility lapse): an unknown is never "dead".
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from typing import TYPE_CHECKING

import psycopg

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import first_line
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.postgres.database import CONNECT_TIMEOUT
from ultimat3.drivers.postgres.rows import _Q, Conn, Row, _rows, _tuples
from ultimat3.drivers.protocol import RescuedJob, WorkerInfo, WorkerRecord
from ultimat3.drivers.workers import LOST_PREFIX, LOST_SUFFIX, id_taken, running_by_worker, unknown_worker

if TYPE_CHECKING:
    from ultimat3.drivers.postgres.driver import PostgresDriver

__all__ = ["PostgresWorkerRegistry"]

_log = logging.getLogger("ultimat3.drivers.postgres.driver")

#: How long register() waits for a key that a rescuer's probe holds for an instant.
_REGISTER_PATIENCE = 2.0
#: How long abandon() waits, at most, for the server to end the abandoned session.
ABANDON_WAIT = 5.0


class _Held:
    """One registered worker of this process: its info, its liveness connection, and the server
    process that took its lock (``None`` once a pooler was seen under that connection)."""

    __slots__ = ("backend", "conn", "info", "lock", "since")

    def __init__(self, info: WorkerInfo, conn: Conn, backend: int | None) -> None:
        self.info = info
        self.backend = backend
        self.lock = threading.RLock()  # beat -> warn_pooled_session -> unpin_all re-enters it
        self.conn = conn
        #: When this session began (monotonic): a young session does not judge others yet.
        self.since = time.monotonic()

    def reconnected(self, conn: Conn, backend: int | None) -> None:
        """A new session replaced a lost one."""
        self.conn, self.backend, self.since = conn, backend, time.monotonic()


class PostgresWorkerRegistry:
    """:class:`~ultimat3.drivers.protocol.WorkerRegistry` over ``x_workers`` and advisory locks.

    ``settle``: a worker whose own liveness session is younger than this many seconds rescues
    nobody. When the server restarts, every session dies at once and every key is free for a
    moment; the workers that reconnect first must not take the others' jobs before those have
    reconnected too (each does within a beat). A SIGKILLed worker is found by workers whose
    sessions are old, at once.
    """

    def __init__(self, driver: PostgresDriver, settle: float = 3.0) -> None:
        self._driver = driver
        self.settle = settle
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}

    # -- this process's workers -----------------------------------------------------------------

    def _connect(self, info: WorkerInfo) -> tuple[Conn, int | None]:
        """A liveness connection holding the worker's lock, its row written through it; and the
        server process that holds the lock (``None`` when a pooler is known to be in between)."""
        try:
            conn: Conn = psycopg.connect(
                self._driver.session_conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                application_name=f"ultimat3 worker {info.id}"[:63], prepare_threshold=None,
            )
        except psycopg.OperationalError as exc:
            raise DriverError(
                f"cannot open the liveness connection of worker {info.id!r}: {first_line(exc, type(exc).__name__)}",
                "check that PostgreSQL is up and accepts one more connection per worker",
                code="X_DATABASE_UNREACHABLE",
            ) from exc
        try:
            deadline = time.monotonic() + _REGISTER_PATIENCE
            while True:
                row = conn.execute(_Q["worker_lock"], {"id": info.id}).fetchone()
                if row is not None and row[0]:
                    break
                if time.monotonic() >= deadline:
                    raise id_taken(info.id)
                time.sleep(0.02)
            backend: int | None = int(row[1])
            if self._driver.pooled_sessions:
                backend = None  # a pooler is known to be in between: the lock proves nothing
            self._upsert(conn, info, backend)
        except BaseException:
            conn.close()
            raise
        return conn, backend

    def _upsert(self, conn: Conn, info: WorkerInfo, backend: int | None) -> None:
        conn.execute(_Q["worker_upsert"], {
            "id": info.id, "host": info.host, "pid": info.pid, "concurrency": info.concurrency,
            "queues": None if info.queues is None else list(info.queues),
            "now": to_datetime(self._driver.clock.now()), "backend": backend,
        })

    def register(self, info: WorkerInfo) -> None:
        """Open the worker's liveness connection, take its lock, write its row."""
        conn, backend = self._connect(info)
        if backend is None:
            self._driver.warn_pooled_session()
        with self._lock:
            self._held[info.id] = _Held(info, conn, backend)

    def beat(self, worker_id: str, clock_offset: float | None = None, wakeups: str | None = None) -> bool:
        """Refresh the row through the liveness connection (which proves it alive); when that
        connection died or the row was removed, reconnect, re-lock and rewrite it."""
        with self._lock:
            held = self._held.get(worker_id)
        if held is None:
            raise unknown_worker(worker_id)
        params: dict[str, object] = {"id": worker_id, "clock_offset": clock_offset, "wakeups": wakeups}
        with held.lock:
            try:
                params["now"] = to_datetime(self._driver.clock.now())
                row = held.conn.execute(_Q["worker_beat"], params).fetchone()
                if row is not None:
                    if held.backend is not None and int(row[0]) != held.backend:
                        # Not the server process that took the lock: a pooler is in between.
                        held.backend = None
                        held.conn.execute(_Q["worker_unpin"], {"id": worker_id})
                        self._driver.warn_pooled_session()
                    return True
                self._upsert(held.conn, held.info, held.backend)  # a rescue removed the row: we are back
            except psycopg.OperationalError:
                if not held.conn.closed:
                    raise
                # The session died, and the lock with it: take both again (our jobs, if another
                # worker rescued them meanwhile, are fenced away from us already).
                held.reconnected(*self._connect(held.info))
            params["now"] = to_datetime(self._driver.clock.now())
            held.conn.execute(_Q["worker_beat"], params)
            return False

    def unregister(self, worker_id: str) -> None:
        """Remove the row, then close the liveness connection (freeing the lock)."""
        with self._lock:
            held = self._held.pop(worker_id, None)
        if held is None:
            return
        with held.lock:
            try:
                if not held.conn.closed:
                    held.conn.execute(_Q["worker_delete"], {"id": worker_id})
                else:
                    self._driver._db.run(lambda conn, _: conn.execute(_Q["worker_delete"], {"id": worker_id}))
            finally:
                held.conn.close()

    def abandon(self, worker_id: str) -> None:
        """Close the liveness connection and keep the row: what a death looks like to the server.
        Returns once the server has ended that session (its lock is freed asynchronously after the
        client hangs up; a rescue made before would still find the worker alive)."""
        with self._lock:
            held = self._held.pop(worker_id, None)
        if held is None:
            return
        with held.lock:
            held.conn.close()
            backend = held.backend
        if backend is None:
            return  # behind a pooler no lock proves anything, so there is nothing to wait for
        deadline = time.monotonic() + ABANDON_WAIT
        while time.monotonic() < deadline:
            row = self._driver._db.run(lambda conn, _: conn.execute(_Q["backend_alive"], {"pid": backend}).fetchone())
            if row is None or not row[0]:
                return
            time.sleep(0.01)

    def unpin_all(self) -> None:
        """A pooler was found in front of our sessions: no lock of ours proves anything any more,
        so every worker of this process is marked so (nobody will rescue it on a free key)."""
        with self._lock:
            held_all = list(self._held.items())
        for worker_id, held in held_all:
            with held.lock:
                if held.backend is None:
                    continue
                held.backend = None
                try:
                    held.conn.execute(_Q["worker_unpin"], {"id": worker_id})
                except psycopg.Error as exc:  # the next beat re-registers it unpinned
                    _log.debug("could not unpin worker %s: %s", worker_id, exc)

    def close(self) -> None:
        """The driver is closing: every liveness connection it holds closes too."""
        with self._lock:
            ids = list(self._held)
        for worker_id in ids:
            self.abandon(worker_id)

    # -- the fleet ------------------------------------------------------------------------------

    def list(self) -> list[WorkerRecord]:
        """Every registered worker by id, with what ``pg_locks`` says of its session."""

        def op(conn: Conn, _: bool) -> tuple[list[Row], dict[str, tuple[str, ...]]]:
            rows = _rows(conn).execute(_Q["worker_list"]).fetchall()
            return rows, running_by_worker(_tuples(conn).execute(_Q["worker_running"]).fetchall())

        rows, running = self._driver._db.run(op)
        records = []
        for row in rows:
            if row["backend_pid"] is None:
                alive, why = True, ("liveness unknown: its session goes through a connection pooler"
                                    " (set X_DATABASE_DIRECT_URL); left to the visibility timeout")
            elif row["held"]:
                alive, why = True, "its database session holds its advisory lock"
            else:
                alive, why = False, "its database session is gone: nobody holds its advisory lock"
            records.append(WorkerRecord(
                id=row["id"], host=row["host"], pid=row["pid"], concurrency=row["concurrency"],
                queues=None if row["queues"] is None else tuple(row["queues"]),
                started_at=row["started_at"], last_seen_at=row["last_seen_at"], alive=alive, why=why,
                running=running.get(row["id"], ()), clock_offset=row["clock_offset"],
                wakeups=row["wakeups"],
            ))
        return records

    def rescue(self, worker_id: str) -> builtins.list[RescuedJob]:
        """One transaction: find workers pinned to a real session whose key nobody holds (taking
        the keys to the end), put their running jobs back to ready, remove their rows, NOTIFY."""
        now = to_datetime(self._driver.clock.now())

        def op(conn: Conn, _: bool = False) -> list[RescuedJob]:
            with conn.transaction():
                cur = _tuples(conn)
                dead = [row[0] for row in cur.execute(_Q["worker_dead"], {"me": worker_id}).fetchall()]
                if not dead:
                    return []
                rows = cur.execute(_Q["worker_release_jobs"], {
                    "dead": dead, "now": now, "error_prefix": LOST_PREFIX, "error_suffix": LOST_SUFFIX,
                    "channel": self._driver.channel,
                }).fetchall()
            return [RescuedJob(job_id=row[0], queue=row[1], worker_id=row[2]) for row in rows]

        with self._lock:
            held = self._held.get(worker_id)
        if held is None:
            rescued = self._driver._db.run(op)
        else:
            # Judged from the caller's own liveness session: if the server restarted since the
            # last beat, that session is dead too and this fails instead of finding everyone dead.
            with held.lock:
                if time.monotonic() - held.since < self.settle:
                    return []
                try:
                    rescued = op(held.conn)
                except psycopg.OperationalError as exc:
                    if not held.conn.closed:
                        raise
                    raise DriverError(
                        f"the liveness session of worker {worker_id!r} was lost: {first_line(exc, type(exc).__name__)}",
                        "nothing to do: the next beat reconnects, and the rescue waits until sessions settle",
                        code="X_DATABASE_UNREACHABLE",
                    ) from exc
        # Rescued jobs keep their run_at: claim cursors past it walk these queues from the head.
        self._driver._cursors.rescan({r.queue for r in rescued})
        self._driver._wake([r.queue for r in rescued])
        return rescued
