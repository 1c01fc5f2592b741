"""The PostgreSQL driver's schedule store: each tick fires once across the fleet.

:meth:`PostgresScheduleStore.fire` moves ``last_tick`` up with a compare-and-set UPDATE and
enqueues the tick's job in the same transaction. Two workers bringing the same tick serialise on
the row lock; the second one's UPDATE then matches no row (``last_tick`` is no longer earlier), so
it enqueues nothing. A connection lost after the commit is retried by ``_Database.run`` and finds
the tick already fired: still once.
"""

from __future__ import annotations

import builtins
import uuid
from typing import TYPE_CHECKING

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.postgres.operations import _target
from ultimat3.drivers.postgres.rows import _Q, Conn, Row, _rows, _tuples, _utc, _utc_or_none
from ultimat3.drivers.protocol import EnqueueRequest, Fired, ScheduleRecord
from ultimat3.drivers.values import require_text

if TYPE_CHECKING:
    from ultimat3.drivers.postgres.driver import PostgresDriver

__all__ = ["PostgresScheduleStore"]


def _record(row: Row) -> ScheduleRecord:
    return ScheduleRecord(key=row["key"], last_tick=_utc(row["last_tick"]), paused=bool(row["paused"]),
                          updated_at=_utc(row["updated_at"]), last_job_id=row["last_job_id"],
                          changed_at=_utc_or_none(row["changed_at"]), changed_by=row["changed_by"])


class PostgresScheduleStore:
    """The ``x_schedules`` table."""

    def __init__(self, driver: PostgresDriver) -> None:
        self._driver = driver

    def register(self, key: str, start: float) -> ScheduleRecord:
        """The row of ``key``, created with ``last_tick = start`` when absent."""
        require_text("X_SCHEDULE_KEY", key=key)
        params = {"key": key, "start": to_datetime(start), "now": to_datetime(self._driver.clock.now())}

        def op(conn: Conn, _: bool) -> Row:
            cur = _rows(conn)
            cur.execute(_Q["schedule_register"], params)
            row = cur.execute(_Q["schedule_get"], params).fetchone()
            assert row is not None  # inserted or already there; rows are never deleted
            return row

        return _record(self._driver._db.run(op))

    def fire(self, key: str, tick: float, request: EnqueueRequest | None) -> Fired | None:
        """Compare-and-set ``last_tick`` to ``tick`` and enqueue ``request``, in one transaction."""
        from ultimat3.drivers.postgres.driver import _Staged

        staged = None if request is None else _Staged(request, self._driver.clock.now())
        params = {"key": key, "tick": to_datetime(tick), "now": to_datetime(self._driver.clock.now())}

        def op(conn: Conn, _: bool) -> Fired | None:
            with conn.transaction():
                row = _tuples(conn).execute(_Q["schedule_advance"], params).fetchone()
                if row is None:
                    return None
                if row[0] or staged is None:  # paused, or a skipped tick: passed, nothing runs
                    return Fired(tick=tick, job=None)
                result = self._driver._enqueue_one(conn, staged, retrying=False)
                conn.execute(_Q["schedule_job"], {"key": key, "job_id": result.id})
            return Fired(tick=tick, job=result)

        fired = self._driver._db.run(op)
        if fired is not None and fired.job is not None and not fired.job.deduped and request is not None:
            self._driver._wake([request.queue])
        return fired

    def get(self, key: str) -> ScheduleRecord | None:
        """One schedule's row."""
        row = self._driver._db.run(lambda conn, _: _rows(conn).execute(_Q["schedule_get"], {"key": key}).fetchone())
        return None if row is None else _record(row)

    def set_paused(self, key: str, paused: bool, actor: str) -> bool:
        """Pause or resume ``key`` (audited); whether it changed."""
        require_text("X_SCHEDULE_KEY", key=key)
        require_text("X_AUDIT_ACTOR", actor=actor)
        params = {"key": key, "paused": paused, "actor": actor, "now": to_datetime(self._driver.clock.now()),
                  "audit_id": uuid.uuid4().hex, "action": "pause" if paused else "resume",
                  "target": _target({"schedule": key})}
        row = self._driver._db.run(
            lambda conn, _: _tuples(conn).execute(_Q["schedule_set_paused"], params).fetchone())
        return bool(row is not None and row[0])

    def list(self) -> builtins.list[ScheduleRecord]:
        """Every schedule row, by key."""
        rows = self._driver._db.run(lambda conn, _: _rows(conn).execute(_Q["schedules_list"]).fetchall())
        return [_record(row) for row in rows]
