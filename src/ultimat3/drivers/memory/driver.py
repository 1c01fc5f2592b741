"""The in-process driver: every table of the SQL schema as a dict behind one lock.

For tests and ``x dev``. It keeps the exact semantics the SQL drivers keep (the contract suite in
``tests/contract`` runs against all three), so nothing a test proves here stops being true on
SQLite or PostgreSQL. Values cross the boundary as JSON, as they would through a ``jsonb`` column:
what a caller hands in is copied on the way in and on the way out, so neither side can mutate the
other's state.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ultimat3.core.clock import Clock, system_clock
from ultimat3.drivers.errors import DriverError, JobDuplicateError
from ultimat3.drivers.fair import check_weights, choose_tenants, fair_claim
from ultimat3.drivers.flow import WHOLE_TOKEN, Admission, Candidate, admit, earliest, scan_size
from ultimat3.drivers.memory.operations import MemoryAuditLog, MemoryQueueControl, close_ledger, memory_bulk
from ultimat3.drivers.memory.schedules import MemoryScheduleStore
from ultimat3.drivers.memory.state import (
    _RUNNABLE_WAITING,
    LIBRARY_MIGRATIONS,
    _Job,
    _log,
    _Store,
)
from ultimat3.drivers.memory.stores import (
    MemoryBackfillLedger,
    MemoryIntrospection,
    MemoryLeaseStore,
    MemoryMigrationLedger,
    MemoryStepStore,
)
from ultimat3.drivers.memory.workers import MemoryWorkerRegistry
from ultimat3.drivers.protocol import (
    FINAL_STATES,
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
    StepStore,
    WakeCallback,
    WorkerRegistry,
)
from ultimat3.drivers.staging import stage_many
from ultimat3.drivers.values import (
    fenced_key,
    is_storable_text,
    result_text,
    storable,
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
        # Fair claims: per queue set, where the next claim's turn starts (under the store's lock).
        self._fair_start: dict[tuple[str, ...] | None, str] = {}
        # Annotated with the protocol types: the protocol's attributes are settable, so mypy
        # compares them invariantly.
        self.introspect: JobIntrospection = MemoryIntrospection(self._store)
        self.steps: StepStore = MemoryStepStore(self._store)
        self.backfills: BackfillLedger = MemoryBackfillLedger(self._store, self._wake)
        self.leases: LeaseStore = MemoryLeaseStore(self._store)
        self.migrations: MigrationLedger = MemoryMigrationLedger(self._store)
        self.workers: WorkerRegistry = MemoryWorkerRegistry(self._store)
        self.queues: QueueControl = MemoryQueueControl(self._store, self._wake)
        self.audit: AuditLog = MemoryAuditLog(self._store)
        self.schedules: ScheduleStore = MemoryScheduleStore(self._store, self.enqueue_many)

    # -- lifecycle --------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Record the library's migration (there are no tables to create); ids applied now."""
        applied = []
        for migration_id in LIBRARY_MIGRATIONS:
            if not self.migrations.is_applied(migration_id):
                self.migrations.mark_applied(migration_id)
                applied.append(migration_id)
        return applied

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
        prepared = stage_many(requests)
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
                    flow_key=request.flow_key,
                    flow_max=request.flow_max,
                    rate_key=request.rate_key,
                    rate_per_second=request.rate_per_second,
                    rate_burst=request.rate_burst,
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

    async def aenqueue_many(self, requests: Sequence[EnqueueRequest], connection: Any = None) -> list[EnqueueResult]:
        """:meth:`enqueue_many` for async callers (no I/O here: it runs on the loop at once)."""
        return self.enqueue_many(requests, connection)

    async def aclose(self) -> None:
        """Nothing to release."""

    def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        """Move up to ``request.limit`` runnable jobs to ``running`` under fresh claim tokens."""
        check_weights(request.weights)  # refused before anything is claimed
        if request.limit < 1:
            return ClaimBatch()
        with self._store.lock:
            return self._claim_locked(request, self.clock.now())

    def ack_and_claim(self, acks: Sequence[Ack], request: ClaimRequest) -> tuple[list[bool], ClaimBatch]:
        """:meth:`ack_many` then :meth:`claim` under one hold of the store's lock."""
        check_weights(request.weights)
        stored = self._results(acks)
        with self._store.lock:
            now = self.clock.now()
            settled = self._ack_locked(acks, stored, now)
            return settled, self._claim_locked(request, now) if request.limit >= 1 else ClaimBatch()

    def _claim_locked(self, request: ClaimRequest, now: float) -> ClaimBatch:
        queues = None if request.queues is None else frozenset(request.queues)
        names = None if request.names is None else frozenset(request.names)
        paused = {queue for queue, (is_paused, _, _) in self._store.queues.items() if is_paused}
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
            and job.queue not in paused
        ]
        runnable.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        # Flow-controlled waiting rows are claimed first (within their limits) and only by a
        # claim that asks for them; a lapsed one is taken over like any other, in its slot.
        governed = [job for job in runnable if job.state != "running" and (
            job.flow_key is not None or job.rate_key is not None)]
        plain = [job for job in runnable if job.state == "running" or (
            job.flow_key is None and job.rate_key is None)]
        batch = ClaimBatch()

        def take(jobs: list[_Job]) -> list[_Job]:
            for job in jobs:
                with self._store.changing(job):
                    self._store.set_state(job, "running")
                    job.attempt += 1
                    job.claimed_by = request.worker_id
                    job.visible_at = now + request.visibility_timeout
                    # Random suffix: the same worker re-claiming at the same attempt gets a new token.
                    job.claim_token = f"{request.worker_id}:{job.attempt}:{uuid.uuid4().hex[:12]}"
                    job.started_at = now
                    job.updated_at = now
                batch.append(ClaimedJob(job=job.record(), claim_token=job.claim_token))
            return jobs

        if request.flow:
            decided = self._admit(governed, now, request.limit)
            batch.wake_at, batch.more = decided.wake_at, decided.refused
            picked = set(decided.ids)
            take([job for job in governed if job.id in picked])
        if request.fair:
            take([job for job in plain if job.state == "running"][: request.limit - len(batch)])
            self._claim_fair([job for job in plain if job.state != "running"], request, take,
                             request.limit - len(batch))
        else:
            take(plain[: request.limit - len(batch)])
        batch.sort(key=lambda c: (-c.job.priority, c.job.run_at, c.job.id))
        return batch

    def _claim_fair(self, waiting: list[_Job], request: ClaimRequest, take: Callable[[list[_Job]], list[_Job]],
                    limit: int) -> None:
        """Round-robin by tenant over ``waiting`` (in claim order), from this driver's cursor."""
        if limit <= 0:
            return
        by_tenant: dict[str, list[_Job]] = {}
        for job in waiting:
            by_tenant.setdefault(job.tenant_id or "", []).append(job)
        key = None if request.queues is None else tuple(request.queues)

        def jobs_of(tenant: str, n: int) -> list[_Job]:
            return [job for job in by_tenant[tenant] if job.state != "running"][:n]

        def tenants_from(start: str, n: int) -> list[str]:
            return choose_tenants((t for t, jobs in by_tenant.items() if any(j.state != "running" for j in jobs)),
                                  start, n)

        _, start = fair_claim(tenants_from, jobs_of, take, lambda job: (-job.priority, job.run_at, job.id),
                              self._fair_start.get(key, ""), limit, request.weights)
        if start is not None:
            self._fair_start[key] = start

    def _admit(self, governed: list[_Job], now: float, limit: int) -> Admission:
        """Flow admission over the memory rows (the caller holds the lock, as SQL drivers hold theirs)."""
        running: dict[str, int] = {}
        for job in self._store.jobs.values():
            if job.state == "running" and job.flow_key is not None:
                running[job.flow_key] = running.get(job.flow_key, 0) + 1
        rates = self._store.rates
        empty = [b for b in rates.values() if b.level(now) < WHOLE_TOKEN]

        def open_to(job: _Job) -> bool:
            full = job.flow_key is not None and running.get(job.flow_key, 0) >= (job.flow_max or 1)
            bucket = None if job.rate_key is None else rates.get(job.rate_key)
            return not full and (bucket is None or bucket.level(now) >= WHOLE_TOKEN)

        candidates = [Candidate.of(j) for j in governed if open_to(j)][: scan_size(limit)]
        decided = admit(candidates, running, rates, now, limit)
        for bucket in decided.buckets:
            rates[bucket.key] = bucket
        # As the SQL drivers: a claim that filled its limit needs no wake-up hint.
        wake_at = None if len(decided.ids) >= limit else earliest(decided.wake_at,
                                                                   *(b.next_token(now) for b in empty))
        return Admission(decided.ids, decided.buckets, wake_at, decided.refused)

    def ack(self, job_id: str, claim_token: str, result: Any = None) -> bool:
        """Mark ``done`` with ``result`` if still running under ``claim_token``."""
        return self.ack_many([Ack(job_id, claim_token, result)])[0]

    def ack_many(self, acks: Sequence[Ack]) -> list[bool]:
        """Settle several jobs as ``done`` at once, each fenced on its own token."""
        stored = self._results(acks)
        with self._store.lock:
            return self._ack_locked(acks, stored, self.clock.now())

    @staticmethod
    def _results(acks: Sequence[Ack]) -> list[Any]:
        # Refused before anything is written, as the SQL drivers encode before their statement.
        return [json.loads(result_text(a.result, what=f"result of job {a.job_id}")) for a in acks]

    def _ack_locked(self, acks: Sequence[Ack], stored: list[Any], now: float) -> list[bool]:
        settled: list[bool] = []
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
            with self._store.changing(job):
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
                with self._store.changing(job):
                    self._store.set_state(job, "cancelled")
                    if reason is not None:
                        job.last_error = storable(reason)
                    job.finished_at = now
                    job.updated_at = now
                    # Dropping the token is what makes the running attempt's next heartbeat fail.
                    job.claim_token = None
                    job.visible_at = None
                close_ledger(self._store, job.run_id, job.last_error, now)
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

    def bulk(self, request: BulkRequest) -> BulkBatch:
        """One batch of an operator's bulk action (see the protocol)."""
        return memory_bulk(self._store, request, self._wake)

    def prune(self, older_than: float) -> int:
        """Delete finished jobs finished at or before ``now - older_than``, and their steps."""
        with self._store.lock:
            now = self.clock.now()
            cutoff = now - older_than
            # A bucket back at its burst reads the same as none (see JobDriver.prune).
            for key in [k for k, b in self._store.rates.items() if b.level(now) >= b.burst]:
                del self._store.rates[key]
            doomed = [
                job
                for job in self._store.jobs.values()
                if job.state in FINAL_STATES and job.finished_at is not None and job.finished_at <= cutoff
            ]
            for job in doomed:
                del self._store.jobs[job.id]
                self._store.attempts.pop(job.id, None)
                # A run id is minted with its job and no other job carries it: its steps go too.
                self._store.steps.pop(job.run_id, None)
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
