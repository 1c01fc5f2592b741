"""The memory driver's state: rows as objects under one lock, and the indexes a database would keep."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ultimat3.core.clock import Clock, to_datetime
from ultimat3.drivers.flow import Bucket
from ultimat3.drivers.protocol import (
    LIVE_STATES,
    AttemptRecord,
    BackfillKind,
    BackfillRun,
    BackfillStatus,
    JobFilter,
    JobRecord,
    JobState,
    Lease,
)
from ultimat3.drivers.records import ended_outcome
from ultimat3.drivers.values import (
    strict_dumps,
)

_log = logging.getLogger("ultimat3.drivers.memory")

#: The library's own migrations, as the SQL drivers record them in ``x_migrations``.
INIT_MIGRATION = "x:0001_init"
LIBRARY_MIGRATIONS = (INIT_MIGRATION, "x:0002_workers", "x:0003_operations", "x:0004_schedules",
                      "x:0005_claim_any_index", "x:0006_backfill_control", "x:0007_flow_control",
                      "x:0008_attempts", "x:0009_lean_indexes")
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
    flow_key: str | None = None
    flow_max: int | None = None
    rate_key: str | None = None
    rate_per_second: float | None = None
    rate_burst: int | None = None
    started_at: float | None = None

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
            flow_key=self.flow_key,
            flow_max=self.flow_max,
            rate_key=self.rate_key,
            rate_per_second=self.rate_per_second,
            rate_burst=self.rate_burst,
            started_at=None if self.started_at is None else to_datetime(self.started_at),
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
    kind: BackfillKind = "pass"
    failures: int = 0
    throttle: str | None = None
    paused_by: str | None = None

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
            kind=self.kind,
            failures=self.failures,
            throttle=self.throttle,
            paused_by=self.paused_by,
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


@dataclass
class _Worker:
    """One ``x_workers`` row plus its liveness flag (a memory driver lives in one process, so the
    flag is the whole signal: :meth:`MemoryWorkerRegistry.abandon` drops it as a death would)."""

    id: str
    host: str
    pid: int
    concurrency: int
    queues: tuple[str, ...] | None
    started_at: float
    last_seen_at: float
    clock_offset: float | None = None
    wakeups: str | None = None
    alive: bool = True


class _Store:
    """Every table, and the one lock that guards all of them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        # Serialises schedule fires (a compare, an enqueue that takes `lock` itself, a set).
        self.fire_lock = threading.Lock()
        self.jobs: dict[str, _Job] = {}
        # Mirrors x_jobs_name_idempotency_live_idx: (name, key) -> id of the one live job holding it.
        self.live_keys: dict[tuple[str, str], str] = {}
        self.steps: dict[str, dict[str, _Step]] = {}
        # x_attempts: job id -> the attempts that ended other than by success, oldest first.
        self.attempts: dict[str, list[AttemptRecord]] = {}
        self.backfills: dict[str, _Backfill] = {}
        # x_backfill_failures: (name, key) -> (reason, run_id, batch, failed_at).
        self.failures: dict[tuple[str, str], tuple[str, str, int, float]] = {}
        self.leases: dict[tuple[str, int], _Lease] = {}
        # x_rates: rate key -> token bucket.
        self.rates: dict[str, Bucket] = {}
        self.workers: dict[str, _Worker] = {}
        # x_queues: queue -> (paused, changed_at, changed_by); x_audit: id -> entry fields.
        self.queues: dict[str, tuple[bool, float, str]] = {}
        self.audit: dict[str, dict[str, Any]] = {}
        # x_schedules: key -> row fields (epoch-second times).
        self.schedules: dict[str, dict[str, Any]] = {}
        # Insertion order is application order, which is what "oldest first" means here.
        self.migrations: dict[str, float] = {}

    @contextmanager
    def changing(self, job: _Job) -> Iterator[None]:
        """Around a change to ``job``: what x_jobs_attempt_ended does in SQL -- when the change
        ends a running attempt other than by success, that attempt goes to ``attempts``."""
        state, token, attempt, worker, started = job.state, job.claim_token, job.attempt, job.claimed_by, job.started_at
        yield
        if state != "running" or job.state == "done" or job.claim_token == token:
            return
        outcome = ended_outcome(job.state, attempt, job.attempt, job.last_error)
        self.attempts.setdefault(job.id, []).append(AttemptRecord(
            job_id=job.id, attempt=attempt, outcome=outcome, worker_id=worker,
            started_at=None if started is None else to_datetime(started), ended_at=to_datetime(job.updated_at),
            error=job.last_error if outcome in ("failed", "dead", "cancelled", "lost") else None))

    def set_state(self, job: _Job, state: JobState) -> None:
        """Move ``job`` to ``state``, keeping the live-key index in step. Caller holds the lock."""
        key = job.key()
        if key is not None:
            if state in LIVE_STATES:
                self.live_keys[key] = job.id
            elif self.live_keys.get(key) == job.id:
                del self.live_keys[key]
        job.state = state
