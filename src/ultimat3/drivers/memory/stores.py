"""The memory driver's stores: introspection, steps, the backfill ledger, leases, migrations."""

from __future__ import annotations

import builtins
import math
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import ConfigError, XError
from ultimat3.drivers.filters import error_code, matches, storable_filter
from ultimat3.drivers.flow import Bucket
from ultimat3.drivers.memory.state import (
    _EVERY_JOB,
    _FINISHED_BACKFILL,
    _Backfill,
    _Job,
    _json_copy,
    _Lease,
    _Step,
    _Store,
)
from ultimat3.drivers.protocol import (
    JOB_STATES,
    MAX_REASON_LENGTH,
    AttemptRecord,
    BackfillKind,
    BackfillRun,
    BackfillStatus,
    Completed,
    ErrorGroup,
    JobFilter,
    JobRecord,
    JobState,
    Lease,
    MigrationRecord,
    QueueStats,
    RowFailure,
    StepRecord,
    WaitingName,
)
from ultimat3.drivers.records import attempt_history
from ultimat3.drivers.values import (
    check_backfill_kind,
    check_bucket,
    check_step_name,
    fenced_key,
    quarantine_rows,
    require_text,
    storable,
    unknown_key,
)


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

    def _matching(self, flt: JobFilter, states: tuple[JobState, ...] | None = None,
                  as_of: float | None = None) -> builtins.list[_Job]:
        # Caller holds the lock.
        if not storable_filter(flt):
            return []
        return [
            job for job in self._store.jobs.values()
            if matches(flt, queue=job.queue, name=job.name, state=job.state, tenant_id=job.tenant_id,
                       last_error=job.last_error, updated_at=job.updated_at, job_id=job.id, states=states)
            and (as_of is None or job.updated_at <= as_of)
        ]

    def count(self, filter: JobFilter, states: tuple[JobState, ...] | None = None, as_of: float | None = None) -> int:
        """How many jobs match ``filter`` (within ``states`` and ``updated_at <= as_of`` when given)."""
        with self._store.lock:
            return len(self._matching(filter, states, as_of))

    def slot_holders(self, flow_key: str) -> builtins.list[JobRecord]:
        """The running jobs under ``flow_key``, oldest claim first."""
        with self._store.lock:
            held = [j for j in self._store.jobs.values() if j.state == "running" and j.flow_key == flow_key]
            return [j.record() for j in sorted(held, key=lambda j: (j.updated_at, j.id))]

    def completions(self, since: float, bucket: float = 60.0) -> builtins.list[Completed]:
        """Jobs finished ``done`` since ``since``, per queue and ``bucket`` seconds."""
        check_bucket(bucket)
        counts: dict[tuple[str, float], int] = {}
        with self._store.lock:
            for job in self._store.jobs.values():
                if job.state == "done" and job.finished_at is not None and job.finished_at >= since:
                    key = (job.queue, math.floor(job.finished_at / bucket) * bucket)
                    counts[key] = counts.get(key, 0) + 1
        return [Completed(queue, to_datetime(at), done) for (queue, at), done in sorted(counts.items())]

    def attempts(self, job_id: str) -> builtins.list[AttemptRecord]:
        """Every attempt of ``job_id``, oldest first."""
        with self._store.lock:
            job = self._store.jobs.get(job_id)
            return attempt_history(None if job is None else job.record(), self._store.attempts.get(job_id, []))

    def rate_bucket(self, rate_key: str) -> Bucket | None:
        """The bucket of ``rate_key`` as stored."""
        with self._store.lock:
            return self._store.rates.get(rate_key)

    def error_groups(self, filter: JobFilter) -> builtins.list[ErrorGroup]:
        """Matching jobs with a ``last_error``, grouped by its first line, largest group first."""
        groups: dict[str, builtins.list[_Job]] = {}
        with self._store.lock:
            for job in self._matching(filter):
                if job.last_error is not None:
                    groups.setdefault(job.last_error.split("\n", 1)[0], []).append(job)
            ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))[: max(0, filter.limit)]
            return [
                ErrorGroup(code=error_code(message), message=message, count=len(jobs),
                           first_seen=to_datetime(min(job.updated_at for job in jobs)),
                           last_seen=to_datetime(max(job.updated_at for job in jobs)),
                           sample_id=min(job.id for job in jobs))
                for message, jobs in ordered
            ]

    # Defined last: a method named ``list`` would shadow the builtin in later annotations.
    def list(self, filter: JobFilter = _EVERY_JOB) -> list[JobRecord]:
        """Jobs matching ``filter``, newest first (``created_at`` desc, then ``id`` desc)."""
        with self._store.lock:
            rows = self._matching(filter)
            if filter.before is not None:
                last = self._store.jobs.get(filter.before)
                if last is None:
                    return []
                rows = [job for job in rows if (job.created_at, job.id) < (last.created_at, last.id)]
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
    def record(self, job_id: str, claim_token: str, name: str, result: Any, connection: Any = None) -> bool:
        """Record step ``name`` if job ``job_id`` is still ``running`` under ``claim_token``.

        Raises an :class:`~ultimat3.core.XError` coded ``X_STEP_RESULT`` when ``result`` is not
        JSON, whether or not the fence holds: it is a bug in the step, not a lost race. There is no
        database to share a transaction with: a ``connection`` is refused (``X_DRIVER_CONNECTION``).
        """
        if connection is not None:
            raise XError(
                "the memory driver keeps jobs in this process: a step cannot be recorded in a database "
                "connection's transaction",
                "use the SQLite or PostgreSQL driver on the database the connection is open on",
                code="X_DRIVER_CONNECTION",
            )
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

    def __init__(self, store: _Store, wake: Callable[[Sequence[str]], None]) -> None:
        self._store = store
        self._wake = wake

    def start(self, run_id: str, name: str, checksum: str, job_id: str | None,
              kind: BackfillKind = "pass") -> BackfillRun:
        """Open the row for ``run_id``, or reopen it (``running``, error cleared) on a retry."""
        require_text("X_BACKFILL_LEDGER", run_id=run_id, name=name, checksum=checksum, job_id=job_id)
        check_backfill_kind(kind)
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
                    kind=kind,
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

    def progress(self, run_id: str, batches: int, rows: int, throttle: str | None = None) -> bool:
        """Record how far the pass got and why it waits; whether a pause was asked for."""
        with self._store.lock:
            row = self._store.backfills.get(run_id)
            if row is None:
                return False
            row.batches = batches
            row.rows = rows
            row.throttle = None if throttle is None else storable(throttle)[:MAX_REASON_LENGTH]
            return row.status == "running" and row.paused_by is not None

    def _newest(self, name: str, statuses: tuple[BackfillStatus, ...]) -> _Backfill | None:
        rows = [row for row in self._store.backfills.values() if row.name == name and row.status in statuses]
        return max(rows, key=lambda row: (row.started_at, row.run_id), default=None)

    def request_pause(self, name: str, actor: str) -> BackfillRun | None:
        """Ask the newest running pass of ``name`` to pause at its next batch boundary."""
        require_text("X_BACKFILL_LEDGER", name=name, actor=actor)
        with self._store.lock:
            row = self._newest(name, ("running",))
            if row is None:
                return None
            row.paused_by = actor
            return row.record()

    def pause(self, run_id: str) -> bool:
        """A running pass with a pause request becomes ``paused``."""
        with self._store.lock:
            row = self._store.backfills.get(run_id)
            if row is None or row.status != "running" or row.paused_by is None:
                return False
            row.status = "paused"
            row.throttle = None
            return True

    def resume(self, name: str, actor: str) -> BackfillRun | None:
        """Resume the newest paused (or asked-to-pause) pass of ``name`` and wake its job."""
        require_text("X_BACKFILL_LEDGER", name=name, actor=actor)
        woken: list[str] = []
        with self._store.lock:
            row = self._newest(name, ("running", "paused"))
            if row is None or (row.status == "running" and row.paused_by is None):
                return None
            row.status = "running"
            row.paused_by = None
            job = None if row.job_id is None else self._store.jobs.get(row.job_id)
            if job is not None and job.state == "suspended":
                now = self._store.clock.now()
                job.run_at = now
                job.updated_at = now
                woken.append(job.queue)
            record = row.record()
        self._wake(woken)
        return record

    def quarantine(self, run_id: str, name: str, batch: int, failed: Sequence[tuple[str, str]],
                   handled: Sequence[str], connection: Any = None) -> None:
        """Store ``failed`` rows, count the ones new to this pass, forget ``handled`` ones."""
        if connection is not None:
            raise XError(
                "the memory driver has no database connection for a quarantine to join",
                "use the sqlite or postgres driver for a backfill on the job store's database",
                code="X_DRIVER_CONNECTION",
            )
        require_text("X_BACKFILL_LEDGER", run_id=run_id, name=name)
        failed_rows, handled_keys = quarantine_rows(failed, handled)
        with self._store.lock:
            now = self._store.clock.now()
            fresh = 0
            for key, reason in failed_rows:
                held = self._store.failures.get((name, key))
                if held is None or held[1] != run_id:
                    fresh += 1
                self._store.failures[(name, key)] = (reason, run_id, batch, now)
            for key in handled_keys:
                self._store.failures.pop((name, key), None)
            row = self._store.backfills.get(run_id)
            if row is not None:
                row.failures += fresh

    def failures(self, name: str, limit: int = 1000, after: str | None = None) -> builtins.list[RowFailure]:
        """Quarantined rows of ``name`` by key, after ``after``."""
        with self._store.lock:
            keys = sorted(key for (held, key) in self._store.failures if held == name
                          and (after is None or key > after))[:max(limit, 0)]
            return [RowFailure(name, key, *self._failure(name, key)) for key in keys]

    def _failure(self, name: str, key: str) -> tuple[str, str, int, datetime]:
        reason, run_id, batch, at = self._store.failures[(name, key)]
        return reason, run_id, batch, to_datetime(at)

    def outstanding(self, name: str) -> int:
        """How many rows of ``name`` are quarantined now."""
        with self._store.lock:
            return sum(1 for (held, _key) in self._store.failures if held == name)

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
                row.throttle = None
                row.paused_by = None

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
                if row.name == name and row.status == "completed" and row.kind == "pass"
                and row.finished_at is not None
            ]
            if not done:
                return None
            return max(done, key=lambda row: (row.finished_at or 0.0, row.run_id)).record()

    def list(self, name: str | None = None) -> builtins.list[BackfillRun]:
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
