"""The embedded SQLite driver: one file in WAL mode, shared by every thread and process on a host.

Each thread gets its own connection (autocommit; the driver issues ``BEGIN IMMEDIATE`` itself), so
every read-modify-write takes SQLite's single write lock before it reads: two processes claiming
from one file can never both take a job. The SQL lives in ``queries.sql`` and ``migrations/``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ultimat3.core.clock import Clock, system_clock
from ultimat3.core.errors import XError
from ultimat3.drivers.errors import DriverError, JobDuplicateError
from ultimat3.drivers.fair import check_weights, fair_claim
from ultimat3.drivers.flow import Bucket, Candidate, admit, earliest, scan_size
from ultimat3.drivers.protocol import (
    Ack,
    AuditLog,
    BackfillLedger,
    BulkBatch,
    BulkRequest,
    ClaimBatch,
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    JobIntrospection,
    JobRecord,
    LeaseStore,
    MigrationLedger,
    NackRequest,
    QueueControl,
    ScheduleStore,
    SnapshotHolder,
    StepStore,
    WakeCallback,
    WorkerRegistry,
)
from ultimat3.drivers.sql import Migration, load_migrations
from ultimat3.drivers.sqlite.aio import AsyncWriter, enqueue_on_async
from ultimat3.drivers.sqlite.files import DEFAULT_SQLITE_FILE_MODE, is_memory_path, sqlite_file_mode, sqlite_path
from ultimat3.drivers.sqlite.operations import SqliteAuditLog, SqliteQueueControl, sqlite_bulk
from ultimat3.drivers.sqlite.rows import (
    QUERIES,
    dict_rows,
    is_busy,
    job_record_of,
    result_text,
)
from ultimat3.drivers.sqlite.schedules import SqliteScheduleStore
from ultimat3.drivers.sqlite.statements import split_statements
from ultimat3.drivers.sqlite.stores import (
    SqliteBackfillLedger,
    SqliteIntrospection,
    SqliteLeaseStore,
    SqliteMigrationLedger,
    SqliteStepStore,
)
from ultimat3.drivers.sqlite.workers import SqliteWorkerRegistry
from ultimat3.drivers.staging import StagedJob, stage_many
from ultimat3.drivers.values import (
    fenced_key,
    is_storable_text,
    storable,
    unknown_key,
)

__all__ = ["DEFAULT_SQLITE_FILE_MODE", "QUERIES", "SqliteDriver", "sqlite_file_mode", "sqlite_path"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
#: A claimed x_jobs row, read as a dict (rows.dict_rows): the claim reads every field of each.
JobRow = dict[str, Any]
_BUSY_BACKOFF_START = 0.005
_BUSY_BACKOFF_MAX = 0.5
#: Bytes the WAL file is truncated back to after a checkpoint resets it (``journal_size_limit``).
WAL_SIZE_LIMIT = 16 * 2**20
#: The BEGIN that Python's sqlite3 would issue for a connection's ``isolation_level``.
_BEGIN_FOR_ISOLATION = {
    "": "BEGIN",
    "DEFERRED": "BEGIN DEFERRED",
    "IMMEDIATE": "BEGIN IMMEDIATE",
    "EXCLUSIVE": "BEGIN EXCLUSIVE",
}


def _opens_transactions_implicitly(conn: sqlite3.Connection) -> bool:
    """Whether ``conn`` is in Python's legacy mode that BEGINs before the first write.

    PEP 249 mode (Python 3.12 ``autocommit=False``) keeps a transaction open by itself, and
    ``autocommit=True`` or ``isolation_level=None`` means the caller wants none.
    """
    autocommit = getattr(conn, "autocommit", None)
    if autocommit is not None and autocommit != getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", None):
        return False
    return conn.isolation_level is not None


def _insert_jobs(conn: sqlite3.Connection, jobs: Sequence[StagedJob], now: float) -> list[EnqueueResult]:
    """Insert ``jobs`` on ``conn`` inside the caller's transaction, deduplicating keyed ones.

    Uses its own tuple-row cursor: ``conn`` may be the app's connection with any row factory.
    """
    cursor = conn.cursor()
    cursor.row_factory = None
    results: list[EnqueueResult | None] = [None] * len(jobs)
    # Keyless jobs cannot collide: one statement for all of them (per row only when they differ in
    # a REAL column) instead of a round trip each.
    keyless = [(index, job) for index, job in enumerate(jobs) if job.request.idempotency_key is None]
    if keyless:
        shared = _shared_row_values(keyless, now)
        if shared is None:
            cursor.executemany(QUERIES["job_insert"], [job.columns(now) for _, job in keyless])
        else:
            rows = json.dumps([_json_row(job) for _, job in keyless])
            cursor.execute(QUERIES["job_insert_many"], {**shared, "rows": rows})
        for index, job in keyless:
            results[index] = EnqueueResult(job.id, job.run_id, False)
    for index, job in enumerate(jobs):
        key = job.request.idempotency_key
        if key is None:
            continue
        cursor.execute(QUERIES["job_insert"], job.columns(now))
        if cursor.rowcount == 1:
            results[index] = EnqueueResult(job.id, job.run_id, False)
            continue
        live = cursor.execute(QUERIES["job_live_by_key"], {"name": job.request.name, "idempotency_key": key}).fetchone()
        if live is None:  # pragma: no cover - only a uuid4 primary-key collision gets here
            raise DriverError(f"job {job.id} could not be written", "enqueue it again", code="X_DRIVER")
        if job.request.on_conflict == "error":
            raise JobDuplicateError(job.request.name, key, live[0])
        results[index] = EnqueueResult(live[0], live[1], True)
    return [result for result in results if result is not None]


def _shared_row_values(keyless: list[tuple[int, StagedJob]], now: float) -> dict[str, Any] | None:
    """What ``job_insert_many`` binds once for the batch (first run time, state, rate), or ``None``
    when the batch is a single job or its jobs differ in one of those (then ``job_insert`` runs per
    row): its REAL columns stay bound parameters, never decimal text parsed back."""
    if len(keyless) < 2:
        return None
    first = keyless[0][1]
    run_at, rate = first.run_at(now), first.request.rate_per_second
    if any(job.run_at(now) != run_at or job.request.rate_per_second != rate for _, job in keyless):
        return None
    return {"state": first.state(now), "run_at": run_at, "now": now, "rate_per_second": rate}


def _json_row(job: StagedJob) -> list[Any]:
    """One row of ``job_insert_many``'s JSON array, in its column order."""
    r = job.request
    return [job.id, job.run_id, r.name, r.queue, job.payload, r.priority, r.max_attempts, r.tenant_id,
            r.traceparent, r.enqueued_by, r.flow_key, r.flow_max, r.rate_key, r.rate_burst]


def _claims_any(request: ClaimRequest) -> bool:
    """Whether a claim can take anything: a positive limit, and not "none of these" queues or names."""
    return request.limit > 0 and request.queues != () and request.names != ()


class SqliteDriver:
    """:class:`~ultimat3.drivers.protocol.JobDriver` over one SQLite file (WAL), for one host.

    Several worker processes may share ``path``; each call that reads then writes runs inside
    ``BEGIN IMMEDIATE``. ``busy_timeout`` (seconds) is how long a call may wait for the write lock
    before it fails with ``X_DRIVER_BUSY``.
    """

    name = "sqlite"
    supports_listen_notify = False
    supports_transactional_enqueue = True

    def __init__(self, path: str, clock: Clock | None = None, *, busy_timeout: float = 30.0,
                 file_mode: int | None = None) -> None:
        if is_memory_path(path):
            raise XError(
                "the SQLite driver needs a file, not an in-memory database",
                "workers and the app share jobs through a file: pass a path such as 'x.db'",
                code="X_DATABASE_URL",
            )
        self.path = path
        self.url = f"sqlite:///{path}"
        # Resolved once: a later chdir must not point a new thread's connection at another file.
        self._file = os.path.realpath(path)
        self._wal_held_since: float | None = None
        self._wal_last: tuple[int, int] | None = None
        #: Every timestamp this driver writes is read from this clock.
        self.clock: Clock = clock if clock is not None else system_clock
        self._busy_timeout = busy_timeout
        self._file_mode = file_mode if file_mode is not None else sqlite_file_mode()
        self._local = threading.local()
        self._lock = threading.Lock()
        # Fair claims: per queue set, where the next claim's turn starts (see ultimat3.drivers.fair).
        self._fair_start: dict[tuple[str, ...] | None, str] = {}
        self._fair_lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._orphans: list[sqlite3.Connection] = []
        self._generation = 0
        self._pid = os.getpid()
        self._callbacks: dict[int, WakeCallback] = {}
        self._next_callback = 0
        # Annotated with the protocol types: the protocol's attributes are settable, so mypy
        # compares them invariantly.
        self.introspect: JobIntrospection = SqliteIntrospection(self)
        self.steps: StepStore = SqliteStepStore(self)
        self.backfills: BackfillLedger = SqliteBackfillLedger(self)
        self.leases: LeaseStore = SqliteLeaseStore(self)
        self.migrations: MigrationLedger = SqliteMigrationLedger(self)
        self.workers: WorkerRegistry = SqliteWorkerRegistry(self)
        self.queues: QueueControl = SqliteQueueControl(self)
        self.audit: AuditLog = SqliteAuditLog(self)
        self.schedules: ScheduleStore = SqliteScheduleStore(self)
        self._async_writer = AsyncWriter(self)

    def __repr__(self) -> str:
        return f"SqliteDriver({self.path!r})"

    # -- connections and transactions ------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        local = self._local
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        pid = os.getpid()
        if conn is not None and local.generation == self._generation and local.pid == pid:
            return conn
        if pid != self._pid:
            # A forked child must not use (or close) the parent's connections: SQLite forbids
            # carrying a connection across fork(). Keep them referenced so they are never closed.
            with self._lock:
                self._orphans = self._connections
                self._connections = []
                self._generation += 1
                self._pid = pid
        conn = self._open()
        local.conn = conn
        local.generation = self._generation
        local.pid = pid
        return conn

    def _create_private(self) -> None:
        # Queued payloads are app data: the store is created readable by its owner only (SQLite
        # gives the -wal and -shm files the main file's mode), whatever the process umask says.
        try:
            fd = os.open(self._file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, self._file_mode)
        except FileExistsError:
            return
        except OSError:
            return  # sqlite3.connect reports the real problem (missing directory, permissions)
        try:
            os.fchmod(fd, self._file_mode)  # os.open's mode is filtered by the umask
        finally:
            os.close(fd)

    def _open(self) -> sqlite3.Connection:
        self._create_private()
        try:
            conn = sqlite3.connect(
                self._file,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,  # only close() touches it from another thread
            )
        except sqlite3.Error as exc:
            raise DriverError(
                f"cannot open SQLite database {self.path!r}: {exc}",
                "check that the directory exists and is writable by this process",
                code="X_DRIVER_OPEN",
            ) from exc
        conn.row_factory = sqlite3.Row
        try:
            # WAL lets readers run beside the one writer; NORMAL skips the fsync per commit (a
            # power cut may lose the last commits, never corrupt the file).
            self._retrying(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchall())
            conn.execute("PRAGMA synchronous=NORMAL")
            # While a reader keeps an old snapshot no checkpoint can reset the WAL, and it grows with
            # every write; once the reader is gone the next checkpoint resets it and this truncates
            # the file back, instead of leaving it at its high-water mark for good.
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        except BaseException:
            conn.close()
            raise
        with self._lock:
            self._connections.append(conn)
        return conn

    def _retrying(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn``, retrying with jittered backoff while SQLite reports the file busy.

        SQLite's busy handler already waits up to ``busy_timeout`` for a lock; some BUSY results
        skip it (a stale WAL snapshot, recovery), so those are retried here within the same budget.
        The budget is real time (``time.monotonic``), not the driver's clock: it bounds a real wait.
        """
        deadline = time.monotonic() + self._busy_timeout
        delay = _BUSY_BACKOFF_START
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    coded = self._coded(exc)
                    if coded is exc:
                        raise
                    raise coded from exc
                if time.monotonic() + delay >= deadline:
                    raise DriverError(
                        f"SQLite database {self.path!r} stayed locked for {self._busy_timeout:g}s: {exc}",
                        "a long transaction holds the write lock; keep app transactions that enqueue "
                        "short, or raise busy_timeout",
                        code="X_DRIVER_BUSY",
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, _BUSY_BACKOFF_MAX)

    def _coded(self, exc: sqlite3.OperationalError) -> Exception:
        """A coded error for what an operator can fix (permissions, a missing directory); other
        operational errors are returned as they are."""
        text = str(exc).lower()
        if "readonly" in text or "read-only" in text:
            return DriverError(
                f"the SQLite job store {self.path!r} is read-only for this process: {exc}",
                "make the file, its -wal/-shm files and its directory writable by this user, or point "
                "X_DATABASE_URL at a writable file",
                code="X_DATABASE_READONLY",
            )
        if "unable to open" in text or "disk i/o error" in text:
            return DriverError(
                f"the SQLite job store {self.path!r} cannot be opened or written: {exc}",
                "check that its directory exists and is writable, and that the disk is not full",
                code="X_DRIVER_OPEN",
            )
        return exc

    def _write(self, fn: Callable[[sqlite3.Connection, float], _T]) -> _T:
        """Run ``fn(conn, now)`` in one ``BEGIN IMMEDIATE`` transaction; committed if it returns.

        ``now`` is read after the write lock is held, so timestamps follow commit order.
        """

        def attempt() -> _T:
            conn = self._connection()
            if conn.in_transaction:  # left open by an interrupted call on this thread
                conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn, self.clock.now())
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

        return self._retrying(attempt)

    def _execute(self, query: str, params: dict[str, Any] | None = None) -> tuple[list[sqlite3.Row], int]:
        """One statement in autocommit (atomic on its own): its rows and its rowcount."""

        def attempt() -> tuple[list[sqlite3.Row], int]:
            cursor = self._connection().execute(QUERIES[query], params or {})
            rows = cursor.fetchall()
            return rows, cursor.rowcount

        return self._retrying(attempt)

    def _rows(self, query: str, params: dict[str, Any] | None = None) -> list[sqlite3.Row]:
        return self._execute(query, params)[0]

    def oldest_snapshot(self) -> SnapshotHolder | None:
        """A reader holding the WAL, SQLite's pinned horizon: while a read transaction keeps an old
        snapshot, no checkpoint can copy the frames written since back into the file, and the WAL
        grows with every write. Runs a PASSIVE checkpoint (it waits for nobody) and reports, as a
        ``wal-reader`` holder, how long frames have stayed behind; ``None`` when all were copied.
        SQLite does not say which connection reads, so the holder names the file instead."""
        row = self._connection().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        busy, frames, copied = (int(row[0]), int(row[1]), int(row[2])) if row is not None else (0, 0, 0)
        now = time.monotonic()
        last, self._wal_last = self._wal_last, (frames, copied)
        if busy == 0 and (frames <= 0 or copied >= frames):
            self._wal_held_since = None
            return None
        # A busy file always has some reader in the middle of a statement: frames left behind once
        # mean nothing. Held means the checkpoint made no progress since the last look (a pinned
        # reader stops it at the frame its snapshot started at while writers append).
        progressed = last is None or copied > last[1] or frames < last[0]
        if self._wal_held_since is None or progressed:
            self._wal_held_since = now
        try:
            size = os.path.getsize(self._file + "-wal")
        except OSError:
            size = 0
        return SnapshotHolder(kind="wal-reader", age=now - self._wal_held_since, application_name=self._file,
                              state=f"{max(0, frames - copied):,} of {frames:,} WAL frames ({size / 2**20:,.1f} MiB)"
                                    " not checkpointed")

    def _now(self) -> float:
        return self.clock.now()

    # -- wake-ups --------------------------------------------------------------------------------

    def subscribe(self, callback: WakeCallback) -> Callable[[], None]:
        """Call ``callback(queue)`` after this instance commits a job that may be runnable.

        Other processes' enqueues are not seen here (``supports_listen_notify`` is false): workers
        poll as well.
        """
        with self._lock:
            handle = self._next_callback
            self._next_callback += 1
            self._callbacks[handle] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks.pop(handle, None)

        return unsubscribe

    def _notify(self, queues: Iterable[str]) -> None:
        with self._lock:
            callbacks = list(self._callbacks.values())
        if not callbacks:
            return
        for queue in dict.fromkeys(queues):
            for callback in callbacks:
                try:
                    callback(queue)
                except Exception:  # a broken listener must not fail the enqueue that woke it
                    _log.exception("wake-up callback %r failed", callback)

    # -- schema ----------------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply the library migrations not yet in ``x_migrations``, each in one transaction."""
        applied_now: list[str] = []
        done = {record.id for record in self.migrations.applied()}
        for migration in _MIGRATIONS:
            if migration.id in done:
                continue
            if self._write(functools.partial(_apply_migration, migration=migration)):
                applied_now.append(migration.id)
        return applied_now

    # -- writes ----------------------------------------------------------------------------------

    def enqueue(self, request: EnqueueRequest, connection: Any = None) -> EnqueueResult:
        """Write one job, deduplicated per (name, idempotency key) among live states.

        With ``connection`` (a ``sqlite3.Connection`` to this file or a SQLAlchemy ``Connection``
        over one) the row is written inside that connection's transaction and is never committed
        here: the caller's commit or rollback decides.
        """
        return self._enqueue([request], connection, atomic=False)[0]

    def enqueue_many(self, requests: Sequence[EnqueueRequest], connection: Any = None) -> list[EnqueueResult]:
        """Write several jobs all-or-nothing, with the same per-request rules as :meth:`enqueue`."""
        if not requests:
            return []
        return self._enqueue(requests, connection, atomic=True)

    async def aenqueue_many(self, requests: Sequence[EnqueueRequest], connection: Any = None) -> list[EnqueueResult]:
        """:meth:`enqueue_many` for async callers: in the caller's ``sqlite+aiosqlite`` transaction
        (``connection``), else through this driver's one writer thread, which commits every call
        pending at that moment together (the event loop never waits on the file)."""
        if not requests:
            return []
        jobs = stage_many(requests)
        if connection is not None:
            return await enqueue_on_async(self, connection, jobs)
        return await self._async_writer.submit(jobs)

    async def aclose(self) -> None:
        """Nothing is bound to an event loop here; :meth:`close` releases everything."""

    def _enqueue(self, requests: Sequence[EnqueueRequest], connection: Any, *, atomic: bool) -> list[EnqueueResult]:
        jobs = stage_many(requests)
        if connection is None:
            results = self._write(lambda conn, now: _insert_jobs(conn, jobs, now))
        else:
            results = self._enqueue_in(connection, jobs, atomic=atomic)
        # The caller's transaction may not be committed yet: an early wake-up costs a worker one
        # empty claim, a missing one a whole poll interval.
        self._notify(job.request.queue for job, result in zip(jobs, results, strict=True) if not result.deduped)
        return results

    def _enqueue_in(self, connection: Any, jobs: Sequence[StagedJob], *, atomic: bool) -> list[EnqueueResult]:
        """Insert on the caller's connection, inside its transaction, without committing."""
        try:
            conn = self._joined(connection)
            if not atomic:
                return _insert_jobs(conn, jobs, self._now())
            # A savepoint makes the batch all-or-nothing without ending the caller's transaction.
            conn.execute("SAVEPOINT x_enqueue_many")
            try:
                results = _insert_jobs(conn, jobs, self._now())
            except BaseException:
                conn.execute("ROLLBACK TO SAVEPOINT x_enqueue_many")
                conn.execute("RELEASE SAVEPOINT x_enqueue_many")
                raise
            conn.execute("RELEASE SAVEPOINT x_enqueue_many")
            return results
        except sqlite3.OperationalError as exc:
            # The caller's transaction is not ours to retry.
            if not is_busy(exc):
                raise
            raise DriverError(
                f"enqueue inside the caller's transaction could not take the write lock: {exc}",
                "open the transaction with BEGIN IMMEDIATE (isolation_level='IMMEDIATE'), so it holds "
                "the lock before it reads, and keep it short",
                code="X_DRIVER_BUSY",
            ) from exc

    def _joined(self, connection: Any) -> sqlite3.Connection:
        """The raw connection behind the caller's, its transaction open, so what we write commits
        or rolls back with theirs (an enqueue, a step record)."""
        conn = self._caller_connection(connection)
        if not conn.in_transaction and _opens_transactions_implicitly(conn):
            # No transaction open yet: open it as the caller's own first INSERT would have, so the
            # caller's commit() or rollback() decides.
            conn.execute(_BEGIN_FOR_ISOLATION.get((conn.isolation_level or "").upper(), "BEGIN"))
        return conn

    def _caller_connection(self, connection: Any) -> sqlite3.Connection:
        """The raw ``sqlite3.Connection`` behind the caller's connection, checked to be our file."""
        raw: object = connection
        if type(connection).__module__.startswith("sqlalchemy."):
            from sqlalchemy.engine import Connection as SAConnection

            if isinstance(connection, SAConnection):
                if not connection.in_transaction():
                    # Without a transaction at SQLAlchemy's level the caller's commit() would be a
                    # no-op and the pool's reset would silently roll the job back.
                    connection.begin()
                raw = connection.connection.driver_connection
        if not isinstance(raw, sqlite3.Connection):
            raise DriverError(
                f"the SQLite driver cannot enqueue through a {type(connection).__module__}."
                f"{type(connection).__qualname__}",
                "pass a sqlite3.Connection or a SQLAlchemy Connection open on the same database file "
                "(for a Session, pass session.connection(); an async one goes to "
                "`await job.aenqueue(..., connection=...)`)",
                code="X_DRIVER_CONNECTION",
            )
        row = raw.execute(QUERIES["database_file"]).fetchone()
        file = row[0] if row is not None else ""
        if not file or os.path.realpath(file) != self._file:
            raise DriverError(
                f"the connection is open on {file or 'an in-memory database'!r}, not on {self._file!r}",
                "open the connection on the driver's file so the job commits with your transaction",
                code="X_DRIVER_CONNECTION",
            )
        return raw

    def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        """Move up to ``request.limit`` runnable jobs to ``running``, in claim order."""
        check_weights(request.weights)  # refused before anything is claimed
        if not _claims_any(request):
            return ClaimBatch()
        batch = ClaimBatch()
        return self._claimed(self._write(lambda conn, now: self._claim_in(conn, now, request, batch)), batch)

    def ack_and_claim(self, acks: Sequence[Ack], request: ClaimRequest) -> tuple[list[bool], ClaimBatch]:
        """:meth:`ack_many` then :meth:`claim` in one ``BEGIN IMMEDIATE`` transaction: one commit."""
        check_weights(request.weights)
        encoded = [result_text(item.job_id, item.result) for item in acks]
        claims = _claims_any(request)
        batch = ClaimBatch()

        def run(conn: sqlite3.Connection, now: float) -> tuple[list[bool], list[JobRow]]:
            settled = self._ack_in(conn, now, acks, encoded)
            return settled, self._claim_in(conn, now, request, batch) if claims else []

        settled, rows = self._write(run)
        return settled, self._claimed(rows, batch)

    @staticmethod
    def _claimed(rows: list[JobRow], batch: ClaimBatch) -> ClaimBatch:
        # RETURNING yields rows in no promised order.
        rows.sort(key=lambda row: (-row["priority"], row["run_at"], row["id"]))
        batch.extend(ClaimedJob(job_record_of(row), row["claim_token"]) for row in rows)
        return batch

    def _claim_in(self, conn: sqlite3.Connection, now: float, request: ClaimRequest,
                  batch: ClaimBatch) -> list[JobRow]:
        """The claim's statements under the write lock the caller holds; ``batch`` gets its
        ``wake_at`` and ``more``."""
        query = "claim" if request.queues is None else "claim_queues"
        params: dict[str, Any] = {
            "worker_id": request.worker_id,
            "limit": request.limit,
            "queues": None if request.queues is None else json.dumps(list(request.queues)),
            "names": None if request.names is None else json.dumps(list(request.names)),
            "now": now,
            "visible_at": now + request.visibility_timeout,
        }
        governed: list[JobRow] = []
        if request.flow:
            governed, batch.wake_at, batch.more = self._claim_flow(conn, params, request.limit, now)
        left = request.limit - len(governed)
        if request.fair:
            return governed + self._claim_fair(conn, params, request, left)
        return governed + (dict_rows(conn.execute(QUERIES[query], {**params, "limit": left})) if left else [])

    def _claim_fair(self, conn: sqlite3.Connection, params: dict[str, Any], request: ClaimRequest,
                    limit: int) -> list[JobRow]:
        """Lapsed claims first, then round-robin by tenant from this driver's cursor (see
        :mod:`ultimat3.drivers.fair`), under the write lock the claim holds."""
        if limit <= 0:
            return []
        rows = dict_rows(conn.execute(QUERIES["claim_lapsed"], {**params, "limit": limit}))
        key = None if request.queues is None else tuple(request.queues)

        def tenants_from(start: str, n: int) -> list[str]:
            return [r["tenant"] for r in conn.execute(QUERIES["fair_tenants"], {**params, "start": start, "limit": n})]

        def jobs_of(tenant: str, n: int) -> list[JobRow]:
            return dict_rows(conn.execute(QUERIES["fair_jobs"], {**params, "tenant": tenant, "n": n}))

        def claim(picked: list[JobRow]) -> list[JobRow]:
            ids = json.dumps([r["id"] for r in picked])
            return dict_rows(conn.execute(QUERIES["claim_ids"], {**params, "ids": ids}))

        with self._fair_lock:
            start = self._fair_start.get(key, "")
        claimed, after = fair_claim(tenants_from, jobs_of, claim, lambda r: (-r["priority"], r["run_at"], r["id"]),
                                    start, limit - len(rows), request.weights)
        if after is not None:
            with self._fair_lock:
                self._fair_start[key] = after
        return rows + claimed

    def _claim_flow(self, conn: sqlite3.Connection, params: dict[str, Any], limit: int,
                    now: float) -> tuple[list[JobRow], float | None, bool]:
        """The flow-controlled half of a claim (see :mod:`ultimat3.drivers.flow`), under the write
        lock the claim already holds: nothing can take a slot between the count and the claim."""
        found = conn.execute(QUERIES["flow_candidates"], {**params, "scan": scan_size(limit)}).fetchall()

        def next_token() -> float | None:
            # When the first bucket that is empty now (left out of the candidates) refills.
            row = conn.execute(QUERIES["flow_next_token"], {"now": now}).fetchone()
            return None if row is None or row["wake_at"] is None else float(row["wake_at"])

        if not found:
            return [], next_token(), False
        candidates = [Candidate.of(r) for r in found]
        flow_keys = json.dumps(sorted({c.flow_key for c in candidates if c.flow_key is not None}))
        rate_keys = json.dumps(sorted({c.rate_key for c in candidates if c.rate_key is not None}))
        running = {r["flow_key"]: r["n"] for r in conn.execute(QUERIES["flow_running"], {"keys": flow_keys})}
        buckets = {r["key"]: Bucket.of(r) for r in conn.execute(QUERIES["flow_buckets"], {"keys": rate_keys})}
        decided = admit(candidates, running, buckets, now, limit)
        # A claim that filled its limit is followed by another at once: it needs no wake-up hint.
        wake_at = None if len(decided.ids) >= limit else earliest(decided.wake_at, next_token())
        conn.executemany(QUERIES["flow_bucket_store"], [
            {"key": b.key, "tokens": b.tokens, "at": b.at, "per_second": b.per_second, "burst": b.burst}
            for b in decided.buckets])
        if not decided.ids:
            return [], wake_at, decided.refused
        claimed = dict_rows(conn.execute(QUERIES["claim_ids"], {**params, "ids": json.dumps(decided.ids)}))
        return claimed, wake_at, decided.refused

    @fenced_key(lambda: False)
    def ack(self, job_id: str, claim_token: str, result: Any = None) -> bool:
        """Mark ``done`` with ``result`` if still running under ``claim_token``."""
        encoded = result_text(job_id, result)
        params = {"id": job_id, "claim_token": claim_token, "result": encoded, "now": self._now()}
        return self._execute("ack", params)[1] == 1

    def ack_many(self, acks: Sequence[Ack]) -> list[bool]:
        """Settle several jobs as ``done`` in one transaction (one commit), each fenced on its token."""
        encoded = [result_text(item.job_id, item.result) for item in acks]
        return self._write(lambda conn, now: self._ack_in(conn, now, acks, encoded)) if acks else []

    @staticmethod
    def _ack_in(conn: sqlite3.Connection, now: float, acks: Sequence[Ack], encoded: list[str | None]) -> list[bool]:
        storable = [is_storable_text(item.job_id) and is_storable_text(item.claim_token) for item in acks]
        ids = [item.job_id for item, ok in zip(acks, storable, strict=True) if ok]
        if len(set(ids)) < len(ids):
            # The same job twice: only the first ack can settle it, which one statement cannot tell.
            return [ok and conn.execute(QUERIES["ack"], {"id": item.job_id, "claim_token": item.claim_token,
                                                         "result": result, "now": now}).rowcount == 1
                    for item, result, ok in zip(acks, encoded, storable, strict=True)]
        batch = json.dumps([[item.job_id, item.claim_token, result]
                            for item, result, ok in zip(acks, encoded, storable, strict=True) if ok])
        done = {row[0] for row in conn.execute(QUERIES["ack_many"], {"acks": batch, "now": now})} if ids else set()
        return [ok and item.job_id in done for item, ok in zip(acks, storable, strict=True)]

    @fenced_key(lambda: False)
    def nack(self, job_id: str, claim_token: str, request: NackRequest) -> bool:
        """Put the attempt back (``ready``/``suspended``) or dead-letter it, if still claimed."""
        if request.dead_letter:
            query = "nack_dead"
        elif request.release:
            query = "nack_release"
        elif not request.counts_as_attempt:
            query = "nack_suspend"
        else:
            query = "nack_retry"
        now = self._now()
        params = {
            "id": job_id,
            "claim_token": claim_token,
            "run_at": now + request.delay,
            "now": now,
        }
        if not request.release:
            params["error"] = None if request.error is None else storable(request.error)
        rows = self._rows(query, params)
        if rows:
            self._notify([rows[0]["queue"]])
        return bool(rows)

    @fenced_key(lambda: False)
    def heartbeat(self, job_id: str, claim_token: str, visibility_timeout: float) -> bool:
        """Push ``visible_at`` to now + ``visibility_timeout`` if still claimed."""
        now = self._now()
        params = {"id": job_id, "claim_token": claim_token, "visible_at": now + visibility_timeout, "now": now}
        return self._execute("heartbeat", params)[1] == 1

    @unknown_key(lambda: None)
    def cancel(self, job_id: str, reason: str | None = None) -> JobRecord | None:
        """Cancel a job not yet finished; a finished one is returned unchanged, an unknown id as None."""

        def run(conn: sqlite3.Connection, now: float) -> sqlite3.Row | None:
            text = None if reason is None else storable(reason)
            rows = conn.execute(QUERIES["cancel"], {"id": job_id, "reason": text, "now": now}).fetchall()
            if rows:
                conn.execute(QUERIES["cancel_ledger"],
                             {"run_id": rows[0]["run_id"], "reason": rows[0]["last_error"], "now": now})
            row: sqlite3.Row | None = rows[0] if rows else conn.execute(QUERIES["job_get"], {"id": job_id}).fetchone()
            return row

        row = self._write(run)
        return None if row is None else job_record_of(row)

    @unknown_key(lambda: None)
    def retry(self, job_id: str) -> JobRecord | None:
        """A ``dead`` or ``cancelled`` job becomes ``ready`` now, attempt 0, same run."""

        def run(conn: sqlite3.Connection, now: float) -> tuple[sqlite3.Row | None, bool]:
            try:
                rows = conn.execute(QUERIES["retry"], {"id": job_id, "now": now}).fetchall()
            except sqlite3.IntegrityError:
                # Back in a live state it would share its key with the live job that took it.
                job = conn.execute(QUERIES["job_get"], {"id": job_id}).fetchone()
                live = conn.execute(
                    QUERIES["job_live_by_key"], {"name": job["name"], "idempotency_key": job["idempotency_key"]}
                ).fetchone()
                raise JobDuplicateError(job["name"], job["idempotency_key"], live["id"]) from None
            if rows:
                return rows[0], True
            return conn.execute(QUERIES["job_get"], {"id": job_id}).fetchone(), False

        row, retried = self._write(run)
        if row is None:
            return None
        if retried:
            self._notify([row["queue"]])
        return job_record_of(row)

    def bulk(self, request: BulkRequest) -> BulkBatch:
        """One batch of an operator's bulk action (see the protocol)."""
        return sqlite_bulk(self, request)

    def prune(self, older_than: float) -> int:
        """Delete jobs finished at least ``older_than`` seconds ago, and the steps of their runs."""

        def run(conn: sqlite3.Connection, now: float) -> int:
            conn.execute(QUERIES["flow_forget_full"], {"now": now})
            run_ids = [row[0] for row in conn.execute(QUERIES["prune_delete_jobs"], {"cutoff": now - older_than})]
            if run_ids:
                conn.execute(QUERIES["prune_delete_steps"], {"run_ids": json.dumps(run_ids)})
            return len(run_ids)

        return self._write(run)

    def close(self) -> None:
        """Close every connection this driver opened (threads reopen on their next call)."""
        self._async_writer.close()
        with self._lock:
            connections, self._connections = self._connections, []
            self._generation += 1
        for conn in connections:
            try:
                conn.close()
            except sqlite3.Error:  # pragma: no cover - closing is best effort
                _log.debug("closing a SQLite connection failed", exc_info=True)


def _apply_migration(conn: sqlite3.Connection, now: float, migration: Migration) -> bool:
    """Apply ``migration`` unless another process did since we looked; whether it was applied."""
    if conn.execute(QUERIES["migrations_table_exists"]).fetchone() is not None and (
        conn.execute(QUERIES["migration_is_applied"], {"id": migration.id}).fetchone() is not None
    ):
        return False
    for statement in split_statements(migration.sql):
        conn.execute(statement)
    conn.execute(QUERIES["migration_mark_applied"], {"id": migration.id, "now": now})
    return True


_MIGRATIONS: list[Migration] = load_migrations(__package__ or "ultimat3.drivers.sqlite")
