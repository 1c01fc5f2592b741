"""The SQLite driver's schedule store: each tick fires once across every process on the file.

:meth:`SqliteScheduleStore.fire` runs under ``BEGIN IMMEDIATE``: the compare-and-set on
``last_tick`` and the tick's enqueue commit together, and the write lock lets one process at a time
through, so a second process bringing the same tick finds it fired.
"""

from __future__ import annotations

import builtins
import sqlite3
from typing import TYPE_CHECKING

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.protocol import EnqueueRequest, Fired, ScheduleRecord
from ultimat3.drivers.sqlite.operations import _target_text, audit_switch
from ultimat3.drivers.sqlite.rows import QUERIES
from ultimat3.drivers.staging import stage
from ultimat3.drivers.values import require_text

if TYPE_CHECKING:
    from ultimat3.drivers.sqlite.driver import SqliteDriver

__all__ = ["SqliteScheduleStore"]


def _record(row: sqlite3.Row) -> ScheduleRecord:
    return ScheduleRecord(key=row["key"], last_tick=to_datetime(row["last_tick"]), paused=bool(row["paused"]),
                          updated_at=to_datetime(row["updated_at"]), last_job_id=row["last_job_id"],
                          changed_at=None if row["changed_at"] is None else to_datetime(row["changed_at"]),
                          changed_by=row["changed_by"])


class SqliteScheduleStore:
    """The ``x_schedules`` table."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver

    def register(self, key: str, start: float) -> ScheduleRecord:
        """The row of ``key``, created with ``last_tick = start`` when absent."""
        require_text("X_SCHEDULE_KEY", key=key)

        def run(conn: sqlite3.Connection, now: float) -> sqlite3.Row:
            conn.execute(QUERIES["schedule_register"], {"key": key, "start": start, "now": now})
            row: sqlite3.Row = conn.execute(QUERIES["schedule_get"], {"key": key}).fetchone()
            return row

        return _record(self._driver._write(run))

    def fire(self, key: str, tick: float, request: EnqueueRequest | None) -> Fired | None:
        """Compare-and-set ``last_tick`` to ``tick`` and enqueue ``request``, in one transaction."""
        from ultimat3.drivers.sqlite.driver import _insert_jobs

        staged = None if request is None else stage(request)

        def run(conn: sqlite3.Connection, now: float) -> Fired | None:
            row = conn.execute(QUERIES["schedule_advance"], {"key": key, "tick": tick, "now": now}).fetchone()
            if row is None:
                return None
            if row["paused"] or staged is None:
                return Fired(tick=tick, job=None)
            [result] = _insert_jobs(conn, [staged], now)
            conn.execute(QUERIES["schedule_job"], {"key": key, "job_id": result.id})
            return Fired(tick=tick, job=result)

        fired = self._driver._write(run)
        if fired is not None and fired.job is not None and not fired.job.deduped and request is not None:
            self._driver._notify([request.queue])
        return fired

    def get(self, key: str) -> ScheduleRecord | None:
        """One schedule's row."""
        rows = self._driver._rows("schedule_get", {"key": key})
        return _record(rows[0]) if rows else None

    def set_paused(self, key: str, paused: bool, actor: str) -> bool:
        """Pause or resume ``key`` (audited); whether it changed."""
        require_text("X_SCHEDULE_KEY", key=key)
        require_text("X_AUDIT_ACTOR", actor=actor)
        target = _target_text({"schedule": key})

        def run(conn: sqlite3.Connection, now: float) -> bool:
            row = conn.execute(QUERIES["schedule_get"], {"key": key}).fetchone()
            params = {"key": key, "paused": int(paused), "actor": actor, "now": now}
            if row is None:
                conn.execute(QUERIES["schedule_insert_paused"], params)
                changed = paused
            else:
                changed = bool(row["paused"]) != paused
                if changed:
                    conn.execute(QUERIES["schedule_update_paused"], params)
            audit_switch(conn, now, actor, paused, target, changed)
            return changed

        return self._driver._write(run)

    def list(self) -> builtins.list[ScheduleRecord]:
        """Every schedule row, by key."""
        return [_record(row) for row in self._driver._rows("schedules_list")]
