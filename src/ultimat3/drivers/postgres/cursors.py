"""Claim cursors: where a claimer's next claim starts, so no claim walks what earlier jobs left.

While a transaction holds the database's oldest snapshot, VACUUM removes no row version newer than
it, and every claimed job leaves an index entry at its old place in claim order that no scan may
kill. A claim that walks the claim index from its head steps over all of them: its cost grows
with every job processed since the pin. So a claimer remembers, per queue (and per name filter),
the claim-order key of the first row its last claim could see (locked or not), and starts its next
walk there at that priority; other priorities are walked from their own head (a one-priority queue
has none). What could land behind the cursor is brought back to it:

- a job enqueued, or rescued from a dead worker, with an earlier ``run_at`` than the cursor (a
  caller's transaction that committed late, an explicit past ``run_at``): its NOTIFY payload (a
  *ready notice*: queue, priority, ``run_at``) moves the cursor back to it, in every process that
  listens; this process's own enqueues do so directly;
- a queue resumed, or a LISTEN connection re-established (anything may have been missed): the next
  claim of the queue walks from the head (a *rescan notice*);
- a row another transaction held locked while the claim passed: the cursor stays at the first row
  the claim could see, so the next claim looks at it again; after :data:`STUCK` seconds the cursor
  passes it and every claim looks it up by primary key until the next walk from the head;
- anything else: every :data:`CATCH_UP` seconds a claim walks from the head anyway, and every
  :data:`~ultimat3.drivers.protocol.CLAIM_STARVATION_BOUND` seconds when this driver does not
  hear NOTIFY (nothing subscribed, or a transaction-mode pooler in the way): then no notice comes.

Lapsed claims (running rows whose visibility ran out) are looked for by a statement of their own,
at most every :data:`LAPSE_EVERY` seconds (sooner when the claim's own visibility is shorter),
over ``visible_at`` from the previous look on; every :data:`LAPSE_FULL_EVERY` seconds from the start.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.protocol import CLAIM_STARVATION_BOUND

__all__ = [
    "CATCH_UP",
    "LAPSE_EVERY",
    "LAPSE_FULL_EVERY",
    "MAX_PASSED",
    "STUCK",
    "ClaimCursors",
    "ClaimPlan",
    "parse_notice",
]

#: Seconds between two claims from the head of the claim order while notices arrive (a safety net:
#: every way a job becomes runnable announces itself).
CATCH_UP = 30.0
#: Rows passed while held locked that claims keep looking up by primary key (oldest dropped).
MAX_PASSED = 100
#: A row seen first by claims for this long without being claimable is passed by the cursor.
STUCK = 1.0
#: At most this long between two looks for lapsed claims (and never longer than the claim's own
#: visibility timeout).
LAPSE_EVERY = 1.0
#: Seconds between two looks for lapsed claims over the whole index rather than since the last look.
LAPSE_FULL_EVERY = 60.0
#: How far before the previous look a floored look for lapsed claims starts (clocks of the fleet
#: agree to well within this; see ReferenceClock).
LAPSE_OVERLAP = 1.0
#: Record separator: starts every structured notice (a queue name cannot be told apart otherwise).
RS = "\x1e"
_MINUS_INFINITY = datetime.min.replace(tzinfo=to_datetime(0.0).tzinfo)

Key = tuple[str, str | None, tuple[str, ...] | None]


@dataclass
class _Cursor:
    queue: str | None
    priority: int | None = None
    run_at: datetime | None = None
    id: str = ""
    catch_up_at: float = 0.0
    seen: tuple[int, datetime, str] | None = None
    seen_since: float = 0.0
    lapse_at: float = 0.0
    lapse_floor: datetime | None = None
    lapse_full_at: float = 0.0
    passed: dict[str, None] | None = None


@dataclass(frozen=True)
class ClaimPlan:
    """What one claim runs: the waiting statement and its cursor parameters, the passed rows to
    look up by primary key, and whether (and from where) to look for lapsed claims first."""

    key: Key
    query: str
    params: dict[str, Any]
    passed: list[str]
    lapsed_floor: datetime
    look_for_lapsed: bool


def parse_notice(payload: str) -> tuple[str, str, int | None, datetime | None]:
    """``(kind, queue, priority, run_at)`` of a NOTIFY payload: ``J`` (jobs ready at a key), ``R``
    (rescan the queue), or ``Q`` for a plain queue name (``*``: every queue)."""
    if payload.startswith(RS):
        parts = payload.split(RS, 4)
        if len(parts) == 5 and parts[1] == "J":
            try:
                return "J", parts[4], int(parts[2]), to_datetime(int(parts[3]) / 1000.0)
            except ValueError:
                pass
        parts = payload.split(RS, 2)
        if len(parts) == 3 and parts[1] == "R":
            return "R", parts[2], None, None
    return "Q", payload, None, None


def _forget(cursor: _Cursor, ids: Iterable[str]) -> None:
    """Claimed rows are no longer passed ones."""
    if cursor.passed:
        for job_id in ids:
            cursor.passed.pop(job_id, None)


class ClaimCursors:
    """Every cursor of one driver (thread-safe); see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cursors: dict[Key, _Cursor] = {}

    def plan(self, queues: list[str] | None, names: list[str] | None, now: float, visibility: float, *,
             heard: bool) -> ClaimPlan:
        """Which statement the next claim for these queues and names runs, and from where.
        ``heard``: notices reach this driver (its LISTEN connection is proven)."""
        one = queues[0] if queues is not None and len(queues) == 1 else None
        kind = "any" if queues is None else ("queue" if one is not None else "queues")
        key: Key = (kind, one if queues is None or one is not None else "\x00".join(queues),
                    None if names is None else tuple(names))
        with self._lock:
            cursor = self._cursors.get(key)
            if cursor is None:
                cursor = self._cursors[key] = _Cursor(queue=one)
            look = now >= cursor.lapse_at
            floor: datetime | None = None
            if look:
                if now < cursor.lapse_full_at and cursor.lapse_floor is not None:
                    floor = cursor.lapse_floor
                else:
                    cursor.lapse_full_at = now + LAPSE_FULL_EVERY
                cursor.lapse_floor = to_datetime(now - LAPSE_OVERLAP)
                cursor.lapse_at = now + min(LAPSE_EVERY, visibility)
            params: dict[str, Any] = {}
            passed: list[str] = []
            if kind == "queues":
                query = "claim_queues"
            elif cursor.priority is None or cursor.run_at is None or now >= cursor.catch_up_at:
                query = "claim_any" if kind == "any" else "claim_queue"
                cursor.catch_up_at = now + (CATCH_UP if heard else CLAIM_STARVATION_BOUND)
                cursor.passed = None
            else:
                query = "claim_any_from" if kind == "any" else "claim_queue_from"
                params.update(c_priority=cursor.priority, c_run_at=cursor.run_at, c_id=cursor.id)
                passed = list(cursor.passed or ())
        return ClaimPlan(key, query, params, passed, floor if floor is not None else _MINUS_INFINITY, look)

    def claimed(self, plan: ClaimPlan, head: tuple[int, datetime, str] | None,
                first: tuple[int, datetime, str] | None, ids: Iterable[str], now: float) -> None:
        """After a claim that took ``ids``: ``head`` is the first claimable row it could see
        (locked or not), ``first`` the first it took. The cursor moves to ``head`` -- unless that
        row has been the head for :data:`STUCK` seconds already: then it is passed (and looked up
        by primary key from now on) and the cursor moves to ``first``."""
        if head is None and first is None:
            return
        with self._lock:
            cursor = self._cursors.get(plan.key)
            if cursor is None:
                return
            _forget(cursor, ids)
            target = head if head is not None else first
            if head is not None and head != first:
                if cursor.seen != head:
                    cursor.seen, cursor.seen_since = head, now
                elif now - cursor.seen_since >= STUCK and first is not None:
                    target = first
                    passed = cursor.passed = cursor.passed or {}
                    passed[head[2]] = None
                    while len(passed) > MAX_PASSED:
                        passed.pop(next(iter(passed)))
            else:
                cursor.seen = None
            assert target is not None
            cursor.priority, cursor.run_at, cursor.id = target

    def failed(self, plan: ClaimPlan) -> None:
        """The claim did not happen: its lapsed-claim window is looked at again, from the start."""
        with self._lock:
            cursor = self._cursors.get(plan.key)
            if cursor is not None and plan.look_for_lapsed:
                cursor.lapse_at, cursor.lapse_floor = 0.0, None

    def taken(self, plan: ClaimPlan, ids: Iterable[str]) -> None:
        """Rows claimed outside the cursor's walk (passed ones, lapsed ones): no longer passed."""
        with self._lock:
            cursor = self._cursors.get(plan.key)
            if cursor is not None:
                _forget(cursor, ids)

    def ready(self, queue: str, priority: int, run_at: datetime) -> None:
        """Jobs became claimable at ``(priority, run_at)`` in ``queue``: a cursor past that key
        (at that priority) moves back to it."""
        with self._lock:
            for cursor in self._cursors.values():
                if cursor.queue not in (None, queue) or cursor.priority != priority or cursor.run_at is None:
                    continue
                if run_at < cursor.run_at or (run_at == cursor.run_at and cursor.id):
                    cursor.run_at, cursor.id = run_at, ""

    def ready_many(self, items: Iterable[tuple[str, int, datetime]]) -> None:
        """:meth:`ready` for many jobs, one call per (queue, priority) at its earliest ``run_at``;
        nothing at all in a process that does not claim."""
        if not self._cursors:
            return
        earliest: dict[tuple[str, int], datetime] = {}
        for queue, priority, run_at in items:
            known = earliest.get((queue, priority))
            if known is None or run_at < known:
                earliest[(queue, priority)] = run_at
        for (queue, priority), run_at in earliest.items():
            self.ready(queue, priority, run_at)

    def rescan(self, queues: Iterable[str] | None) -> None:
        """The next claims of these queues (``None``: of every queue) walk from the head."""
        wanted = None if queues is None else set(queues)
        if wanted is not None and not wanted:
            return
        with self._lock:
            for cursor in self._cursors.values():
                if wanted is None or cursor.queue is None or cursor.queue in wanted:
                    cursor.catch_up_at = 0.0
                    cursor.lapse_at = 0.0
                    cursor.lapse_floor = None

    def notice(self, payload: str) -> str:
        """Apply a NOTIFY payload; returns the queue it names (``*`` for every queue)."""
        kind, queue, priority, run_at = parse_notice(payload)
        if kind == "J" and priority is not None and run_at is not None:
            self.ready(queue, priority, run_at)
        elif kind == "R" or queue == "*":
            self.rescan(None if queue == "*" else [queue])
        return queue
