"""The memory driver's schedule store: the compare-and-set and the enqueue under one lock."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.memory.operations import _audit_row
from ultimat3.drivers.memory.state import _Store
from ultimat3.drivers.protocol import EnqueueRequest, EnqueueResult, Fired, ScheduleRecord
from ultimat3.drivers.values import require_text

__all__ = ["MemoryScheduleStore"]


def _record(row: dict[str, Any]) -> ScheduleRecord:
    return ScheduleRecord(key=row["key"], last_tick=to_datetime(row["last_tick"]), paused=row["paused"],
                          updated_at=to_datetime(row["updated_at"]), last_job_id=row["last_job_id"],
                          changed_at=None if row["changed_at"] is None else to_datetime(row["changed_at"]),
                          changed_by=row["changed_by"])


class MemoryScheduleStore:
    """Schedule rows in a dict. Fires are serialised by the store's ``fire_lock``: the compare, the
    driver's own enqueue (which takes the store lock itself) and the set happen as one step."""

    def __init__(self, store: _Store, enqueue: Callable[[Sequence[EnqueueRequest]], list[EnqueueResult]]) -> None:
        self._store = store
        self._enqueue = enqueue

    def _new(self, key: str, start: float, now: float) -> dict[str, Any]:
        return {"key": key, "last_tick": start, "paused": False, "updated_at": now, "last_job_id": None,
                "changed_at": None, "changed_by": None}

    def register(self, key: str, start: float) -> ScheduleRecord:
        """The row of ``key``, created with ``last_tick = start`` when absent."""
        require_text("X_SCHEDULE_KEY", key=key)
        with self._store.lock:
            row = self._store.schedules.setdefault(key, self._new(key, start, self._store.clock.now()))
            return _record(row)

    def fire(self, key: str, tick: float, request: EnqueueRequest | None) -> Fired | None:
        """Compare-and-set ``last_tick`` to ``tick`` and enqueue ``request``, all or nothing."""
        with self._store.fire_lock:
            with self._store.lock:
                row = self._store.schedules.get(key)
                if row is None or row["last_tick"] >= tick:
                    return None
                paused = row["paused"]
            result = None
            if not paused and request is not None:
                result = self._enqueue([request])[0]  # raises before anything is written: nothing moves
            with self._store.lock:
                row["last_tick"] = tick
                row["updated_at"] = self._store.clock.now()
                row["last_job_id"] = None if result is None else result.id
            return Fired(tick=tick, job=result)

    def get(self, key: str) -> ScheduleRecord | None:
        """One schedule's row."""
        with self._store.lock:
            row = self._store.schedules.get(key)
            return None if row is None else _record(row)

    def set_paused(self, key: str, paused: bool, actor: str) -> bool:
        """Pause or resume ``key`` (audited); whether it changed."""
        require_text("X_SCHEDULE_KEY", key=key)
        require_text("X_AUDIT_ACTOR", actor=actor)
        with self._store.lock:
            now = self._store.clock.now()
            row = self._store.schedules.setdefault(key, self._new(key, now, now))
            changed: bool = row["paused"] != paused
            if changed:
                row.update(paused=paused, changed_at=now, changed_by=actor)
            _audit_row(self._store, actor, "pause" if paused else "resume", {"schedule": key},
                       touched=int(changed), status="completed", finished=True)
            return changed

    def list(self) -> builtins.list[ScheduleRecord]:
        """Every schedule row, by key."""
        with self._store.lock:
            return [_record(self._store.schedules[key]) for key in sorted(self._store.schedules)]
