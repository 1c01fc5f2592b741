"""The PostgreSQL driver's operator tools: bulk actions, queue pause, the audit log.

A bulk batch is ONE statement (queries.sql, ``bulk_*``): it picks its rows with SKIP LOCKED, acts
on them and adds to its audit row, so claims on other rows never wait for it and the audit log
says exactly what was done, even when the operator's process dies midway.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from psycopg import errors as pg_errors

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.filters import filter_params, storable_filter
from ultimat3.drivers.postgres.database import _Database
from ultimat3.drivers.postgres.rows import _Q, Conn, Row, _jsonb, _rows, _tuples, _utc, _utc_or_none
from ultimat3.drivers.protocol import (
    BULK_STATES,
    DEFAULT_LIST_LIMIT,
    JOB_STATES,
    AuditAction,
    AuditEntry,
    AuditStatus,
    BulkBatch,
    BulkRequest,
    JobFilter,
    JobState,
    QueueInfo,
)
from ultimat3.drivers.values import require_text, storable

__all__ = ["PostgresAuditLog", "PostgresQueueControl", "pg_filter", "postgres_bulk"]

# How often a batch is re-run when a concurrent enqueue took a key between its check and its write.
_KEY_RACE_RETRIES = 8


def _time(value: float | None) -> datetime | None:
    return None if value is None else to_datetime(value)


def pg_filter(flt: JobFilter, states: Sequence[JobState] | None = None) -> dict[str, Any]:
    """A job filter as the bind parameters of ``_job_where`` (times as timestamptz)."""
    params = filter_params(flt, states).bind()
    params["since"] = _time(flt.since)
    params["until"] = _time(flt.until)
    return params


def postgres_bulk(db: _Database, request: BulkRequest, now: float, wake: Callable[[Sequence[str]], None]) -> BulkBatch:
    """One batch of a bulk action in one statement (see ``JobDriver.bulk``)."""
    if not storable_filter(request.filter):
        return BulkBatch(touched=(), last_id=None)
    states = [state for state in request.states if state in BULK_STATES[request.action]]
    params = {**pg_filter(request.filter, states), "after": request.after, "as_of": _time(request.as_of),
              "limit": max(0, request.limit), "audit_id": request.audit_id, "now": to_datetime(now),
              "reason": None if request.reason is None else storable(request.reason)}
    query = _Q[f"bulk_{request.action}"]

    def op(conn: Conn, _: bool) -> list[tuple[str, str | None, str | None]]:
        for _attempt in range(_KEY_RACE_RETRIES):
            try:
                return [(row[0], row[1], row[2]) for row in _tuples(conn).execute(query, params).fetchall()]
            except pg_errors.UniqueViolation:
                # A new job took a revived row's key between the check and the write; the batch
                # rolled back whole (autocommit: one statement), and its next run leaves that row.
                continue
        raise DriverError("a bulk retry kept colliding with jobs enqueued under the same keys",
                          "run the command again", code="X_DRIVER_RACE")

    rows = db.run(op)
    touched = sorted((job_id, queue) for kind, job_id, queue in rows if kind == "touched" and job_id is not None)
    last = [job_id for kind, job_id, _ in rows if kind == "last"]
    if request.action == "retry" and touched:
        wake([queue for _, queue in touched if queue is not None])
    return BulkBatch(touched=tuple(job_id for job_id, _ in touched), last_id=last[0] if last else None)


def _entry(row: Row) -> AuditEntry:
    return AuditEntry(id=row["id"], at=_utc(row["at"]), actor=row["actor"], action=row["action"],
                      target=row["target"], touched=int(row["touched"]), status=row["status"],
                      finished_at=_utc_or_none(row["finished_at"]))


def _target(target: dict[str, Any]) -> Any:
    try:
        return _jsonb(target)
    except (TypeError, ValueError) as error:
        raise DriverError(f"audit target {target!r} is not JSON: {error}", "describe the target with JSON values",
                          code="X_AUDIT_TARGET") from error


class PostgresAuditLog:
    """The ``x_audit`` table."""

    def __init__(self, db: _Database) -> None:
        self._db = db

    def open(self, actor: str, action: AuditAction, target: dict[str, Any]) -> AuditEntry:
        """Start an entry (``running``, nothing touched yet)."""
        require_text("X_AUDIT_ACTOR", actor=actor)
        params = {"id": uuid.uuid4().hex, "now": to_datetime(self._db.now()), "actor": actor, "action": action,
                  "target": _target(target)}

        def op(conn: Conn, _: bool) -> Row:
            row = _rows(conn).execute(_Q["audit_open"], params).fetchone()
            assert row is not None  # INSERT ... RETURNING returns its row
            return row

        return _entry(self._db.run(op))

    def close(self, audit_id: str, status: AuditStatus, touched: int | None = None) -> None:
        """End a ``running`` entry with ``status`` (and ``touched`` when given)."""
        params = {"id": audit_id, "status": status, "touched": touched, "now": to_datetime(self._db.now())}
        self._db.run(lambda conn, _: conn.execute(_Q["audit_close"], params))

    def list(self, limit: int = DEFAULT_LIST_LIMIT, action: AuditAction | None = None) -> builtins.list[AuditEntry]:
        """The newest ``limit`` entries (of ``action``)."""
        params = {"action": action, "limit": max(0, limit)}
        return [_entry(row) for row in self._db.run(lambda conn, _: _rows(conn).execute(_Q["audit_list"], params)
                                                    .fetchall())]


class PostgresQueueControl:
    """Queue pause in ``x_queues``; every claim skips the paused ones, a resume NOTIFYs the fleet."""

    def __init__(self, db: _Database, channel: str, on_change: Callable[[str], None] | None = None) -> None:
        self._db = db
        self._channel = channel
        #: Told of every committed change, in this process (the NOTIFY reaches the others).
        self._on_change = on_change

    def _set(self, queue: str, actor: str, paused: bool) -> bool:
        require_text("X_QUEUE_NAME", queue=queue)
        require_text("X_AUDIT_ACTOR", actor=actor)
        params = {"queue": queue, "paused": paused, "actor": actor, "now": to_datetime(self._db.now()),
                  "audit_id": uuid.uuid4().hex, "action": "pause" if paused else "resume",
                  "target": _target({"queue": queue}), "channel": self._channel}

        def op(conn: Conn, _: bool) -> bool:
            with conn.transaction():
                cur = _tuples(conn)
                cur.execute(_Q["queue_lock"], params)
                row = cur.execute(_Q["queue_set"], params).fetchone()
            return bool(row is not None and row[0])

        changed = self._db.run(op)
        if changed and self._on_change is not None:
            self._on_change(queue)
        return changed

    def pause(self, queue: str, actor: str) -> bool:
        """Pause ``queue``; ``False`` when it already was."""
        return self._set(queue, actor, True)

    def resume(self, queue: str, actor: str) -> bool:
        """Resume ``queue`` (the NOTIFY wakes every worker that listens); ``False`` when it was not paused."""
        return self._set(queue, actor, False)

    def paused(self) -> list[str]:
        """The paused queues, by name."""
        rows = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["queues_paused"]).fetchall())
        return [queue for (queue,) in rows]

    def overview(self, window: float = 3600.0) -> builtins.list[QueueInfo]:
        """Every queue that holds a job or has a pause row, by name."""
        now = self._db.now()
        params = {"now": to_datetime(now), "since": to_datetime(now - window)}
        rows = self._db.run(lambda conn, _: _rows(conn).execute(_Q["queue_overview"], params).fetchall())
        return [
            QueueInfo(
                queue=row["queue"], paused=bool(row["paused"]),
                counts={state: int(row[state]) for state in JOB_STATES},
                due=int(row["due"]),
                oldest_due_age=None if row["oldest_due"] is None else max(0.0, now - row["oldest_due"].timestamp()),
                done_recent=int(row["done_recent"]), failed_recent=int(row["failed_recent"]),
                dead_recent=int(row["dead_recent"]),
                changed_at=_utc_or_none(row["changed_at"]), changed_by=row["changed_by"],
            )
            for row in rows
        ]
