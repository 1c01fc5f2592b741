"""The SQLite driver's operator tools: bulk actions, queue pause, the audit log.

Each batch or pause runs in one ``BEGIN IMMEDIATE`` transaction with its audit row, so what the
log says a bulk action touched is what it touched, even when the process is killed midway.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import uuid
from typing import TYPE_CHECKING, Any

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.filters import storable_filter
from ultimat3.drivers.protocol import (
    BULK_STATES,
    DEFAULT_LIST_LIMIT,
    JOB_STATES,
    AuditAction,
    AuditEntry,
    AuditStatus,
    BulkBatch,
    BulkRequest,
    QueueInfo,
)
from ultimat3.drivers.sqlite.rows import QUERIES, sqlite_filter
from ultimat3.drivers.values import json_text, require_text, storable

if TYPE_CHECKING:
    from ultimat3.drivers.sqlite.driver import SqliteDriver

__all__ = ["SqliteAuditLog", "SqliteQueueControl", "audit_switch", "sqlite_bulk"]

_DELETED = "deleted by operator"


def sqlite_bulk(driver: SqliteDriver, request: BulkRequest) -> BulkBatch:
    """One batch of a bulk action in one write transaction (see ``JobDriver.bulk``)."""
    if not storable_filter(request.filter):
        return BulkBatch(touched=(), last_id=None)
    states = tuple(state for state in request.states if state in BULK_STATES[request.action])
    params = {**sqlite_filter(request.filter, states), "after": request.after, "as_of": request.as_of,
              "limit": max(0, request.limit)}

    def run(conn: sqlite3.Connection, now: float) -> tuple[list[tuple[str, str]], str | None]:
        candidates = conn.execute(QUERIES["bulk_candidates"], params).fetchall()
        last_id = candidates[-1]["id"] if candidates else None
        if request.action == "retry":
            ids = _revivable(conn, candidates)
            rows = conn.execute(QUERIES["bulk_retry"], {"ids": json.dumps(ids), "now": now}).fetchall()
            touched = [(row["id"], row["queue"]) for row in rows]
        elif request.action == "cancel":
            reason = None if request.reason is None else storable(request.reason)
            rows = conn.execute(QUERIES["bulk_cancel"], {"ids": json.dumps([c["id"] for c in candidates]),
                                                        "reason": reason, "now": now}).fetchall()
            _close_ledger(conn, [(row["run_id"], row["last_error"]) for row in rows], now)
            touched = [(row["id"], row["queue"]) for row in rows]
        else:
            rows = conn.execute(QUERIES["bulk_delete"], {"ids": json.dumps([c["id"] for c in candidates])}).fetchall()
            run_ids = sorted({row["run_id"] for row in rows})
            if run_ids:
                conn.execute(QUERIES["prune_delete_steps"], {"run_ids": json.dumps(run_ids)})
            _close_ledger(conn, [(run_id, _DELETED) for run_id in run_ids], now)
            touched = [(row["id"], row["queue"]) for row in rows]
        if request.audit_id is not None and touched:
            conn.execute(QUERIES["audit_touched"], {"id": request.audit_id, "touched": len(touched)})
        return touched, last_id

    touched, last_id = driver._write(run)
    if request.action == "retry":
        driver._notify(queue for _, queue in touched)
    return BulkBatch(touched=tuple(sorted(job_id for job_id, _ in touched)), last_id=last_id)


def _revivable(conn: sqlite3.Connection, candidates: list[sqlite3.Row]) -> list[str]:
    """The candidates a retry may revive: not under a key a live job holds, one per key (the most
    recently changed), as the live-key unique index demands."""
    chosen: list[str] = []
    taken: set[tuple[str, str]] = set()
    for row in sorted(candidates, key=lambda r: (-r["updated_at"], r["id"])):
        key = row["idempotency_key"]
        if key is not None:
            if (row["name"], key) in taken:
                continue
            live = conn.execute(QUERIES["job_live_by_key"], {"name": row["name"], "idempotency_key": key}).fetchone()
            if live is not None:
                continue
            taken.add((row["name"], key))
        chosen.append(row["id"])
    return chosen


def _close_ledger(conn: sqlite3.Connection, closed: list[tuple[str, str | None]], now: float) -> None:
    if closed:
        conn.execute(QUERIES["bulk_ledger_close"], {"closed": json.dumps(closed), "now": now})


def _target_text(target: dict[str, Any]) -> str:
    return json_text(target, what="audit target", code="X_AUDIT_TARGET", hint="describe the target with JSON values")


def audit_switch(conn: sqlite3.Connection, now: float, actor: str, paused: bool, target: str, changed: bool) -> None:
    """The audit row of a pause or resume (of a queue or a schedule), in the caller's transaction."""
    conn.execute(QUERIES["audit_insert"], {
        "id": uuid.uuid4().hex, "now": now, "actor": actor, "action": "pause" if paused else "resume",
        "target": target, "touched": int(changed), "status": "completed", "finished_at": now})


def _entry(row: sqlite3.Row) -> AuditEntry:
    return AuditEntry(id=row["id"], at=to_datetime(row["at"]), actor=row["actor"], action=row["action"],
                      target=json.loads(row["target"]), touched=row["touched"], status=row["status"],
                      finished_at=None if row["finished_at"] is None else to_datetime(row["finished_at"]))


class SqliteAuditLog:
    """The ``x_audit`` table."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver

    def open(self, actor: str, action: AuditAction, target: dict[str, Any]) -> AuditEntry:
        """Start an entry (``running``, nothing touched yet)."""
        require_text("X_AUDIT_ACTOR", actor=actor)
        params = {"id": uuid.uuid4().hex, "actor": actor, "action": action, "target": _target_text(target),
                  "touched": 0, "status": "running", "finished_at": None}

        def run(conn: sqlite3.Connection, now: float) -> sqlite3.Row:
            conn.execute(QUERIES["audit_insert"], {**params, "now": now})
            row: sqlite3.Row = conn.execute(QUERIES["audit_get"], {"id": params["id"]}).fetchone()
            return row

        return _entry(self._driver._write(run))

    def close(self, audit_id: str, status: AuditStatus, touched: int | None = None) -> None:
        """End a ``running`` entry with ``status`` (and ``touched`` when given)."""
        params = {"id": audit_id, "status": status, "touched": touched}
        self._driver._write(lambda conn, now: conn.execute(QUERIES["audit_close"], {**params, "now": now}))

    def list(self, limit: int = DEFAULT_LIST_LIMIT, action: AuditAction | None = None) -> builtins.list[AuditEntry]:
        """The newest ``limit`` entries (of ``action``)."""
        return [_entry(row) for row in self._driver._rows("audit_list", {"action": action, "limit": max(0, limit)})]


class SqliteQueueControl:
    """Queue pause in ``x_queues``; every claim skips the paused ones."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver

    def _set(self, queue: str, actor: str, paused: bool) -> bool:
        require_text("X_QUEUE_NAME", queue=queue)
        require_text("X_AUDIT_ACTOR", actor=actor)
        target = _target_text({"queue": queue})

        def run(conn: sqlite3.Connection, now: float) -> bool:
            row = conn.execute(QUERIES["queue_get"], {"queue": queue}).fetchone()
            changed = bool(row["paused"]) != paused if row is not None else paused
            if changed:
                conn.execute(QUERIES["queue_set"], {"queue": queue, "paused": int(paused), "now": now, "actor": actor})
            audit_switch(conn, now, actor, paused, target, changed)
            return changed

        changed = self._driver._write(run)
        if changed and not paused:
            self._driver._notify([queue])
        return changed

    def pause(self, queue: str, actor: str) -> bool:
        """Pause ``queue``; ``False`` when it already was."""
        return self._set(queue, actor, True)

    def resume(self, queue: str, actor: str) -> bool:
        """Resume ``queue`` and wake this process's workers; ``False`` when it was not paused."""
        return self._set(queue, actor, False)

    def paused(self) -> list[str]:
        """The paused queues, by name."""
        return [row["queue"] for row in self._driver._rows("queues_paused")]

    def overview(self, window: float = 3600.0) -> builtins.list[QueueInfo]:
        """Every queue that holds a job or has a pause row, by name."""
        now = self._driver.clock.now()
        rows = self._driver._rows("queue_overview", {"now": now, "since": now - window})
        return [
            QueueInfo(
                queue=row["queue"], paused=bool(row["paused"]),
                counts={state: int(row[state]) for state in JOB_STATES},
                due=int(row["due"]),
                oldest_due_age=None if row["oldest_due"] is None else max(0.0, now - row["oldest_due"]),
                done_recent=int(row["done_recent"]), failed_recent=int(row["failed_recent"]),
                dead_recent=int(row["dead_recent"]),
                changed_at=None if row["changed_at"] is None else to_datetime(row["changed_at"]),
                changed_by=row["changed_by"],
            )
            for row in rows
        ]
