"""The in-process driver: every table of the SQL schema as a dict behind one lock.

For tests and ``x dev``. It keeps the exact semantics the SQL drivers keep (the contract suite in
``tests/contract`` runs against all three), so nothing a test proves here stops being true on
SQLite or PostgreSQL. Values cross the boundary as JSON, as they would through a ``jsonb`` column:
what a caller hands in is copied on the way in and on the way out, so neither side can mutate the
other's state.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ultimat3.core.clock import Clock, system_clock, to_datetime
from ultimat3.core.errors import ConfigError, XError
from ultimat3.drivers.errors import DriverError, JobDuplicateError
from ultimat3.drivers.protocol import (
    FINAL_STATES,
    JOB_STATES,
    LIVE_STATES,
    Ack,
    BackfillLedger,
    BackfillRun,
    BackfillStatus,
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    JobFilter,
    JobIntrospection,
    JobRecord,
    JobState,
    Lease,
    LeaseStore,
    MigrationLedger,
    MigrationRecord,
    NackRequest,
    QueueStats,
    StepRecord,
    StepStore,
    WaitingName,
    WakeCallback,
)
from ultimat3.drivers.staging import stage
from ultimat3.drivers.values import (
    check_step_name,
    fenced_key,
    filter_is_storable,
    is_storable_text,
    require_text,
    result_text,
    storable,
    strict_dumps,
    unknown_key,
)

__all__ = [
    "MemoryBackfillLedger",
    "MemoryDriver",
    "MemoryIntrospection",
    "MemoryLeaseStore",
    "MemoryMigrationLedger",
    "MemoryStepStore",
]

_log = logging.getLogger(__name__)

#: The library's own migration, as the SQL drivers record it in ``x_migrations``.
INIT_MIGRATION = "x:0001_init"
_RUNNABLE_WAITING: frozenset[JobState] = frozenset({"ready", "delayed", "suspended"})
_FINISHED_BACKFILL: frozenset[BackfillStatus] = frozenset({"completed", "failed", "cancelled"})
_EVERY_JOB = JobFilter()


def _json_copy(value: Any) -> Any:
    """A deep copy through JSON, refusing what a ``jsonb`` column would refuse (NaN included)."""
    return json.loads(strict_dumps(value))


@dataclass
class _Job:
    """One mutable ``x_jobs`` row; times are epoch seconds from the driver's clock."""

    id: str
    run_id: str
    name: str
    queue: str
    payload: dict[str, Any]
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    run_at: float
    created_at: float
    updated_at: float
    idempotency_key: str | None
    tenant_id: str | None
    traceparent: str | None
    enqueued_by: str | None
    claimed_by: str | None = None
    claim_token: str | None = None
    visible_at: float | None = None
    finished_at: float | None = None
    last_error: str | None = None
    result: Any = None

    def record(self) -> JobRecord:
        """The row as the protocol reports it (JSON values copied, times as UTC datetimes)."""
        return JobRecord(
            id=self.id,
            run_id=self.run_id,
            name=self.name,
            queue=self.queue,
            payload=_json_copy(self.payload),
            state=self.state,
            priority=self.priority,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            run_at=to_datetime(self.run_at),
            created_at=to_datetime(self.created_at),
            updated_at=to_datetime(self.updated_at),
            idempotency_key=self.idempotency_key,
            tenant_id=self.tenant_id,
            traceparent=self.traceparent,
            enqueued_by=self.enqueued_by,
            claimed_by=self.claimed_by,
            visible_at=None if self.visible_at is None else to_datetime(self.visible_at),
            finished_at=None if self.finished_at is None else to_datetime(self.finished_at),
            last_error=self.last_error,
            result=_json_copy(self.result),
        )

    def held_by(self, claim_token: str) -> bool:
        """The fence: still ``running`` under exactly this claim."""
        return self.state == "running" and self.claim_token == claim_token

    def key(self) -> tuple[str, str] | None:
        """The (name, idempotency key) this row holds while live, if it has a key."""
        return None if self.idempotency_key is None else (self.name, self.idempotency_key)


@dataclass
class _Step:
    run_id: str
    name: str
    result: Any
    created_at: float


@dataclass
class _Backfill:
    run_id: str
    name: str
    checksum: str
    status: BackfillStatus
    batches: int
    rows: int
    started_at: float
    job_id: str | None
    finished_at: float | None = None
    error: str | None = None

    def record(self) -> BackfillRun:
        return BackfillRun(
            run_id=self.run_id,
            name=self.name,
            checksum=self.checksum,
            status=self.status,
            batches=self.batches,
            rows=self.rows,
            started_at=to_datetime(self.started_at),
            job_id=self.job_id,
            finished_at=None if self.finished_at is None else to_datetime(self.finished_at),
            error=self.error,
        )


@dataclass
class _Lease:
    key: str
    slot: int
    holder: str
    token: str
    expires_at: float

    def record(self) -> Lease:
        return Lease(
            key=self.key,
            slot=self.slot,
            holder=self.holder,
            token=self.token,
            expires_at=to_datetime(self.expires_at),
        )


class _Store:
    """Every table, and the one lock that guards all of them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.jobs: dict[str, _Job] = {}
        # Mirrors x_jobs_name_idempotency_live_idx: (name, key) -> id of the one live job holding it.
        self.live_keys: dict[tuple[str, str], str] = {}
        self.steps: dict[str, dict[str, _Step]] = {}
        self.backfills: dict[str, _Backfill] = {}
        self.leases: dict[tuple[str, int], _Lease] = {}
        # Insertion order is application order, which is what "oldest first" means here.
        self.migrations: dict[str, float] = {}

    def set_state(self, job: _Job, state: JobState) -> None:
        """Move ``job`` to ``state``, keeping the live-key index in step. Caller holds the lock."""
        key = job.key()
        if key is not None:
            if state in LIVE_STATES:
                self.live_keys[key] = job.id
            elif self.live_keys.get(key) == job.id:
                del self.live_keys[key]
        job.state = state


class MemoryIntrospection:
    """The read side over the in-memory jobs."""

    def __init__(self, store: _Store) -> None:
        self._store = store

    @unknown_key(lambda: None)
    def get(self, job_id: str) -> JobRecord | None:
        """One job, or ``None`` when no job has that id."""
        with self._store.lock:
            job = self._store.jobs.get(job_id)
            return None if job is None else job.record()

    def stats(self) -> list[QueueStats]:
        """Counts for all seven states of every queue that holds a job, by queue name."""
        with self._store.lock:
            counts: dict[str, dict[str, int]] = {}
            for job in self._store.jobs.values():
                per_queue = counts.setdefault(job.queue, dict.fromkeys(JOB_STATES, 0))
                per_queue[job.state] += 1
            return [QueueStats(queue=queue, counts=counts[queue]) for queue in sorted(counts)]

    def waiting_names(self) -> list[WaitingName]:
        """Every (queue, name) with jobs ready, delayed or suspended, by queue then name."""
        with self._store.lock:
            counts: dict[tuple[str, str], int] = {}
            for job in self._store.jobs.values():
                if job.state in ("ready", "delayed", "suspended"):
                    counts[(job.queue, job.name)] = counts.get((job.queue, job.name), 0) + 1
        return [WaitingName(queue, name, n) for (queue, name), n in sorted(counts.items())]

    # Defined last: a method named ``list`` would shadow the builtin in later annotations.
    def list(self, filter: JobFilter = _EVERY_JOB) -> list[JobRecord]:
        """Jobs matching ``filter``, newest first (``created_at`` desc, then ``id`` desc)."""
        if not filter_is_storable(filter.queue, filter.name, filter.tenant_id):
            return []
        with self._store.lock:
            rows = [
                job
                for job in self._store.jobs.values()
                if (filter.queue is None or job.queue == filter.queue)
                and (filter.name is None or job.name == filter.name)
                and (filter.state is None or job.state == filter.state)
                and (filter.tenant_id is None or job.tenant_id == filter.tenant_id)
            ]
            rows.sort(key=lambda job: (job.created_at, job.id), reverse=True)
            return [job.record() for job in rows[: max(0, filter.limit)]]


class MemoryStepStore:
    """Durable step results keyed by (run id, step name); first write wins."""

    def __init__(self, store: _Store) -> None:
        self._store = store

    @unknown_key(dict)
    def load(self, run_id: str) -> dict[str, StepRecord]:
        """Every recorded step of ``run_id`` by name."""
        with self._store.lock:
            steps = self._store.steps.get(run_id, {})
            return {
                name: StepRecord(
                    run_id=step.run_id,
                    name=step.name,
                    result=_json_copy(step.result),
                    created_at=to_datetime(step.created_at),
                )
                for name, step in steps.items()
            }

    @fenced_key(lambda: False)
    def record(self, job_id: str, claim_token: str, name: str, result: Any) -> bool:
        """Record step ``name`` if job ``job_id`` is still ``running`` under ``claim_token``.

        Raises an :class:`~ultimat3.core.XError` coded ``X_STEP_RESULT`` when ``result`` is not
        JSON, whether or not the fence holds: it is a bug in the step, not a lost race.
        """
        check_step_name(name)
        try:
            stored = _json_copy(result)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f'step "{name}" returned a value that is not JSON ({type(result).__name__}): {exc}',
                "return JSON from a step: dicts, lists, strings, numbers (finite), booleans or None",
                code="X_STEP_RESULT",
            ) from exc
        with self._store.lock:
            job = self._store.jobs.get(job_id)
            if job is None or not job.held_by(claim_token):
                return False
            steps = self._store.steps.setdefault(job.run_id, {})
            # A replay of a recorded step is not an error, and must not rewrite history.
            if name not in steps:
                steps[name] = _Step(job.run_id, name, stored, self._store.clock.now())
            return True


class MemoryBackfillLedger:
    """The ``x_backfills`` ledger: one row per pass."""

    def __init__(self, store: _Store) -> None:
        self._store = store

    def start(self, run_id: str, name: str, checksum: str, job_id: str | None) -> BackfillRun:
        """Open the row for ``run_id``, or reopen it (``running``, error cleared) on a retry."""
        require_text("X_BACKFILL_LEDGER", run_id=run_id, name=name, checksum=checksum, job_id=job_id)
        with self._store.lock:
            row = self._store.backfills.get(run_id)
            if row is None:
                row = _Backfill(
                    run_id=run_id,
                    name=name,
                    checksum=checksum,
                    status="running",
                    batches=0,
                    rows=0,
                    started_at=self._store.clock.now(),
                    job_id=job_id,
                )
                self._store.backfills[run_id] = row
            else:
                # A retried attempt resumes the same pass: progress and start time stay.
                row.status = "running"
                row.error = None
                row.finished_at = None
                if row.job_id is None:
                    row.job_id = job_id
            return row.record()

    def progress(self, run_id: str, batches: int, rows: int) -> None:
        """Record how far the pass got (absolute counts; unknown run ids are ignored)."""
        with self._store.lock:
            row = self._store.backfills.get(run_id)
            if row is not None:
                row.batches = batches
                row.rows = rows

    def finish(self, run_id: str, status: BackfillStatus, error: str | None = None) -> None:
        """Close the row as ``completed``, ``failed`` or ``cancelled`` with ``finished_at`` = now."""
        if status not in _FINISHED_BACKFILL:
            raise ConfigError(
                f"backfill run {run_id!r} cannot finish as {status!r}",
                "finish a pass as 'completed', 'failed' or 'cancelled'",
                code="X_BACKFILL_STATUS",
            )
        with self._store.lock:
            row = self._store.backfills.get(run_id)
            if row is not None and row.status == "running":
                row.status = status
                row.error = error
                row.finished_at = self._store.clock.now()

    def get(self, run_id: str) -> BackfillRun | None:
        """One pass by run id."""
        with self._store.lock:
            row = self._store.backfills.get(run_id)
            return None if row is None else row.record()

    def last_completed(self, name: str) -> BackfillRun | None:
        """The most recently finished ``completed`` pass of ``name``."""
        with self._store.lock:
            done = [
                row
                for row in self._store.backfills.values()
                if row.name == name and row.status == "completed" and row.finished_at is not None
            ]
            if not done:
                return None
            return max(done, key=lambda row: (row.finished_at or 0.0, row.run_id)).record()

    def list(self, name: str | None = None) -> list[BackfillRun]:
        """Every pass (of ``name``), newest first (``started_at`` desc, then ``run_id`` desc)."""
        with self._store.lock:
            rows = [row for row in self._store.backfills.values() if name is None or row.name == name]
            rows.sort(key=lambda row: (row.started_at, row.run_id), reverse=True)
            return [row.record() for row in rows]


class MemoryLeaseStore:
    """Fleet slots ``0..limit-1`` per key; a slot is free when unheld or expired."""

    def __init__(self, store: _Store) -> None:
        self._store = store

    def acquire(self, key: str, holder: str, limit: int, ttl: float) -> Lease | None:
        """Take the lowest free (or expired) slot of ``key``; ``None`` when all are held."""
        require_text("X_LEASE_KEY", key=key, holder=holder)
        if limit < 1:
            raise XError(
                f"lease {key!r} asked for limit {limit}",
                "a fleet limit is at least 1 concurrent holder",
                code="X_LEASE_LIMIT",
            )
        with self._store.lock:
            now = self._store.clock.now()
            for slot in range(limit):
                current = self._store.leases.get((key, slot))
                if current is None or current.expires_at <= now:
                    lease = _Lease(key, slot, holder, uuid.uuid4().hex, now + ttl)
                    self._store.leases[(key, slot)] = lease
                    return lease.record()
            return None

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend a lease still held under its token (even if it expired meanwhile but nobody
        re-took the slot: only the token decides); ``None`` when it was lost."""
        with self._store.lock:
            current = self._store.leases.get((lease.key, lease.slot))
            if current is None or current.token != lease.token:
                return None
            current.expires_at = self._store.clock.now() + ttl
            return current.record()

    def release(self, lease: Lease) -> bool:
        """Free the slot if still held under the lease's token."""
        with self._store.lock:
            current = self._store.leases.get((lease.key, lease.slot))
            if current is None or current.token != lease.token:
                return False
            del self._store.leases[(lease.key, lease.slot)]
            return True

    @unknown_key(list)
    def holders(self, key: str) -> list[Lease]:
        """Unexpired leases of ``key``, by slot."""
        with self._store.lock:
            now = self._store.clock.now()
            held = [lease for (k, _), lease in self._store.leases.items() if k == key and lease.expires_at > now]
            return [lease.record() for lease in sorted(held, key=lambda lease: lease.slot)]


class MemoryMigrationLedger:
    """The ``x_migrations`` ledger."""

    def __init__(self, store: _Store) -> None:
        self._store = store

    def applied(self) -> list[MigrationRecord]:
        """Every applied migration, oldest first."""
        with self._store.lock:
            items = self._store.migrations.items()
            return [MigrationRecord(id=mid, applied_at=to_datetime(at)) for mid, at in items]

    @unknown_key(lambda: False)
    def is_applied(self, migration_id: str) -> bool:
        """Whether ``migration_id`` is recorded."""
        with self._store.lock:
            return migration_id in self._store.migrations

    def mark_applied(self, migration_id: str) -> None:
        """Record ``migration_id`` as applied now; a second call keeps the first time."""
        require_text("X_MIGRATION_ID", migration_id=migration_id)
        with self._store.lock:
            self._store.migrations.setdefault(migration_id, self._store.clock.now())


class MemoryDriver:
    """A :class:`~ultimat3.drivers.protocol.JobDriver` that keeps everything in this process.

    Thread-safe (one lock over all state). No cross-process wake-ups and no transactional
    enqueue: there is no database transaction to join.
    """

    name = "memory"
    url = "memory://"
    supports_listen_notify = False
    supports_transactional_enqueue = False

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else system_clock
        self._store = _Store(self.clock)
        self._subscribers: list[WakeCallback] = []
        # Annotated with the protocol types: the protocol's attributes are settable, so mypy
        # compares them invariantly.
        self.introspect: JobIntrospection = MemoryIntrospection(self._store)
        self.steps: StepStore = MemoryStepStore(self._store)
        self.backfills: BackfillLedger = MemoryBackfillLedger(self._store)
        self.leases: LeaseStore = MemoryLeaseStore(self._store)
        self.migrations: MigrationLedger = MemoryMigrationLedger(self._store)

    # -- lifecycle --------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Record the library's migration (there are no tables to create); ids applied now."""
        if self.migrations.is_applied(INIT_MIGRATION):
            return []
        self.migrations.mark_applied(INIT_MIGRATION)
        return [INIT_MIGRATION]

    def close(self) -> None:
        """Nothing to release."""

    # -- writes -----------------------------------------------------------------------------

    def enqueue(self, request: EnqueueRequest, connection: Any = None) -> EnqueueResult:
        """Write one job, deduplicated per (name, idempotency key) among live states."""
        return self.enqueue_many([request], connection)[0]

    def enqueue_many(self, requests: Sequence[EnqueueRequest], connection: Any = None) -> list[EnqueueResult]:
        """Write several jobs all-or-nothing: if one raises, none is written."""
        if connection is not None:
            raise DriverError(
                "the memory driver cannot enqueue inside a caller's transaction",
                "drop connection=..., or use the sqlite or postgres driver to enqueue transactionally",
                code="X_DRIVER_CONNECTION",
            )
        # Checked (and copied through JSON) before taking the lock: a bad request fails before
        # anything is staged.
        prepared = [stage(request) for request in requests]
        results: list[EnqueueResult] = []
        woken: list[str] = []
        with self._store.lock:
            now = self.clock.now()
            staged: list[_Job] = []
            staged_keys: dict[tuple[str, str], _Job] = {}
            for item in prepared:
                request = item.request
                key = None if request.idempotency_key is None else (request.name, request.idempotency_key)
                existing: _Job | None = None
                if key is not None:
                    existing = staged_keys.get(key)
                    if existing is None and key in self._store.live_keys:
                        existing = self._store.jobs[self._store.live_keys[key]]
                if existing is not None:
                    if request.on_conflict == "error":
                        raise item.duplicate(existing.id)
                    results.append(EnqueueResult(id=existing.id, run_id=existing.run_id, deduped=True))
                    continue
                columns = item.columns(now)
                job = _Job(
                    id=item.id,
                    run_id=item.run_id,
                    name=request.name,
                    queue=request.queue,
                    payload=json.loads(item.payload),  # a copy through JSON, as a database would keep
                    state=columns["state"],
                    priority=request.priority,
                    attempt=0,
                    max_attempts=request.max_attempts,
                    run_at=columns["run_at"],
                    created_at=now,
                    updated_at=now,
                    idempotency_key=request.idempotency_key,
                    tenant_id=request.tenant_id,
                    traceparent=request.traceparent,
                    enqueued_by=request.enqueued_by,
                )
                staged.append(job)
                if key is not None:
                    staged_keys[key] = job
                results.append(EnqueueResult(id=job.id, run_id=job.run_id, deduped=False))
            # Nothing above raised: commit the whole batch.
            for job in staged:
                self._store.jobs[job.id] = job
                self._store.set_state(job, job.state)
                woken.append(job.queue)
        self._wake(woken)
        return results

    def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        """Move up to ``request.limit`` runnable jobs to ``running`` under fresh claim tokens."""
        if request.limit < 1:
            return []
        queues = None if request.queues is None else frozenset(request.queues)
        names = None if request.names is None else frozenset(request.names)
        with self._store.lock:
            now = self.clock.now()
            runnable = [
                job
                for job in self._store.jobs.values()
                if (
                    (job.state in _RUNNABLE_WAITING and job.run_at <= now)
                    # A lapsed claim: its worker is presumed lost, so the job is up for grabs.
                    or (job.state == "running" and job.visible_at is not None and job.visible_at <= now)
                )
                and (queues is None or job.queue in queues)
                and (names is None or job.name in names)
            ]
            runnable.sort(key=lambda job: (-job.priority, job.run_at, job.id))
            claimed: list[ClaimedJob] = []
            for job in runnable[: request.limit]:
                self._store.set_state(job, "running")
                job.attempt += 1
                job.claimed_by = request.worker_id
                job.visible_at = now + request.visibility_timeout
                # Random suffix: the same worker re-claiming at the same attempt still gets a new token.
                job.claim_token = f"{request.worker_id}:{job.attempt}:{uuid.uuid4().hex[:12]}"
                job.updated_at = now
                claimed.append(ClaimedJob(job=job.record(), claim_token=job.claim_token))
            return claimed

    def ack(self, job_id: str, claim_token: str, result: Any = None) -> bool:
        """Mark ``done`` with ``result`` if still running under ``claim_token``."""
        return self.ack_many([Ack(job_id, claim_token, result)])[0]

    def ack_many(self, acks: Sequence[Ack]) -> list[bool]:
        """Settle several jobs as ``done`` at once, each fenced on its own token."""
        stored = [json.loads(result_text(a.result, what=f"result of job {a.job_id}")) for a in acks]
        settled: list[bool] = []
        with self._store.lock:
            now = self.clock.now()
            for item, result in zip(acks, stored, strict=True):
                job = self._store.jobs.get(item.job_id) if is_storable_text(item.job_id) else None
                if job is None or not job.held_by(item.claim_token):
                    settled.append(False)
                    continue
                self._store.set_state(job, "done")
                job.result = result
                job.finished_at = now
                job.updated_at = now
                job.claim_token = None
                job.visible_at = None
                job.last_error = None
                settled.append(True)
        return settled

    @fenced_key(lambda: False)
    def nack(self, job_id: str, claim_token: str, request: NackRequest) -> bool:
        """Put the attempt back (retry or suspension) or dead-letter it, if still fenced-in."""
        with self._store.lock:
            job = self._store.jobs.get(job_id)
            if job is None or not job.held_by(claim_token):
                return False
            now = self.clock.now()
            if request.dead_letter:
                self._store.set_state(job, "dead")
                job.finished_at = now
            elif request.release:
                self._store.set_state(job, "ready")
                job.run_at = now + request.delay
                job.attempt = max(0, job.attempt - 1)
                job.claimed_by = None
            elif not request.counts_as_attempt:
                self._store.set_state(job, "suspended")
                job.run_at = now + request.delay
                # A sleep must not burn an attempt; floored, as the schema's CHECK demands.
                job.attempt = max(0, job.attempt - 1)
            else:
                self._store.set_state(job, "ready")
                job.run_at = now + request.delay
            if request.error is not None and not request.release:
                job.last_error = storable(request.error)
            job.claim_token = None
            job.visible_at = None
            job.updated_at = now
            queue = job.queue
        self._wake([queue])
        return True

    @fenced_key(lambda: False)
    def heartbeat(self, job_id: str, claim_token: str, visibility_timeout: float) -> bool:
        """Extend the claim to ``now + visibility_timeout``; ``False`` when the claim is gone."""
        with self._store.lock:
            job = self._store.jobs.get(job_id)
            if job is None or not job.held_by(claim_token):
                return False
            now = self.clock.now()
            job.visible_at = now + visibility_timeout
            job.updated_at = now
            return True

    @unknown_key(lambda: None)
    def cancel(self, job_id: str, reason: str | None = None) -> JobRecord | None:
        """Cancel an unfinished job; finished jobs come back unchanged, unknown ids as ``None``."""
        with self._store.lock:
            job = self._store.jobs.get(job_id)
            if job is None:
                return None
            if job.state not in FINAL_STATES:
                now = self.clock.now()
                self._store.set_state(job, "cancelled")
                if reason is not None:
                    job.last_error = storable(reason)
                job.finished_at = now
                job.updated_at = now
                # Dropping the token is what makes the running attempt's next heartbeat fail.
                job.claim_token = None
                job.visible_at = None
                ledger_row = self._store.backfills.get(job.run_id)
                if ledger_row is not None and ledger_row.status == "running":
                    ledger_row.status = "cancelled"
                    ledger_row.error = job.last_error if reason is None else storable(reason)
                    ledger_row.finished_at = now
            return job.record()

    @unknown_key(lambda: None)
    def retry(self, job_id: str) -> JobRecord | None:
        """Make a ``dead`` or ``cancelled`` job ``ready`` now with ``attempt`` 0, same run."""
        with self._store.lock:
            job = self._store.jobs.get(job_id)
            if job is None:
                return None
            if job.state not in ("dead", "cancelled"):
                return job.record()
            holder = None if job.idempotency_key is None else self._store.live_keys.get((job.name, job.idempotency_key))
            if holder is not None and job.idempotency_key is not None:
                # Reviving it would put a second live job under the key the unique index guards.
                raise JobDuplicateError(job.name, job.idempotency_key, holder)
            now = self.clock.now()
            self._store.set_state(job, "ready")
            job.attempt = 0
            job.run_at = now
            job.finished_at = None
            job.claim_token = None
            job.visible_at = None
            job.updated_at = now
            record = job.record()
        self._wake([record.queue])
        return record

    def prune(self, older_than: float) -> int:
        """Delete finished jobs finished at or before ``now - older_than``, and their steps."""
        with self._store.lock:
            cutoff = self.clock.now() - older_than
            doomed = [
                job
                for job in self._store.jobs.values()
                if job.state in FINAL_STATES and job.finished_at is not None and job.finished_at <= cutoff
            ]
            for job in doomed:
                del self._store.jobs[job.id]
            # Steps belong to a run; keep them while any remaining job still points at that run.
            remaining_runs = {job.run_id for job in self._store.jobs.values()}
            for run_id in {job.run_id for job in doomed} - remaining_runs:
                self._store.steps.pop(run_id, None)
            return len(doomed)

    # -- wake-ups ---------------------------------------------------------------------------

    def subscribe(self, callback: WakeCallback) -> Callable[[], None]:
        """Call ``callback(queue)`` after enqueues, nacks and retries made through this driver."""
        with self._store.lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._store.lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def _wake(self, queues: Sequence[str]) -> None:
        # Called outside the lock: a callback may call back into the driver.
        if not queues:
            return
        with self._store.lock:
            callbacks = list(self._subscribers)
        for queue in dict.fromkeys(queues):
            for callback in callbacks:
                try:
                    callback(queue)
                except Exception:
                    # A broken listener must not fail the write that already happened.
                    _log.exception("wake-up callback %r failed for queue %r", callback, queue)
