"""Firing schedules: every worker computes the same ticks and offers each one to the database.

There is no leader to elect or lose. Each worker runs a :class:`Scheduler`; for every declared
schedule it finds the ticks that are due and calls ``driver.schedules.fire`` for each, oldest
first. The store's compare-and-set lets exactly one caller through per tick and enqueues the run in
the same transaction, so a tick fires once however many workers run, and as long as one of them
lives no tick is lost.

Which due ticks fire (``catch_up``): a tick less than :data:`~ultimat3.jobs.schedule.SKIP_GRACE`
old is *recent* and always fires (a worker that fell a few ticks behind fires each of them); older
ones were *missed* (no worker ran): ``latest`` fires only the newest due tick when no recent one
exists, ``all`` fires the newest :data:`~ultimat3.jobs.schedule.CATCH_UP_LIMIT` of them oldest first,
``skip`` records them as passed without running them.

Each run is enqueued as ``schedule:<key>@<tick>`` (its ``enqueued_by``; a run's ``ctx.tick`` is read
from it), under a system grant (a schedule acts for no request), with the job's own idempotency
key or, without one, that same text.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ultimat3.core.context import SYSTEM_SCOPE, Actor, Ctx, Environment, Grant, use_ctx
from ultimat3.core.errors import XError, first_line
from ultimat3.core.throttle import ThrottledLog
from ultimat3.drivers.protocol import EnqueueRequest, Fired, JobDriver, ScheduleRecord
from ultimat3.jobs.job import EnqueueOptions, JobHandle, registered_jobs
from ultimat3.jobs.schedule import CATCH_UP_LIMIT, SCHEDULE_PREFIX, SKIP_GRACE, Schedule, tick_of, tick_text

__all__ = ["SCHEDULE_PREFIX", "DeclaredSchedule", "Scheduler", "declared_schedules", "tick_of", "tick_text"]

log = logging.getLogger("ultimat3.scheduler")
_throttled = ThrottledLog(log, 60.0)
@dataclass(frozen=True)
class DeclaredSchedule:
    """A schedule and the job it runs."""

    handle: JobHandle[Any]
    schedule: Schedule

    @property
    def key(self) -> str:
        """The durable key (``x_schedules.key``)."""
        return self.schedule.key(self.handle.name)


def declared_schedules(handles: Iterable[JobHandle[Any]] | None = None) -> list[DeclaredSchedule]:
    """Every schedule of ``handles`` (default: every declared job), by key."""
    found = [DeclaredSchedule(handle, schedule)
             for handle in (registered_jobs() if handles is None else handles) for schedule in handle.schedules]
    return sorted(found, key=lambda d: d.key)


@dataclass
class _State:
    declared: DeclaredSchedule
    registered: bool = False
    #: The newest tick known to have fired (by anyone); ticks at or before it are not offered again.
    last: float | None = None
    failures: int = field(default=0)


class Scheduler:
    """Offers the due ticks of ``schedules`` to ``driver.schedules`` (see the module docstring).

    :meth:`run_once` does one round at ``now``; :meth:`next_wake` says when the next tick falls.
    The worker runs it in a loop; tests drive it with a :class:`~ultimat3.core.clock.ManualClock`.
    """

    def __init__(self, driver: JobDriver, schedules: Sequence[DeclaredSchedule], *,
                 environment: Environment = "development") -> None:
        self.driver = driver
        self.environment = environment
        self._states = [_State(declared) for declared in schedules]

    @property
    def schedules(self) -> list[DeclaredSchedule]:
        """What this scheduler fires."""
        return [state.declared for state in self._states]

    def run_once(self, now: float) -> list[tuple[str, Fired]]:
        """Fire what is due at ``now``; returns (key, what was fired) for every tick this process won.

        A schedule whose input cannot be built, or whose enqueue is refused, is logged (coded, at
        most once a minute) and tried again next round: its tick is not marked fired.
        """
        fired: list[tuple[str, Fired]] = []
        for state in self._states:
            try:
                fired.extend((state.declared.key, f) for f in self._round(state, now))
            except XError as error:
                state.failures += 1
                _throttled.warning(f"schedule:{state.declared.key}", "schedule %s could not fire: %s: %s",
                                   state.declared.key, error.code, first_line(error.message),
                                   extra={"code": error.code, "schedule": state.declared.key})
            except Exception as error:  # a database outage: the next round tries again
                state.failures += 1
                _throttled.warning(f"schedule:{state.declared.key}", "schedule %s could not fire: %s",
                                   state.declared.key, first_line(str(error)) or type(error).__name__,
                                   extra={"schedule": state.declared.key})
            else:
                state.failures = 0
        return fired

    def next_wake(self, now: float) -> float:
        """When the next tick of any schedule falls (epoch seconds), at least ``now``."""
        upcoming = [state.declared.schedule.next_after(max(now, state.last or now)) for state in self._states]
        return max(now, min(upcoming)) if upcoming else now + 3600.0

    def _round(self, state: _State, now: float) -> list[Fired]:
        declared = state.declared
        schedule = declared.schedule
        newest = schedule.latest_at_or_before(now)
        if not state.registered:
            row = self.driver.schedules.register(declared.key, newest)
            state.registered = True
            state.last = row.last_tick.timestamp()
        last = state.last if state.last is not None else now
        if newest <= last:
            return []
        due = self._due(schedule, last, now, newest)
        out: list[Fired] = []
        for tick, run in due:
            result = self.driver.schedules.fire(declared.key, tick, self._request(declared, tick) if run else None)
            state.last = tick  # fired here, or by another worker first: either way it is done
            if result is not None:
                out.append(result)
        return out

    @staticmethod
    def _due(schedule: Schedule, last: float, now: float, newest: float) -> list[tuple[float, bool]]:
        """The ticks to offer, oldest first, each with whether it runs (``False``: passed, skipped);
        ``newest`` is the newest tick at or before ``now``."""
        if schedule.catch_up == "all":
            return [(tick, True) for tick in schedule.ticks_between(last, now, limit=CATCH_UP_LIMIT)]
        recent = schedule.ticks_between(max(last, now - SKIP_GRACE), now, limit=None)
        if recent:
            return [(tick, True) for tick in recent]
        return [(newest, schedule.catch_up == "latest")]

    def _request(self, declared: DeclaredSchedule, tick: float) -> EnqueueRequest:
        handle, schedule = declared.handle, declared.schedule
        text = f"{SCHEDULE_PREFIX}{declared.key}@{tick_text(tick)}"
        grant = Grant(SYSTEM_SCOPE, f"schedule {declared.key}")
        ctx = Ctx(actor=Actor(id=text), environment=self.environment, grants=(grant,))
        try:
            with use_ctx(ctx):
                value = schedule.build_input(tick)
                request = handle.build_request(value, EnqueueOptions(), now=self.driver.clock.now(), ctx=ctx)
        finally:
            grant.revoke()
        run_at = tick + schedule.jitter * _fraction(f"{declared.key}@{tick}") if schedule.jitter else tick
        return replace(request, run_at=run_at, idempotency_key=request.idempotency_key or text)

    def fire_now(self, declared: DeclaredSchedule) -> str:
        """Enqueue one run of ``declared`` now, outside its ticks (``x schedules run``); the job id."""
        now = self.driver.clock.now()
        request = replace(self._request(declared, now), run_at=None)
        return self.driver.enqueue(request).id


def _fraction(text: str) -> float:
    """A number in [0, 1) that every worker derives alike from ``text`` (the jitter of one tick)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def next_fire(declared: DeclaredSchedule | None, row: ScheduleRecord | None, now: float) -> tuple[str | None, bool]:
    """The next fire time (ISO), and whether a tick is due now (a worker will fire it at its next look)."""
    if declared is None:
        return None, False
    schedule = declared.schedule
    due = row is not None and schedule.latest_at_or_before(now) > row.last_tick.timestamp()
    return tick_text(schedule.next_after(now)), due


def schedule_json(key: str, declared: DeclaredSchedule | None, row: ScheduleRecord | None,
                  now: float) -> dict[str, Any]:
    """One schedule as ``x schedules ls --json`` and the dashboard show it: declared and/or
    remembered, paused, due now, its next fire time and its last tick."""
    upcoming, due = next_fire(declared, row, now)
    return {
        "name": key, "job": declared.handle.name if declared else None,
        "schedule": declared.schedule.describe() if declared else None,
        "catch_up": declared.schedule.catch_up if declared else None,
        "jitter": declared.schedule.jitter if declared else None,
        "declared": declared is not None, "paused": bool(row and row.paused), "due_now": due,
        "next_fire": upcoming, "last_tick": _iso(row.last_tick) if row else None,
        "last_job_id": row.last_job_id if row else None,
        "changed_at": _iso(row.changed_at) if row else None, "changed_by": row.changed_by if row else None,
    }
