"""The memory driver's operator tools: bulk actions, queue pause, the audit log."""

from __future__ import annotations

import builtins
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.filters import matches, storable_filter
from ultimat3.drivers.memory.state import _Job, _Store
from ultimat3.drivers.protocol import (
    BULK_STATES,
    DEFAULT_LIST_LIMIT,
    JOB_STATES,
    LIVE_STATES,
    AuditAction,
    AuditEntry,
    AuditStatus,
    BulkBatch,
    BulkRequest,
    QueueInfo,
)
from ultimat3.drivers.values import json_text, require_text, storable

__all__ = ["MemoryAuditLog", "MemoryQueueControl", "close_ledger", "memory_bulk"]


def _candidates(store: _Store, request: BulkRequest) -> list[_Job]:
    if not storable_filter(request.filter):
        return []
    # Whatever states were asked for, an action never touches a state it is not for.
    states = tuple(state for state in request.states if state in BULK_STATES[request.action])
    rows = sorted(
        (job for job in store.jobs.values()
         if job.id > request.after
         and (request.as_of is None or job.updated_at <= request.as_of)
         and matches(request.filter, queue=job.queue, name=job.name, state=job.state, tenant_id=job.tenant_id,
                     last_error=job.last_error, updated_at=job.updated_at, job_id=job.id, states=states)),
        key=lambda job: job.id,
    )
    return rows[: max(0, request.limit)]


def memory_bulk(store: _Store, request: BulkRequest, wake: Callable[[Sequence[str]], None]) -> BulkBatch:
    """One batch of a bulk action under the store's lock (see ``JobDriver.bulk``)."""
    touched: list[_Job] = []
    with store.lock:
        now = store.clock.now()
        candidates = _candidates(store, request)
        if request.action == "retry":
            # Newest change first, so of two rows under one key the most recent one is revived.
            for job in sorted(candidates, key=lambda j: (-j.updated_at, j.id)):
                key = job.key()
                if key is not None and key in store.live_keys:
                    continue
                store.set_state(job, "ready")
                job.attempt = 0
                job.run_at = now
                job.finished_at = None
                job.claim_token = None
                job.visible_at = None
                job.updated_at = now
                touched.append(job)
        elif request.action == "cancel":
            reason = None if request.reason is None else storable(request.reason)
            for job in candidates:
                with store.changing(job):
                    store.set_state(job, "cancelled")
                    if reason is not None:
                        job.last_error = reason
                    job.finished_at = now
                    job.updated_at = now
                    job.claim_token = None
                    job.visible_at = None
                close_ledger(store, job.run_id, job.last_error, now)
                touched.append(job)
        else:
            for job in candidates:
                if job.state == "running":
                    continue
                store.set_state(job, "cancelled")  # frees its live key before the row goes
                del store.jobs[job.id]
                store.attempts.pop(job.id, None)
                close_ledger(store, job.run_id, "deleted by operator", now)
                store.steps.pop(job.run_id, None)  # its run's steps: no other job carries the run id
                touched.append(job)
        touched.sort(key=lambda job: job.id)
        if request.audit_id is not None and request.audit_id in store.audit:
            store.audit[request.audit_id]["touched"] += len(touched)
    if request.action == "retry":
        wake([job.queue for job in touched])
    return BulkBatch(touched=tuple(job.id for job in touched),
                     last_id=candidates[-1].id if candidates else None)


def close_ledger(store: _Store, run_id: str, error: str | None, now: float) -> None:
    """Close the running ``x_backfills`` row of a cancelled or deleted run (caller holds the lock)."""
    row = store.backfills.get(run_id)
    if row is not None and row.status in ("running", "paused"):
        row.status = "cancelled"
        row.error = error
        row.finished_at = now
        row.throttle = None


def _audit_row(store: _Store, actor: str, action: AuditAction, target: dict[str, Any], *, touched: int,
               status: AuditStatus, finished: bool) -> dict[str, Any]:
    now = store.clock.now()
    row = {"id": uuid.uuid4().hex, "at": now, "actor": actor, "action": action,
           "target": json.loads(json_text(target, what="audit target", code="X_AUDIT_TARGET",
                                          hint="describe the target with JSON values")),
           "touched": touched, "status": status, "finished_at": now if finished else None,
           "seq": len(store.audit)}
    store.audit[row["id"]] = row
    return row


def _entry(row: dict[str, Any]) -> AuditEntry:
    return AuditEntry(id=row["id"], at=to_datetime(row["at"]), actor=row["actor"], action=row["action"],
                      target=json.loads(json.dumps(row["target"])), touched=row["touched"], status=row["status"],
                      finished_at=None if row["finished_at"] is None else to_datetime(row["finished_at"]))


class MemoryAuditLog:
    """The audit log as a dict, newest first by insertion."""

    def __init__(self, store: _Store) -> None:
        self._store = store

    def open(self, actor: str, action: AuditAction, target: dict[str, Any]) -> AuditEntry:
        """Start an entry (``running``, nothing touched yet)."""
        require_text("X_AUDIT_ACTOR", actor=actor)
        with self._store.lock:
            return _entry(_audit_row(self._store, actor, action, target, touched=0, status="running",
                                     finished=False))

    def close(self, audit_id: str, status: AuditStatus, touched: int | None = None) -> None:
        """End a ``running`` entry with ``status`` (and ``touched`` when given)."""
        with self._store.lock:
            row = self._store.audit.get(audit_id)
            if row is not None and row["status"] == "running":
                row["status"] = status
                if touched is not None:
                    row["touched"] = touched
                row["finished_at"] = self._store.clock.now()

    def list(self, limit: int = DEFAULT_LIST_LIMIT, action: AuditAction | None = None) -> builtins.list[AuditEntry]:
        """The newest ``limit`` entries (of ``action``)."""
        with self._store.lock:
            rows = [row for row in self._store.audit.values() if action is None or row["action"] == action]
            rows.sort(key=lambda row: (row["at"], row["seq"]), reverse=True)
            return [_entry(row) for row in rows[: max(0, limit)]]


class MemoryQueueControl:
    """Queue pause in a dict; the claim skips paused queues."""

    def __init__(self, store: _Store, wake: Callable[[Sequence[str]], None]) -> None:
        self._store = store
        self._wake = wake

    def _set(self, queue: str, actor: str, paused: bool) -> bool:
        require_text("X_QUEUE_NAME", queue=queue)
        require_text("X_AUDIT_ACTOR", actor=actor)
        with self._store.lock:
            now = self._store.clock.now()
            was = self._store.queues.get(queue, (False, now, actor))[0]
            changed = was != paused
            if changed:
                self._store.queues[queue] = (paused, now, actor)
            _audit_row(self._store, actor, "pause" if paused else "resume", {"queue": queue},
                       touched=int(changed), status="completed", finished=True)
        if changed and not paused:
            self._wake([queue])
        return changed

    def pause(self, queue: str, actor: str) -> bool:
        """Pause ``queue``; ``False`` when it already was."""
        return self._set(queue, actor, True)

    def resume(self, queue: str, actor: str) -> bool:
        """Resume ``queue`` and wake its workers; ``False`` when it was not paused."""
        return self._set(queue, actor, False)

    def paused(self) -> list[str]:
        """The paused queues, by name."""
        with self._store.lock:
            return sorted(queue for queue, (paused, _, _) in self._store.queues.items() if paused)

    def overview(self, window: float = 3600.0) -> builtins.list[QueueInfo]:
        """Every queue that holds a job or has a pause row, by name."""
        with self._store.lock:
            now = self._store.clock.now()
            since = now - window
            names = {job.queue for job in self._store.jobs.values()} | set(self._store.queues)
            infos = []
            for queue in sorted(names):
                jobs = [job for job in self._store.jobs.values() if job.queue == queue]
                counts: dict[str, int] = dict.fromkeys(JOB_STATES, 0)
                for job in jobs:
                    counts[job.state] += 1
                due = [job.run_at for job in jobs if job.state in LIVE_STATES - {"running"} and job.run_at <= now]
                paused, changed_at, changed_by = self._store.queues.get(queue, (False, None, None))
                infos.append(QueueInfo(
                    queue=queue, paused=paused, counts=counts, due=len(due),
                    oldest_due_age=max(0.0, now - min(due)) if due else None,
                    done_recent=sum(1 for j in jobs if j.state == "done" and (j.finished_at or 0) >= since),
                    failed_recent=sum(1 for j in jobs if j.state == "ready" and j.attempt > 0
                                      and j.last_error is not None and j.updated_at >= since),
                    dead_recent=sum(1 for j in jobs if j.state == "dead" and (j.finished_at or 0) >= since),
                    changed_at=None if changed_at is None else to_datetime(changed_at),
                    changed_by=changed_by,
                ))
            return infos
