"""The PostgreSQL driver: psycopg 3 over a ``psycopg_pool.ConnectionPool``, for a fleet of workers.

Every statement is in ``queries.sql`` and every value a parameter. Every time written or compared
comes from the driver's clock, passed in as an aware UTC datetime: by default a
:class:`~ultimat3.core.clock.ReferenceClock` that follows the SERVER's clock (one clock for the
whole fleet, whatever each host's wall clock says), or a clock the caller injects (the contract
suite moves a :class:`~ultimat3.core.ManualClock` instead of sleeping).

Pooled connections run in autocommit: the hot paths (enqueue, claim, ack, nack, heartbeat, a
step's checkpoint) are each ONE statement, i.e. one round trip, and atomic on their own. Only the
few multi-statement operations open a transaction.

Connection loss (a server restart, ``pg_terminate_backend``): the statement is retried once on a
fresh connection after the pool has dropped its other dead ones. Retrying is safe or harmless
everywhere: an enqueue or a lease carries its own id/token, minted before the first try, so the
retry first looks for what the lost attempt may have committed; a claim whose reply was lost
leaves its jobs ``running`` until their visibility lapses and they are claimed again (jobs are
at-least-once anyway); a settlement or heartbeat that did commit reports ``False`` on the retry.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, suppress
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from ultimat3.core.clock import Clock, ReferenceClock, to_datetime
from ultimat3.core.errors import first_line
from ultimat3.core.throttle import ThrottledLog
from ultimat3.drivers.errors import DriverError, JobDuplicateError
from ultimat3.drivers.fair import check_weights, fair_passes, weight_arrays
from ultimat3.drivers.postgres.aio import AsyncBatcher, AsyncPools, enqueue_on_async
from ultimat3.drivers.postgres.batch import batch_steps, drive, race_lost
from ultimat3.drivers.postgres.cursors import ClaimCursors
from ultimat3.drivers.postgres.database import (
    CONNECT_TIMEOUT,
    _all_or_nothing,
    _caller_connection,
    _Database,
    conninfo_from_url,
)
from ultimat3.drivers.postgres.flow import claim_flow
from ultimat3.drivers.postgres.listener import Listener
from ultimat3.drivers.postgres.operations import PostgresAuditLog, PostgresQueueControl, postgres_bulk
from ultimat3.drivers.postgres.rows import (
    _LISTEN_READY_TIMEOUT,
    _PLAN_EACH_TIME,
    _Q,
    _RACE_RETRIES,
    DEFAULT_CHANNEL,
    PRUNE_CHUNK,
    ClaimedRow,
    Conn,
    Row,
    _as_is,
    _claimed,
    _job,
    _rows,
    _session_utc,
    _tuples,
)
from ultimat3.drivers.postgres.schedules import PostgresScheduleStore
from ultimat3.drivers.postgres.stores import (
    PostgresBackfillLedger,
    PostgresIntrospection,
    PostgresLeaseStore,
    PostgresMigrationLedger,
    PostgresStepStore,
)
from ultimat3.drivers.postgres.workers import PostgresWorkerRegistry
from ultimat3.drivers.protocol import (
    Ack,
    BulkBatch,
    BulkRequest,
    ClaimBatch,
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    JobRecord,
    NackRequest,
    SnapshotHolder,
    WakeCallback,
)
from ultimat3.drivers.sql import load_migrations
from ultimat3.drivers.staging import StagedJob, stage, stage_many
from ultimat3.drivers.values import (
    fenced_key,
    is_storable_text,
    result_text,
    storable,
    unknown_key,
)

__all__ = [
    "DEFAULT_CHANNEL",
    "PostgresBackfillLedger",
    "PostgresDriver",
    "PostgresIntrospection",
    "PostgresLeaseStore",
    "PostgresMigrationLedger",
    "PostgresStepStore",
    "conninfo_from_url",
]

_log = logging.getLogger(__name__)
#: How long the one-shot session probe waits for its NOTIFY (a direct connection answers in ~1 ms).
_PROBE_TIMEOUT = 1.0
_skew_log = ThrottledLog(_log, every=60.0)

#: A host whose wall clock is further than this from the server's is told so (X_CLOCK_SKEW).
SKEW_WARNING = 1.0


def _warn_skew(offset: float) -> None:
    """One coded line, at most once a minute, when this host's clock is off the server's."""
    if abs(offset) <= SKEW_WARNING:
        return
    direction = "ahead of" if offset > 0 else "behind"
    host = socket.gethostname()
    _skew_log.warning(
        "X_CLOCK_SKEW",
        "X_CLOCK_SKEW: the clock of host %s is %.1fs %s the database server's; every time that"
        " coordinates workers is taken from the server, so jobs stay correct, but this host's logs"
        " and local timestamps are off (hint: run NTP on this host, e.g. chrony or systemd-timesyncd)",
        host, abs(offset), direction,
        code="X_CLOCK_SKEW", offset=offset, host=host,
    )


def _claim_order(row: ClaimedRow) -> tuple[int, Any, str]:
    """Claim order: priority (highest first), then run_at, then id."""
    job = row[0].job
    return -job.priority, job.run_at, job.id


class _Staged:
    """A staged job (:mod:`ultimat3.drivers.staging`) with its values as PostgreSQL stores them.

    ``params`` (one statement's parameters) is built on first use: a batch reads the columns
    straight from the request instead (:func:`ultimat3.drivers.postgres.batch.batch_steps`).
    """

    __slots__ = ("_params", "id", "now", "request", "run_at", "run_id", "staged")

    def __init__(self, request: EnqueueRequest, now: float, staged: StagedJob | None = None) -> None:
        self.staged = stage(request) if staged is None else staged
        self.request = request
        self.id = self.staged.id
        self.run_id = self.staged.run_id
        self.now = now
        #: Epoch seconds it may first run at.
        self.run_at = self.staged.run_at(now)
        self._params: dict[str, Any] | None = None

    @classmethod
    def many(cls, requests: Sequence[EnqueueRequest], now: float) -> list[_Staged]:
        """A batch staged at ``now``, every request validated first, ids minted in bulk."""
        return [cls(request, now, staged) for request, staged in zip(requests, stage_many(requests), strict=True)]

    @property
    def params(self) -> dict[str, Any]:
        """The parameters of ``enqueue`` (the one-job statement)."""
        if self._params is None:
            columns = self.staged.columns(self.now)
            self._params = {
                **columns,
                "payload": Jsonb(self.staged.payload, dumps=_as_is),
                "run_at": to_datetime(columns["run_at"]),
                "now": to_datetime(self.now),
            }
        return self._params

    def duplicate(self, existing_id: str) -> JobDuplicateError:
        """The error for ``on_conflict='error'`` when ``existing_id`` holds this job's key."""
        return self.staged.duplicate(existing_id)


def _settled(acks: Sequence[Ack], usable: list[bool], rows: list[Any]) -> list[bool]:
    """Per ack, in order: whether ``ack_many`` (whose rows start with the settled id) settled it."""
    done = {row[0] for row in rows}
    return [ok and a.job_id in done for a, ok in zip(acks, usable, strict=True)]


class _AckRounds:
    """An ack batch as ``ack_many`` statements, run in order in one transaction, none holding a
    job id twice.

    ``ack_many`` returns the settled ids (the token it matched is already cleared when RETURNING
    runs), so an id must appear once per statement for its answer to be that ack's: a batch
    holding a stale and a live claim of one job (it lapsed and was claimed again) is split, and
    whichever of the two is live settles, in its round."""

    __slots__ = ("acks", "rounds")

    def __init__(self, driver: PostgresDriver, acks: Sequence[Ack]) -> None:
        self.acks = acks
        groups: list[list[int]]
        if len({a.job_id for a in acks}) == len(acks):  # the worker's case: one round
            groups = [list(range(len(acks)))]
        else:
            seen: dict[str, int] = {}
            groups = []
            for i, ack in enumerate(acks):
                n = seen.get(ack.job_id, 0)
                seen[ack.job_id] = n + 1
                if n == len(groups):
                    groups.append([])
                groups[n].append(i)
        # Every round's acks and parameters before anything runs: a result that cannot be stored
        # is refused with nothing written.
        subsets = [acks] if len(groups) == 1 else [[acks[i] for i in group] for group in groups]
        self.rounds = [(group, subset, *driver._ack_params(subset))
                       for group, subset in zip(groups, subsets, strict=True)]

    @property
    def writes(self) -> bool:
        """Whether any ack can settle (is storable)."""
        return any(params is not None for _, _, params, _ in self.rounds)

    @property
    def single(self) -> bool:
        """Whether the batch is one statement (needs no transaction of its own)."""
        return len(self.rounds) == 1

    def run(self, conn: Conn) -> list[Any]:
        """Execute each round on its own cursor (in a pipeline their rows are read after)."""
        return [None if params is None else _tuples(conn).execute(_Q["ack_many"], params, prepare=_PLAN_EACH_TIME)
                for _, _, params, _ in self.rounds]

    def settled(self, cursors: list[Any]) -> list[bool]:
        """Per ack, in order, whether it settled; ``cursors`` as :meth:`run` returned them."""
        out = [False] * len(self.acks)
        for (group, subset, _, usable), cur in zip(self.rounds, cursors, strict=True):
            rows = [] if cur is None else cur.fetchall()
            for i, ok in zip(group, _settled(subset, usable, rows), strict=True):
                out[i] = ok
        return out


def _implicit_transaction(conn: Conn) -> AbstractContextManager[Any]:
    """A pipeline on an autocommit connection, with no BEGIN and no COMMIT: PostgreSQL runs every
    statement sent before the pipeline's one Sync in one implicit transaction, rolled back whole
    if any of them fails, and committed at the Sync. The statements go out together and come
    back in one round trip. psycopg's ``transaction()`` inside a pipeline syncs at BEGIN and at
    COMMIT (two more round trips): an A/B of three statements measured 440 us of wall and 300 us
    of client CPU with it, 164 and 120 without. Only for statements that need none of each
    other's results (they are all sent before any comes back)."""
    return conn.pipeline()


def _cached_plan(cur: Any) -> None:
    """Have the claim that follows in this transaction run its cached plan (``claim_plan``) when
    the connection prepares statements; behind a transaction-mode pooler nothing is prepared and
    every claim is planned anyway, with its values."""
    if cur.connection.prepare_threshold is not None:
        cur.execute(_Q["claim_plan"])


class _ClaimPlan:
    """One claim's statements, from the driver's cursor plan: run alone (:meth:`PostgresDriver.claim`)
    or after acks in their transaction (:meth:`PostgresDriver.ack_and_claim`), then folded back into
    the cursors by :meth:`finish` (or :meth:`failed`)."""

    def __init__(self, driver: PostgresDriver, request: ClaimRequest, queues: list[str] | None,
                 names: list[str] | None) -> None:
        self.driver, self.request, self.queues = driver, request, queues
        now = driver.clock.now()
        listener = driver.listener
        self.now = now
        self.plan = driver._cursors.plan(queues, names, now, request.visibility_timeout,
                                         heard=listener is not None and listener.hears is True)
        self.base: dict[str, Any] = {
            "now": to_datetime(now),
            "visible_at": to_datetime(now + request.visibility_timeout),
            "worker": request.worker_id,
            "names": names,
        }
        waiting = {**self.base, **self.plan.params}
        if queues is not None:
            # One queue: equality, not ANY, so the planner walks x_jobs_claim_idx in claim order.
            waiting.update({"queue": queues[0]} if len(queues) == 1 else {"queues": queues})
        self.waiting = waiting
        #: One statement, no transaction of its own needed: the plain claim of a busy worker.
        self.single = not (self.plan.look_for_lapsed or self.plan.passed or request.flow or request.fair)
        self.wake_at: float | None = None
        self.more = False

    def run_single(self, cur: Any) -> Any:
        """Execute the one statement of a :attr:`single` claim on ``cur`` (its rows not yet
        fetched), in the caller's transaction when the connection prepares statements."""
        _cached_plan(cur)
        return cur.execute(_Q[self.plan.query], {**self.waiting, "limit": self.request.limit})

    def run(self, conn: Conn) -> tuple[list[ClaimedRow], list[ClaimedRow]]:
        """Every statement of the claim, inside the caller's transaction: (early rows, fresh rows)."""
        request, base, plan = self.request, self.base, self.plan
        cur = _claimed(conn)
        early: list[ClaimedRow] = []
        if request.flow:
            early, self.wake_at, self.more = claim_flow(conn, base, self.queues, request.limit, self.now)
        if plan.look_for_lapsed and len(early) < request.limit:
            early += cur.execute(_Q["claim_lapsed"], {**base, "queues": self.queues, "floor": plan.lapsed_floor,
                                                      "limit": request.limit - len(early)}).fetchall()
        if plan.passed and len(early) < request.limit:
            early += cur.execute(_Q["claim_passed"], {**base, "passed": plan.passed,
                                                      "limit": request.limit - len(early)},
                                 prepare=_PLAN_EACH_TIME).fetchall()
        left = request.limit - len(early)
        if request.fair:
            return early + self.driver._claim_fair(cur, base, self.queues, request, left), []
        if left <= 0:
            return early, []
        _cached_plan(cur)
        return early, cur.execute(_Q[plan.query], {**self.waiting, "limit": left}).fetchall()

    def failed(self) -> None:
        """The windows this claim would have covered are looked at again."""
        self.driver._cursors.failed(self.plan)

    def finish(self, early: list[ClaimedRow], fresh: list[ClaimedRow]) -> ClaimBatch:
        """Move the cursors past what was claimed; the batch in claim order."""
        cursors, plan = self.driver._cursors, self.plan
        if fresh:
            first = min(fresh, key=_claim_order)
            job, (_, head_priority, head_run_at, head_id) = first[0].job, first
            head = None if head_priority is None or head_run_at is None or head_id is None else (
                head_priority, head_run_at, head_id)
            cursors.claimed(plan, head,
                            (job.priority, job.run_at, job.id), [row[0].job.id for row in fresh], self.now)
        if early:
            cursors.taken(plan, [row[0].job.id for row in early])
        rows = sorted([*early, *fresh], key=_claim_order) if early else sorted(fresh, key=_claim_order)
        batch = ClaimBatch(row[0] for row in rows)
        batch.wake_at, batch.more = self.wake_at, self.more
        return batch


class PostgresDriver:
    """A :class:`~ultimat3.drivers.protocol.JobDriver` on PostgreSQL: a fleet of workers shares it.

    ``url``: ``postgres://``, ``postgresql://`` or ``postgresql+psycopg://``. ``min_size`` and
    ``max_size`` bound the connection pool (the LISTEN connection is extra, opened on the first
    :meth:`subscribe`). ``channel`` is the NOTIFY channel; drivers that should wake each other
    must share it. ``clock``: leave it out in production (the server's clock is measured and
    followed, see :class:`~ultimat3.core.clock.ReferenceClock`); tests pass a
    :class:`~ultimat3.core.ManualClock`. All methods are thread-safe.
    """

    name = "postgres"
    supports_listen_notify = True
    supports_transactional_enqueue = True

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        min_size: int = 1,
        max_size: int = 10,
        channel: str = DEFAULT_CHANNEL,
        direct_url: str | None = None,
    ) -> None:
        self.url = url
        self.channel = channel
        self._conninfo = conninfo_from_url(url)
        #: Where session-scoped work goes (LISTEN, each worker's liveness lock): ``direct_url``
        #: when the main URL goes through a transaction-mode pooler, else the main URL.
        self.direct_url = direct_url
        self.session_conninfo = conninfo_from_url(direct_url) if direct_url else self._conninfo
        #: True once sessions on ``session_conninfo`` proved to be pooled (see warn_pooled_session).
        self.pooled_sessions = False
        # One direct connection first: a wrong host or a stopped server fails here at once, with
        # the server's own words, instead of after the pool's retries time out.
        try:
            psycopg.connect(self._conninfo, connect_timeout=CONNECT_TIMEOUT).close()
        except psycopg.OperationalError as exc:
            first = first_line(exc, type(exc).__name__)
            raise DriverError(
                f"PostgreSQL is unreachable: {first}",
                "check X_DATABASE_URL (host, port, database, user) and that the server is running",
                code="X_DATABASE_UNREACHABLE",
            ) from exc
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            self._conninfo,
            min_size=min_size,
            max_size=max_size,
            # No named prepared statements until sessions are proven real (see _Database).
            kwargs={"autocommit": True, "prepare_threshold": None},
            configure=_session_utc,
            open=True,
            name=f"ultimat3-{channel}",
            timeout=10.0,
        )
        self._async_pools = AsyncPools(self._conninfo, max_size=max_size, name=f"ultimat3-{channel}")
        self._async_batcher = AsyncBatcher(self._async_pools, channel)
        self._reference: ReferenceClock | None = None
        if clock is None:
            # One clock for the fleet: the server's, measured here and followed between samples.
            try:
                clock = self._reference = ReferenceClock(self._server_time, on_measure=_warn_skew)
            except (psycopg.Error, PoolTimeout) as exc:
                self._pool.close()
                first = first_line(exc, type(exc).__name__)
                raise DriverError(
                    f"PostgreSQL is unreachable: could not read the server's clock: {first}",
                    "check X_DATABASE_URL and that the server is running",
                    code="X_DATABASE_UNREACHABLE",
                ) from exc
            except BaseException:
                self._pool.close()
                raise
            self._reference.start(name=f"ultimat3-clock-{channel}")
        #: Every timestamp this driver writes and every due-ness it decides comes from here.
        self.clock: Clock = clock
        self._db = _Database(self._pool, self.clock)
        if direct_url is None:
            # The pooler that broke a prepared statement sits in front of every session too.
            self._db.on_pooler = self.warn_pooled_session
        self._lock = threading.Lock()
        self._subscribers: list[WakeCallback] = []
        self._listener: Listener | None = None
        self._cursors = ClaimCursors()
        # Fair claims: per queue set, where the next claim's turn starts (see fair_start_after).
        self._fair_start: dict[tuple[str, ...] | None, str] = {}
        self._fair_lock = threading.Lock()
        self._closed = False
        self.introspect = PostgresIntrospection(self._db)
        self.steps = PostgresStepStore(self._db)
        self.backfills = PostgresBackfillLedger(self._db, self.channel)
        self.leases = PostgresLeaseStore(self._db)
        self.migrations = PostgresMigrationLedger(self._db)
        self.workers = PostgresWorkerRegistry(self)
        self._prover: threading.Thread | None = None
        if direct_url is None:
            self._prover = threading.Thread(target=self._prove_sessions, name=f"ultimat3-probe-{channel}",
                                            daemon=True)
            self._prover.start()
        self.queues = PostgresQueueControl(self._db, channel, on_change=lambda queue: self._cursors.rescan([queue]))
        self.audit = PostgresAuditLog(self._db)
        self.schedules = PostgresScheduleStore(self)

    def __repr__(self) -> str:
        return f"PostgresDriver(channel={self.channel!r})"

    def _server_time(self) -> float:
        """The server's ``clock_timestamp()`` as epoch seconds (one round trip)."""
        with self._pool.connection() as conn:
            row = _tuples(conn).execute(_Q["server_time"]).fetchone()
        assert row is not None
        return float(row[0])

    def warn_pooled_session(self) -> None:
        """Record (and say once) that session-scoped work runs through a transaction-mode pooler."""
        first = not self.pooled_sessions
        self.pooled_sessions = True
        if first:
            self.workers.unpin_all()
            _log.warning(
                "X_DB_SESSION_POOLED: the session connections of this driver go through a transaction-mode"
                " connection pooler, so worker liveness cannot be told from them: dead workers' jobs come back"
                " only at their visibility timeout (hint: set X_DATABASE_DIRECT_URL, or direct_url=, to a"
                " connection that bypasses the pooler, or use the pooler's session mode)",
                extra={"code": "X_DB_SESSION_POOLED"},
            )

    def oldest_snapshot(self) -> SnapshotHolder | None:
        """Who holds the database's oldest open snapshot (``None``: no transaction is open). A
        long-held one makes every hot statement of a queue walk what VACUUM may not remove yet."""
        row = self._db.run(lambda conn, _: _rows(conn).execute(_Q["oldest_snapshot"]).fetchone())
        if row is None:
            return None
        return SnapshotHolder(kind=row["kind"], age=float(row["age"] or 0.0), pid=row["pid"],
                              application_name=row["application_name"], state=row["state"],
                              backend_type=row["backend_type"], query=row["query"])

    def clock_offset(self) -> float | None:
        """This host's wall clock minus the server's, in seconds, as last measured; ``None`` when
        a clock was injected (then nothing is measured)."""
        return None if self._reference is None else self._reference.offset()

    # -- lifecycle ------------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply the library's migration files not yet in ``x_migrations``; ids applied now.

        Each file runs in its own transaction under ``pg_advisory_xact_lock``, re-reading the
        ledger once it holds the lock, so workers booting together apply each file exactly once.
        """
        applied: list[str] = []
        for migration in load_migrations("ultimat3.drivers.postgres"):
            migration_id, script = migration.id, migration.sql

            def op(conn: Conn, _: bool, migration_id: str = migration_id, script: str = script) -> bool:
                with conn.transaction():
                    cur = _tuples(conn)
                    cur.execute(_Q["migrate_lock"])
                    exists = cur.execute(_Q["migrations_table_exists"]).fetchone()
                    if exists and exists[0]:
                        done = cur.execute(_Q["migration_is_applied"], {"id": migration_id}).fetchone()
                        if done and done[0]:
                            return False
                    # No parameters: psycopg sends the file as one simple query, every statement of it.
                    cur.execute(script)
                    cur.execute(_Q["migration_mark"], {"id": migration_id, "now": to_datetime(self.clock.now())})
                    return True

            if self._db.run(op):
                applied.append(migration_id)
        return applied

    def close(self) -> None:
        """Stop the listener thread and close the pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            listener, self._listener = self._listener, None
        if self._reference is not None:
            self._reference.stop()
        self.workers.close()
        if listener is not None:
            listener.request_stop()
            # The listener waits on its connection; a NOTIFY on its private channel ends the wait now.
            with suppress(Exception), self._pool.connection(timeout=1.0) as conn:
                conn.execute(_Q["notify"], {"channel": listener.wake_channel, "queues": ["stop"]})
            listener.join(timeout=5.0)
        self._async_pools.close()
        if self._prover is not None:
            # Not waited for in full: unheard behind a pooler, the probe waits out its timeout,
            # and a short CLI command must not. It ends on its own (a daemon thread) soon after.
            self._prover.join(timeout=0.25)
        self._pool.close()

    # -- writes ---------------------------------------------------------------------------------

    def enqueue(self, request: EnqueueRequest, connection: Any = None) -> EnqueueResult:
        """Write one job, deduplicated per (name, idempotency key) among live states.

        ``connection``: a caller's psycopg or SQLAlchemy connection; the job is written in its
        transaction (not committed: it commits or rolls back with the caller's work).
        """
        staged = _Staged(request, self.clock.now())
        if connection is not None:
            return self._enqueue_one(_caller_connection(connection), staged, retrying=False, prepare=False)
        result = self._db.run(lambda conn, retrying: self._enqueue_one(conn, staged, retrying))
        self._announce([staged], [result])
        return result

    async def aenqueue_many(self, requests: Sequence[EnqueueRequest], connection: Any = None) -> list[EnqueueResult]:
        """:meth:`enqueue_many` for async callers, on the event loop: in the caller's async
        transaction (``connection``), else on this driver's async pool (one per event loop), where
        concurrent single-job calls share one statement and one commit."""
        if not requests:
            return []
        now = self.clock.now()
        staged = _Staged.many(requests, now)
        if connection is not None:
            return await enqueue_on_async(self, connection, staged)
        results = await self._async_batcher.submit(staged)
        self._announce(staged, results)
        return results

    async def aclose(self) -> None:
        """Close this event loop's async pool (call it before the loop ends; :meth:`close` does
        the rest)."""
        await self._async_pools.aclose()

    def _enqueue_one(self, conn: Conn, staged: _Staged, retrying: bool, prepare: bool | None = None) -> EnqueueResult:
        # prepare=False on a caller's connection: never a named prepared statement there, whatever
        # its settings (it may go through a transaction-mode pooler; planning one insert is cheap).
        cur = _tuples(conn)
        if retrying:
            row = cur.execute(_Q["jobs_by_ids"], {"ids": [staged.id]}, prepare=prepare).fetchone()
            if row is not None:
                return EnqueueResult(id=row[0], run_id=row[1], deduped=False)
        params = {**staged.params, "channel": self.channel}
        for _ in range(_RACE_RETRIES):
            row = cur.execute(_Q["enqueue"], params, prepare=prepare).fetchone()
            if row is None:
                continue  # the live row we collided with finished before we could read it: again
            job_id, run_id, deduped, _notified = row
            if deduped and staged.request.on_conflict == "error":
                raise staged.duplicate(job_id)
            return EnqueueResult(id=job_id, run_id=run_id, deduped=deduped)
        raise self._race_lost(staged.request)

    def enqueue_many(self, requests: Sequence[EnqueueRequest], connection: Any = None) -> list[EnqueueResult]:
        """Write several jobs all-or-nothing (one transaction), with ``enqueue``'s rules each."""
        if len(requests) <= 1:
            return [self.enqueue(request, connection) for request in requests]
        staged = _Staged.many(requests, self.clock.now())
        if connection is not None:
            conn = _caller_connection(connection)
            with _all_or_nothing(conn):
                return self._enqueue_batch(conn, staged, retrying=False, prepare=False)

        def op(conn: Conn, retrying: bool) -> list[EnqueueResult]:
            with conn.transaction():
                return self._enqueue_batch(conn, staged, retrying)

        results = self._db.run(op)
        self._announce(staged, results)
        return results

    def _enqueue_batch(self, conn: Conn, staged: list[_Staged], retrying: bool,
                       prepare: bool | None = None) -> list[EnqueueResult]:
        return drive(_tuples(conn), batch_steps(staged, self.channel, retrying=retrying), prepare=prepare)

    @staticmethod
    def _race_lost(request: EnqueueRequest) -> DriverError:
        return race_lost(request)

    def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        """Move up to ``request.limit`` runnable jobs to ``running`` under fresh claim tokens.

        Waiting jobs whose ``run_at`` has come, walked from this driver's cursor for the queue (see
        :mod:`ultimat3.drivers.postgres.cursors` and ``claim_*`` in ``queries.sql``), and, about
        once a second, lapsed ``running`` ones; in claim order, locked with ``FOR UPDATE SKIP
        LOCKED``, in one transaction.
        """
        check_weights(request.weights)  # refused before anything is claimed
        claim = self._claim_plan(request)
        if claim is None:
            return ClaimBatch()

        def op(conn: Conn, _: bool) -> tuple[list[ClaimedRow], list[ClaimedRow]]:
            if claim.single:
                if conn.prepare_threshold is None:  # nothing prepared: one statement, autocommit
                    return [], claim.run_single(_claimed(conn)).fetchall()
                # The plan choice (see _cached_plan) and the claim in one round trip and one
                # transaction: see _implicit_transaction.
                with _implicit_transaction(conn):
                    fresh = claim.run_single(_claimed(conn))
                return [], fresh.fetchall()
            with conn.transaction():
                return claim.run(conn)

        try:
            early, fresh = self._db.run(op)
        except BaseException:
            claim.failed()
            raise
        return claim.finish(early, fresh)

    def ack_and_claim(self, acks: Sequence[Ack], request: ClaimRequest) -> tuple[list[bool], ClaimBatch]:
        """:meth:`ack_many` then :meth:`claim` in one transaction; the plain claim (no flow
        control, no fair turns, nothing lapsed or passed to look at) is pipelined with the acks:
        the acks, the plan choice and the claim go out in one round trip, one implicit
        transaction (see :func:`_implicit_transaction`)."""
        check_weights(request.weights)
        rounds = _AckRounds(self, acks)
        claim = self._claim_plan(request)

        def op(conn: Conn, _: bool) -> tuple[list[bool], list[ClaimedRow], list[ClaimedRow]]:
            if claim is None or claim.single:
                with _implicit_transaction(conn):
                    acked = rounds.run(conn)
                    fresh = claim.run_single(_claimed(conn)) if claim is not None else None
                return rounds.settled(acked), [], ([] if fresh is None else fresh.fetchall())
            with conn.transaction():
                settled = rounds.settled(rounds.run(conn))
                early_rows, fresh_rows = claim.run(conn)
            return settled, early_rows, fresh_rows

        try:
            settled, early, fresh = self._db.run(op)
        except BaseException:
            if claim is not None:
                claim.failed()
            raise
        return settled, ClaimBatch() if claim is None else claim.finish(early, fresh)

    def _claim_plan(self, request: ClaimRequest) -> _ClaimPlan | None:
        """What a claim will run, from this driver's cursors; ``None`` when it can claim nothing."""
        if request.limit < 1:
            return None
        queues = None if request.queues is None else list(dict.fromkeys(request.queues))
        names = None if request.names is None else list(dict.fromkeys(request.names))
        if queues == [] or names == []:
            return None  # "none of these" matches nothing
        return _ClaimPlan(self, request, queues, names)

    def _claim_fair(self, cur: Any, base: dict[str, Any], queues: list[str] | None, request: ClaimRequest,
                    limit: int) -> list[ClaimedRow]:
        """Round-robin by tenant from this driver's cursor for ``queues``, one ``claim_fair`` statement
        per pass (see :func:`ultimat3.drivers.fair.fair_passes`)."""
        if limit <= 0:
            return []
        key = None if queues is None else tuple(queues)
        with self._fair_lock:
            start = self._fair_start.get(key, "")
        tenants, weights = weight_arrays(request.weights)

        def run_pass(begin: str, left: int) -> tuple[list[ClaimedRow], list[str | None]]:
            served: list[ClaimedRow] = cur.execute(_Q["claim_fair"], {
                **base, "queues": queues, "start": begin, "weight_tenants": tenants, "weights": weights,
                "limit": left}).fetchall()
            return served, [row[0].job.tenant_id for row in served]

        rows, after = fair_passes(run_pass, start, limit)
        if after is not None:
            with self._fair_lock:
                self._fair_start[key] = after
        return rows

    @fenced_key(lambda: False)
    def ack(self, job_id: str, claim_token: str, result: Any = None) -> bool:
        """Mark ``done`` with ``result`` if still running under ``claim_token``."""
        encoded = Jsonb(result_text(result, what=f"result of job {job_id}"), dumps=_as_is)
        params = {"id": job_id, "token": claim_token, "result": encoded, "now": to_datetime(self.clock.now()),
                  "channel": self.channel}
        return self._db.run(lambda conn, _: len(conn.execute(_Q["ack"], params, prepare=_PLAN_EACH_TIME)
                                                .fetchall())) == 1

    def ack_many(self, acks: Sequence[Ack]) -> list[bool]:
        """Settle several jobs as ``done`` in one statement (one commit), each fenced on its token;
        a batch holding a job id twice runs as one statement per repetition, in one transaction."""
        rounds = _AckRounds(self, acks)
        if not rounds.writes:
            return [False] * len(acks)

        def op(conn: Conn, _: bool) -> list[bool]:
            if rounds.single:
                return rounds.settled(rounds.run(conn))
            with conn.transaction():
                return rounds.settled(rounds.run(conn))

        return self._db.run(op)

    def _ack_params(self, acks: Sequence[Ack]) -> tuple[dict[str, Any] | None, list[bool]]:
        """The ``ack_many`` parameters (``None``: no ack can settle) and which acks are storable;
        a result that cannot be stored is refused here, before anything is written."""
        results = [result_text(a.result, what=f"result of job {a.job_id}") for a in acks]
        usable = [is_storable_text(a.job_id) and is_storable_text(a.claim_token) for a in acks]
        if not any(usable):
            return None, usable
        # One object, "id token" -> the result's JSON text (already serialised: spliced, not dumped
        # again). Duplicate keys (the same ack twice) keep the last, as the same row is settled once.
        # The ids go as one JSON array too: psycopg dumps a list parameter element by element in
        # Python (~2.5 us per ack at a batch of 100), json.dumps does it in C.
        kept = [(a, r) for a, r, ok in zip(acks, results, usable, strict=True) if ok]
        keys = [f"{a.job_id} {a.claim_token}" for a, _ in kept]
        if all(r == "null" for _, r in kept):  # the worker's common case: handlers returning None
            entries = json.dumps(dict.fromkeys(keys))
        else:
            entries = "{" + ",".join(f"{json.dumps(k)}:{r}" for k, (_, r) in zip(keys, kept, strict=True)) + "}"
        return {
            "ids": json.dumps([a.job_id for a, _ in kept]),
            "acks": Jsonb(entries, dumps=_as_is),
            "now": to_datetime(self.clock.now()),
            "channel": self.channel,
        }, usable

    @fenced_key(lambda: False)
    def nack(self, job_id: str, claim_token: str, request: NackRequest) -> bool:
        """Put the attempt back (retry or suspension) or dead-letter it, if still fenced-in."""
        now = self.clock.now()
        params = {
            "id": job_id,
            "token": claim_token,
            "dead": request.dead_letter,
            "counts": request.counts_as_attempt,
            "release": request.release,
            "run_at": to_datetime(now + request.delay),
            "error": None if request.error is None else storable(request.error),
            "now": to_datetime(now),
            "channel": self.channel,
        }
        row = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["nack"], params,
                                                                 prepare=_PLAN_EACH_TIME).fetchone())
        if row is None:
            return False
        self._wake([row[0]])
        return True

    @fenced_key(lambda: False)
    def heartbeat(self, job_id: str, claim_token: str, visibility_timeout: float) -> bool:
        """Extend the claim to ``now + visibility_timeout``; ``False`` when the claim is gone."""
        now = self.clock.now()
        params = {
            "id": job_id,
            "token": claim_token,
            "visible_at": to_datetime(now + visibility_timeout),
            "now": to_datetime(now),
        }
        beat = _Q["heartbeat"]
        return self._db.run(lambda conn, _: conn.execute(beat, params, prepare=_PLAN_EACH_TIME).rowcount) == 1

    @unknown_key(lambda: None)
    def cancel(self, job_id: str, reason: str | None = None) -> JobRecord | None:
        """Cancel an unfinished job; finished jobs come back unchanged, unknown ids as ``None``."""
        text = None if reason is None else storable(reason)
        params = {"id": job_id, "reason": text, "now": to_datetime(self.clock.now())}

        def op(conn: Conn, _: bool) -> Row | None:
            cur = _rows(conn)
            with conn.transaction():  # the pass's ledger row closes with the job, or neither does
                row = cur.execute(_Q["cancel"], params).fetchone()
                if row is not None:
                    cur.execute(_Q["cancel_ledger"], {"run_id": row["run_id"], "reason": row["last_error"],
                                                       "now": params["now"]})
            return row if row is not None else cur.execute(_Q["job_get"], params).fetchone()

        row = self._db.run(op)
        return None if row is None else _job(row)

    @unknown_key(lambda: None)
    def retry(self, job_id: str) -> JobRecord | None:
        """Make a ``dead`` or ``cancelled`` job ``ready`` now with ``attempt`` 0, same run.

        Raises :class:`~ultimat3.drivers.errors.JobDuplicateError` when another live job holds the
        job's (name, idempotency key) meanwhile.
        """
        params = {"id": job_id, "now": to_datetime(self.clock.now()), "channel": self.channel}

        def op(conn: Conn, _: bool) -> tuple[Row | None, bool]:
            cur = _rows(conn)
            for _attempt in range(_RACE_RETRIES):
                try:
                    row = cur.execute(_Q["retry"], params).fetchone()
                except pg_errors.UniqueViolation:
                    # Autocommit: the failed statement left nothing behind, the connection is usable.
                    current = cur.execute(_Q["job_get"], params).fetchone()
                    if current is None or current["idempotency_key"] is None:
                        raise
                    holder = cur.execute(
                        _Q["live_holder"],
                        {"id": job_id, "name": current["name"], "idempotency_key": current["idempotency_key"]},
                    ).fetchone()
                    if holder is not None:
                        raise JobDuplicateError(current["name"], current["idempotency_key"], holder["id"]) from None
                    continue  # the holder finished in between: try again
                if row is not None:
                    return row, True
                return cur.execute(_Q["job_get"], params).fetchone(), False
            raise DriverError(
                f"retry of job {job_id} kept colliding with live jobs that finished before they could be read",
                "retry the operation",
                code="X_DRIVER_RACE",
            )

        row, changed = self._db.run(op)
        if row is None:
            return None
        record = _job(row)
        if changed:
            self._wake([record.queue])
        return record

    def bulk(self, request: BulkRequest) -> BulkBatch:
        """One batch of an operator's bulk action, one statement (see the protocol)."""
        return postgres_bulk(self._db, request, self.clock.now(), self._wake)

    def prune(self, older_than: float) -> int:
        """Delete finished jobs finished at or before ``now - older_than``, and their steps.

        In chunks of :data:`PRUNE_CHUNK` rows, each its own statement, oldest first.
        """
        params = {"cutoff": to_datetime(self.clock.now() - older_than), "chunk": PRUNE_CHUNK}
        self._db.run(lambda conn, _: conn.execute(_Q["flow_forget_full"], {"now": to_datetime(self.clock.now())}))
        total = 0
        while True:
            row = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["prune_chunk"], params).fetchone())
            deleted = 0 if row is None else int(row[0])
            total += deleted
            if deleted < PRUNE_CHUNK:
                return total

    # -- wake-ups -------------------------------------------------------------------------------

    def subscribe(self, callback: WakeCallback) -> Callable[[], None]:
        """Call ``callback(queue)`` when a job may have become runnable, from any thread.

        Sources: a NOTIFY from any process's enqueue (through a LISTEN thread started on the first
        subscription, which this call waits for, up to a few seconds, so an enqueue made after it
        returns is seen); this driver's own committed enqueues, nacks and retries, in-process; and
        ``"*"`` after the LISTEN connection was re-established (anything may have been missed).
        """
        with self._lock:
            if self._closed:
                raise DriverError(
                    "subscribe() on a closed PostgresDriver",
                    "subscribe before close(), or create a new driver",
                    code="X_DRIVER_CLOSED",
                )
            self._subscribers.append(callback)
            listener = self._listener
            if listener is None:
                listener = self._listener = Listener(self.session_conninfo, self.channel, self._dispatch,
                                                     probe=self._notify_probe, on_probe=self._probed)
                listener.start()
        if not listener.wait_listening(_LISTEN_READY_TIMEOUT):
            _log.warning("LISTEN %s not in effect yet; wake-ups from other processes start once it is", self.channel)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def _probed(self, heard: bool) -> None:
        """The listener's verdict on its sessions: real, or (or so it seems) behind a pooler.

        A probe that did not arrive may also be a slow server: liveness is not judged from it
        (each beat checks its own session, which is conclusive), only preparation turns off."""
        if not heard:
            self._db.prepared = False
        elif self.direct_url is None:
            # The listener runs on the main URL and its session held: that URL gives real sessions
            # (a direct connection or a session-mode pooler), so preparing statements is safe.
            self._db.prepared = True

    def _prove_sessions(self) -> None:
        """Once, in the background: does a NOTIFY from a pooled session reach a session of our own
        on this URL? Then sessions are real and statements may be prepared, also in a process
        that only enqueues (and never starts a listener). Unheard, nothing changes."""
        channel = f"x_probe_{uuid.uuid4().hex[:16]}"
        try:
            with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                                 application_name="ultimat3 session probe") as conn:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                self._notify_probe(channel, "probe")
                heard = any(True for _ in conn.notifies(timeout=_PROBE_TIMEOUT, stop_after=1))
        except Exception as exc:  # a probe that cannot run proves nothing
            _log.debug("session probe failed: %s", first_line(exc, type(exc).__name__))
            return
        if heard and self.direct_url is None and not self._closed:
            self._db.prepared = True

    def _notify_probe(self, channel: str, payload: str) -> None:
        """A NOTIFY from a pooled session (another session than the listener's)."""
        self._db.run(lambda conn, _: conn.execute(_Q["notify"], {"channel": channel, "queues": [payload]}))

    def wakeups(self) -> str:
        """How this driver's subscribers learn of new jobs: ``notify``, or ``polling (why)``."""
        listener = self._listener
        if listener is None:
            return "polling (nothing subscribed)"
        if listener.hears is None:
            return "notify (not proven yet)" if listener.listening else "polling (LISTEN not in effect yet)"
        if listener.hears:
            return "notify"
        return "polling (NOTIFY does not arrive: a transaction-mode pooler? set X_DATABASE_DIRECT_URL)"

    @property
    def listener(self) -> Listener | None:
        """The LISTEN thread, once something subscribed (for diagnostics and tests)."""
        return self._listener

    def _announce(self, staged: Sequence[_Staged], results: Sequence[EnqueueResult]) -> None:
        """Committed jobs of this process: claim cursors past them move back (the NOTIFY does so in
        every process that listens; this covers a driver that does not), then wake-ups."""
        fresh = [item for item, result in zip(staged, results, strict=True) if not result.deduped]
        self._cursors.ready_many((item.request.queue, item.request.priority, to_datetime(item.run_at))
                                 for item in fresh)
        self._wake([item.request.queue for item in fresh])

    def _wake(self, queues: Sequence[str]) -> None:
        for queue in dict.fromkeys(queues):
            self._dispatch(queue)

    def _dispatch(self, payload: str) -> None:
        # A structured notice moves claim cursors back first; subscribers hear of its queue.
        queue = self._cursors.notice(payload)
        with self._lock:
            callbacks = list(self._subscribers)
        for callback in callbacks:
            try:
                callback(queue)
            except Exception:
                # A broken subscriber must not fail the write that already happened.
                _log.exception("wake-up callback %r failed for queue %r", callback, queue)
