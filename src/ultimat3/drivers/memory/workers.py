"""The memory driver's worker registry: rows under the store's lock, liveness a flag (one process)."""

from __future__ import annotations

import builtins

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.memory.state import _Store, _Worker
from ultimat3.drivers.protocol import RescuedJob, WorkerInfo, WorkerRecord
from ultimat3.drivers.workers import id_taken, lost_error, running_by_worker, unknown_worker

__all__ = ["MemoryWorkerRegistry"]


class MemoryWorkerRegistry:
    """:class:`~ultimat3.drivers.protocol.WorkerRegistry` in memory."""

    def __init__(self, store: _Store) -> None:
        self._store = store
        self._mine: dict[str, WorkerInfo] = {}

    def register(self, info: WorkerInfo) -> None:
        """Enter the worker with its liveness flag up."""
        with self._store.lock:
            row = self._store.workers.get(info.id)
            if row is not None and row.alive:
                raise id_taken(info.id)
            now = self._store.clock.now()
            self._store.workers[info.id] = _Worker(
                id=info.id, host=info.host, pid=info.pid, concurrency=info.concurrency, queues=info.queues,
                started_at=now if row is None else row.started_at, last_seen_at=now,
            )
            self._mine[info.id] = info

    def beat(self, worker_id: str, clock_offset: float | None = None, wakeups: str | None = None) -> bool:
        """Record the worker as seen now; re-register it when its row or flag was lost."""
        with self._store.lock:
            row = self._store.workers.get(worker_id)
            if row is not None and row.alive and worker_id in self._mine:
                row.last_seen_at = self._store.clock.now()
                row.clock_offset = clock_offset
                row.wakeups = wakeups
                return True
        info = self._mine.get(worker_id)
        if info is None:
            raise unknown_worker(worker_id)
        self.register(info)
        with self._store.lock:
            self._store.workers[worker_id].clock_offset = clock_offset
            self._store.workers[worker_id].wakeups = wakeups
        return False

    def unregister(self, worker_id: str) -> None:
        """Remove the row and forget the worker."""
        with self._store.lock:
            if self._mine.pop(worker_id, None) is not None:
                self._store.workers.pop(worker_id, None)

    def abandon(self, worker_id: str) -> None:
        """Drop the liveness flag, keep the row: what a death looks like."""
        with self._store.lock:
            if self._mine.pop(worker_id, None) is not None:
                row = self._store.workers.get(worker_id)
                if row is not None:
                    row.alive = False

    def list(self) -> list[WorkerRecord]:
        """Every registered worker by id, with the jobs it runs."""
        with self._store.lock:
            running = running_by_worker(sorted(
                (job.claimed_by, job.id) for job in self._store.jobs.values()
                if job.state == "running" and job.claimed_by is not None
            ))
            return [
                WorkerRecord(
                    id=row.id, host=row.host, pid=row.pid, concurrency=row.concurrency, queues=row.queues,
                    started_at=to_datetime(row.started_at), last_seen_at=to_datetime(row.last_seen_at),
                    alive=row.alive,
                    why="registered in this process" if row.alive else "its process let go of it",
                    running=running.get(row.id, ()), clock_offset=row.clock_offset,
                    wakeups=row.wakeups,
                )
                for row in sorted(self._store.workers.values(), key=lambda r: r.id)
            ]

    def rescue(self, worker_id: str) -> builtins.list[RescuedJob]:
        """Put the running jobs of dead workers back to ready and remove their rows."""
        with self._store.lock:
            dead = {row.id for row in self._store.workers.values() if not row.alive and row.id != worker_id}
            if not dead:
                return []
            now = self._store.clock.now()
            rescued: list[RescuedJob] = []
            for job in sorted(self._store.jobs.values(), key=lambda j: j.id):
                if job.state == "running" and job.claimed_by in dead:
                    rescued.append(RescuedJob(job.id, job.queue, job.claimed_by))
                    with self._store.changing(job):
                        self._store.set_state(job, "ready")
                        job.claim_token = None
                        job.visible_at = None
                        job.claimed_by = None
                        job.last_error = lost_error(rescued[-1].worker_id)
                        job.updated_at = now
            for dead_id in dead:
                del self._store.workers[dead_id]
            return rescued


