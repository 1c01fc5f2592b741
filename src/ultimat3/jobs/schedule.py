"""Schedules: when a periodic job's ticks fall, in which time zone, and what each run gets as input.

``cron("0 3 * * *", tz="Europe/Berlin")`` parses with cronsim (Debian cron's semantics, DST
included) and ``every("5m")`` ticks at whole multiples of the interval since the Unix epoch, so
every worker of a fleet computes the same tick times with no shared state. Firing is the
scheduler's job (:mod:`ultimat3.jobs.scheduler`); this module only declares and computes.

Daylight saving time (cron in a zone that has it), the rules cronsim takes from Debian's cron:

- a local time that does not exist (the spring-forward gap, e.g. 02:30 in Europe/Berlin on the last
  Sunday of March) fires once, at the first instant after the gap (03:00 summer time);
- a local time that happens twice (fall back, 02:30 on the last Sunday of October) fires once, at
  its first occurrence (02:30 summer time) when the expression names the hour; an expression whose
  hour field is ``*`` keeps its wall-clock pace and fires in both occurrences.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ultimat3.core.errors import ConfigError, fail
from ultimat3.jobs.duration import DurationInput, parse_duration

__all__ = ["CATCH_UP_LIMIT", "SCHEDULE_PREFIX", "CatchUp", "Schedule", "ScheduleInput", "cron", "every",
           "schedule_of", "tick_of", "tick_text"]

CatchUp = Literal["latest", "all", "skip"]
#: ``catch_up="all"`` fires at most this many missed ticks (the newest ones), however long the gap.
CATCH_UP_LIMIT = 100
#: ``catch_up="skip"``: a tick this late or later is skipped rather than fired.
SKIP_GRACE = 60.0
#: The input of each run: a mapping (or model) fixed at declaration, or built from the tick time.
ScheduleInput = Mapping[str, Any] | Any | Callable[[datetime], Any] | None
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")

#: ``enqueued_by`` of a scheduled run: ``schedule:<key>@<tick ISO-8601>``.
SCHEDULE_PREFIX = "schedule:"


def tick_text(tick: float) -> str:
    """A tick as ISO-8601 UTC with a ``Z`` (what keys and ``enqueued_by`` carry)."""
    return datetime.fromtimestamp(tick, UTC).isoformat().replace("+00:00", "Z")


def schedule_of(enqueued_by: str | None) -> str | None:
    """The key of the schedule that enqueued a run, read from its ``enqueued_by`` (else ``None``)."""
    if not enqueued_by or not enqueued_by.startswith(SCHEDULE_PREFIX) or "@" not in enqueued_by:
        return None
    return enqueued_by[len(SCHEDULE_PREFIX):].rsplit("@", 1)[0]


def tick_of(enqueued_by: str | None) -> datetime | None:
    """The tick a scheduled run was enqueued for, read from its ``enqueued_by`` (else ``None``)."""
    if not enqueued_by or not enqueued_by.startswith(SCHEDULE_PREFIX) or "@" not in enqueued_by:
        return None
    try:
        return datetime.fromisoformat(enqueued_by.rsplit("@", 1)[1].replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Schedule:
    """One declared schedule of a job (build it with :func:`cron` or :func:`every`).

    ``name`` tells several schedules of one job apart (the durable key is ``job`` or ``job:name``);
    ``input`` is fixed, or a callable ``tick -> input``; ``catch_up`` decides what happens to ticks
    that fell while no worker ran: ``latest`` (one run, for the newest), ``all`` (each, oldest first,
    at most :data:`CATCH_UP_LIMIT`) or ``skip`` (none; only a tick less than a minute late fires);
    ``jitter`` delays each run by up to that many seconds (the same for every worker of a tick).
    """

    kind: Literal["cron", "every"]
    expression: str
    tz: str
    interval: float | None
    input: ScheduleInput
    catch_up: CatchUp
    jitter: float
    name: str | None
    #: Why this schedule can never fire (a bad field): :func:`~ultimat3.jobs.job` raises it, naming
    #: the job it was declared on; :meth:`check` raises it anywhere else.
    invalid: ConfigError | None = field(default=None, compare=False)

    def check(self) -> None:
        """Raise the coded reason this schedule can never fire, if it has one."""
        if self.invalid is not None:
            raise self.invalid

    def describe(self) -> str:
        """``cron 0 3 * * * (Europe/Berlin)`` or ``every 5m``."""
        return f"cron {self.expression} ({self.tz})" if self.kind == "cron" else f"every {self.expression}"

    def key(self, job_name: str) -> str:
        """The durable key of this schedule of ``job_name`` (stored in ``x_schedules``)."""
        return job_name if self.name is None else f"{job_name}:{self.name}"

    def latest_at_or_before(self, when: float) -> float:
        """The newest tick at or before ``when`` (epoch seconds)."""
        if self.interval is not None:
            return math.floor(when / self.interval) * self.interval
        start = self._local(when + 60.0)
        for tick in CronSim(self.expression, start, reverse=True):
            seconds = tick.timestamp()
            if seconds <= when:
                return seconds
        raise AssertionError("unreachable: a valid cron expression always has an earlier tick")  # pragma: no cover

    def ticks_after(self, after: float) -> Iterator[float]:
        """Every tick strictly after ``after``, in order (endless)."""
        if self.interval is not None:
            tick = math.floor(after / self.interval) * self.interval + self.interval
            while True:
                yield tick
                tick += self.interval
        for moment in CronSim(self.expression, self._local(after)):
            seconds = moment.timestamp()
            if seconds > after:
                yield seconds

    def ticks_between(self, after: float, until: float, *, limit: int | None) -> list[float]:
        """The ticks in ``(after, until]``, oldest first; only the newest ``limit`` when given."""
        if until <= after:
            return []
        if self.interval is not None:
            last = math.floor(until / self.interval)
            first = math.floor(after / self.interval) + 1
            if limit is not None:
                first = max(first, last - limit + 1)
            return [k * self.interval for k in range(first, last + 1)]
        found: list[float] = []
        for moment in CronSim(self.expression, self._local(until + 60.0), reverse=True):
            seconds = moment.timestamp()
            if seconds > until:
                continue
            if seconds <= after or (limit is not None and len(found) >= limit):
                break
            found.append(seconds)
        return found[::-1]

    def next_after(self, after: float) -> float:
        """The first tick strictly after ``after``."""
        return next(self.ticks_after(after))

    def _local(self, when: float) -> datetime:
        return datetime.fromtimestamp(when, UTC).astimezone(ZoneInfo(self.tz))

    def build_input(self, tick: float) -> Any:
        """The input of the run for ``tick``: the fixed one, or what the callable builds."""
        if callable(self.input):
            return self.input(datetime.fromtimestamp(tick, UTC))
        return {} if self.input is None else self.input


def _common(kind: str, catch_up: object, jitter: DurationInput, name: object, what: str) -> tuple[CatchUp, float]:
    if catch_up not in ("latest", "all", "skip"):
        fail(f"{what} catch_up={catch_up!r}", 'write catch_up="latest" (one run for the newest missed tick), '
             '"all" (each, at most 100) or "skip"', code="X_SCHEDULE_CATCH_UP")
    seconds = parse_duration(jitter, what=f"{what} jitter")
    if name is not None and not (isinstance(name, str) and _NAME.match(name)):
        fail(f"{what} name={name!r}", 'name a schedule with letters, digits and _ . - (up to 64), e.g. name="nightly"',
             code="X_SCHEDULE_NAME")
    return catch_up, seconds


def cron(expression: str, *, tz: str = "UTC", input: ScheduleInput = None, catch_up: CatchUp = "latest",
         jitter: DurationInput = 0, name: str | None = None) -> Schedule:
    """A schedule from a five-field cron expression (minute hour day month weekday), evaluated in
    the IANA time zone ``tz``. See the module docstring for what happens across DST changes.

    A bad field does not raise here: the job it is declared on refuses it, naming the job (call
    :meth:`Schedule.check` to raise it yourself)."""
    try:
        return _cron(expression, tz=tz, input=input, catch_up=catch_up, jitter=jitter, name=name)
    except ConfigError as error:
        return Schedule(kind="cron", expression=str(expression), tz=str(tz), interval=None, input=input,
                        catch_up="latest", jitter=0.0, name=None, invalid=error)


def every(interval: DurationInput, *, input: ScheduleInput = None, catch_up: CatchUp = "latest",
          jitter: DurationInput = 0, name: str | None = None) -> Schedule:
    """A schedule that ticks every ``interval`` ("30s", "5m", a number of seconds, a timedelta), at
    whole multiples of it since the Unix epoch (``every("1h")`` fires on the hour, UTC).

    A bad value does not raise here: the job it is declared on refuses it, naming the job."""
    try:
        return _every(interval, input=input, catch_up=catch_up, jitter=jitter, name=name)
    except ConfigError as error:
        return Schedule(kind="every", expression=str(interval), tz="UTC", interval=None, input=input,
                        catch_up="latest", jitter=0.0, name=None, invalid=error)


def _cron(expression: str, *, tz: str, input: ScheduleInput, catch_up: CatchUp, jitter: DurationInput,
          name: str | None) -> Schedule:
    what = f"cron({expression!r})"
    if not isinstance(expression, str) or not expression.strip():
        fail(f"{what} is not a cron expression", 'write five fields, e.g. cron("0 3 * * *") for 03:00 daily',
             code="X_SCHEDULE_CRON")
    expression = " ".join(expression.split())
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        fail(f'{what} tz={tz!r} is not a known time zone', 'write an IANA name such as tz="Europe/Berlin" or "UTC"',
             code="X_SCHEDULE_TZ")
    try:
        next(iter(CronSim(expression, datetime(2026, 1, 1, tzinfo=zone))))
    except (CronSimError, StopIteration, ValueError) as error:
        fail(f"{what} is not a valid cron expression: {error}",
             'write five fields: minute hour day-of-month month day-of-week, e.g. "*/15 9-17 * * 1-5"',
             code="X_SCHEDULE_CRON")
    catch, seconds = _common("cron", catch_up, jitter, name, what)
    return Schedule(kind="cron", expression=expression, tz=tz, interval=None, input=input, catch_up=catch,
                    jitter=seconds, name=name)


def _every(interval: DurationInput, *, input: ScheduleInput, catch_up: CatchUp, jitter: DurationInput,
           name: str | None) -> Schedule:
    what = f"every({interval!r})"
    seconds = parse_duration(interval, what=what)
    if seconds <= 0:
        fail(f"{what}: an interval must be greater than zero", 'write e.g. every("5m") or every(30)',
             code="X_SCHEDULE_INTERVAL")
    if seconds < 1:
        fail(f"{what}: an interval under a second is not a schedule", 'write every("1s") or longer',
             code="X_SCHEDULE_INTERVAL")
    text = interval if isinstance(interval, str) else (
        f"{interval.total_seconds():g}s" if isinstance(interval, timedelta) else f"{seconds:g}s")
    catch, jitter_seconds = _common("every", catch_up, jitter, name, what)
    return Schedule(kind="every", expression=str(text).strip(), tz="UTC", interval=seconds, input=input,
                    catch_up=catch, jitter=jitter_seconds, name=name)
