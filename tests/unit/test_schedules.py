"""Schedules on the memory driver with a manual clock: tick math, DST in Europe/Berlin, catch-up
policies, jitter, inputs, ctx.tick, pause, and every bad declaration refused where it is written."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

from ultimat3.core import Ctx
from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers.memory.driver import MemoryDriver
from ultimat3.drivers.protocol import JobFilter
from ultimat3.jobs import Worker, isolated_registry, job
from ultimat3.jobs.schedule import CATCH_UP_LIMIT, cron, every, tick_of
from ultimat3.jobs.scheduler import Scheduler, declared_schedules

BERLIN = ZoneInfo("Europe/Berlin")


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, tz: Any = UTC) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=tz).timestamp()


def local(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, BERLIN).isoformat()


@pytest.fixture
def registry() -> Iterator[None]:
    with isolated_registry():
        yield


def scheduler_for(driver: MemoryDriver) -> Scheduler:
    return Scheduler(driver, declared_schedules(), environment="test")


def runs(driver: MemoryDriver, name: str) -> list[float]:
    """The ticks of every run of ``name`` enqueued so far, oldest first."""
    jobs = driver.introspect.list(JobFilter(name=name, limit=10_000))
    ticks = [tick_of(j.enqueued_by) for j in jobs]
    return sorted(t.timestamp() for t in ticks if t is not None)


def step_through(clock: ManualClock, schedulers: list[Scheduler], until: float, step: float) -> None:
    while clock.now() < until:
        clock.advance(step)
        for scheduler in schedulers:
            scheduler.run_once(clock.now())


# -- tick math ------------------------------------------------------------------------------------

def test_every_ticks_at_multiples_of_its_interval_since_the_epoch() -> None:
    s = every("5m")
    assert s.latest_at_or_before(at(2026, 12, 3, 14, 7)) == at(2026, 12, 3, 14, 5)
    assert s.latest_at_or_before(at(2026, 12, 3, 14, 5)) == at(2026, 12, 3, 14, 5)
    assert s.next_after(at(2026, 12, 3, 14, 5)) == at(2026, 12, 3, 14, 10)
    assert s.ticks_between(at(2026, 12, 3, 14, 0), at(2026, 12, 3, 14, 20), limit=None) == [
        at(2026, 12, 3, 14, m) for m in (5, 10, 15, 20)]
    assert s.ticks_between(at(2026, 12, 3, 14, 0), at(2026, 12, 3, 14, 20), limit=2) == [
        at(2026, 12, 3, 14, 15), at(2026, 12, 3, 14, 20)]
    assert every(timedelta(hours=1)).expression == "3600s" and every(90).interval == 90


def test_cron_ticks_in_its_zone() -> None:
    s = cron("0 3 * * *", tz="Europe/Berlin")
    assert local(s.next_after(at(2026, 12, 3, 12))) == "2026-12-04T03:00:00+01:00"
    assert local(s.latest_at_or_before(at(2026, 12, 3, 12))) == "2026-12-03T03:00:00+01:00"
    exactly = at(2026, 12, 3, 3, tz=BERLIN)
    assert s.latest_at_or_before(exactly) == exactly and s.next_after(exactly) > exactly
    assert s.describe() == "cron 0 3 * * * (Europe/Berlin)"


def test_a_daily_0230_across_spring_forward_fires_once_at_the_end_of_the_gap(registry: None) -> None:
    # 2026-03-29 02:00 CET jumps to 03:00 CEST: 02:30 does not exist that night.
    clock = ManualClock(at(2026, 3, 27, 12, tz=BERLIN))
    driver = MemoryDriver(clock)
    job(name="nightly", tenant="none", schedule=cron("30 2 * * *", tz="Europe/Berlin"))(lambda i, ctx: None)
    scheduler = scheduler_for(driver)
    step_through(clock, [scheduler], at(2026, 3, 31, 12, tz=BERLIN), 60)
    assert [local(t) for t in runs(driver, "nightly")] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00"]


def test_a_daily_0230_across_fall_back_fires_once_in_the_first_occurrence(registry: None) -> None:
    # 2026-10-25 03:00 CEST falls back to 02:00 CET: 02:30 happens twice that night.
    clock = ManualClock(at(2026, 10, 23, 12, tz=BERLIN))
    driver = MemoryDriver(clock)
    job(name="nightly", tenant="none", schedule=cron("30 2 * * *", tz="Europe/Berlin"))(lambda i, ctx: None)
    job(name="halfhourly", tenant="none", schedule=cron("*/30 * * * *", tz="Europe/Berlin"))(lambda i, ctx: None)
    scheduler = scheduler_for(driver)
    step_through(clock, [scheduler], at(2026, 10, 26, 12, tz=BERLIN), 60)
    assert [local(t) for t in runs(driver, "nightly")] == [
        "2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    # A wildcard hour keeps its wall-clock pace through both 02:xx hours.
    night = [local(t) for t in runs(driver, "halfhourly") if local(t).startswith("2026-10-25T0")]
    assert night[:8] == ["2026-10-25T00:00:00+02:00", "2026-10-25T00:30:00+02:00", "2026-10-25T01:00:00+02:00",
                         "2026-10-25T01:30:00+02:00", "2026-10-25T02:00:00+02:00", "2026-10-25T02:30:00+02:00",
                         "2026-10-25T02:00:00+01:00", "2026-10-25T02:30:00+01:00"]
    gaps = {b - a for a, b in zip(runs(driver, "halfhourly"), runs(driver, "halfhourly")[1:], strict=False)}
    assert gaps == {1800.0}  # never twice, never a gap, in real time


# -- firing ---------------------------------------------------------------------------------------

def test_a_new_schedule_starts_with_the_next_tick_and_several_workers_fire_each_tick_once(registry: None) -> None:
    clock = ManualClock(at(2026, 12, 3, 10, 30))
    driver = MemoryDriver(clock)
    job(name="hourly", tenant="none", schedule=every("1h"))(lambda i, ctx: None)
    workers = [scheduler_for(driver) for _ in range(3)]
    for scheduler in workers:
        assert scheduler.run_once(clock.now()) == []  # 10:00 is before the schedule was first seen
    step_through(clock, workers, at(2026, 12, 3, 15, 30), 7)
    assert runs(driver, "hourly") == [at(2026, 12, 3, h) for h in (11, 12, 13, 14, 15)]
    row = driver.schedules.get("hourly")
    assert row is not None and row.last_tick.timestamp() == at(2026, 12, 3, 15) and row.last_job_id is not None


def test_a_worker_a_few_ticks_behind_fires_each_of_them(registry: None) -> None:
    clock = ManualClock(at(2026, 12, 3, 10))
    driver = MemoryDriver(clock)
    job(name="often", tenant="none", schedule=every("10s"))(lambda i, ctx: None)
    scheduler = scheduler_for(driver)
    scheduler.run_once(clock.now())
    clock.advance(45)  # a long GC pause: four ticks due, all recent
    scheduler.run_once(clock.now())
    assert runs(driver, "often") == [at(2026, 12, 3, 10) + s for s in (10, 20, 30, 40)]


@pytest.mark.parametrize(("policy", "expected"), [
    ("latest", [19]),
    ("all", list(range(11, 20))),
    ("skip", []),
])
def test_missed_ticks_follow_the_declared_catch_up(registry: None, policy: str, expected: list[int]) -> None:
    clock = ManualClock(at(2026, 12, 3, 10, 30))
    driver = MemoryDriver(clock)
    job(name="hourly", tenant="none", schedule=every("1h", catch_up=policy))(lambda i, ctx: None)  # type: ignore[arg-type]
    scheduler_for(driver).run_once(clock.now())
    clock.advance(9 * 3600)  # every worker down from 10:30 to 19:30
    scheduler_for(driver).run_once(clock.now())  # a fresh worker
    assert runs(driver, "hourly") == [at(2026, 12, 3, h) for h in expected]
    row = driver.schedules.get("hourly")
    assert row is not None and row.last_tick.timestamp() == at(2026, 12, 3, 19)  # skipped ones are passed too
    clock.advance(1800)
    scheduler_for(driver).run_once(clock.now())
    assert runs(driver, "hourly")[-1:] == [at(2026, 12, 3, 20)]


def test_catch_up_all_is_bounded(registry: None) -> None:
    clock = ManualClock(at(2026, 12, 3))
    driver = MemoryDriver(clock)
    job(name="minutely", tenant="none", schedule=cron("* * * * *", catch_up="all"))(lambda i, ctx: None)
    scheduler_for(driver).run_once(clock.now())
    clock.advance(86_400)
    scheduler_for(driver).run_once(clock.now())
    fired = runs(driver, "minutely")
    assert len(fired) == CATCH_UP_LIMIT and fired[-1] == clock.now() and fired[0] == clock.now() - 99 * 60


def test_jitter_delays_each_run_within_its_bound_alike_for_every_worker(registry: None) -> None:
    clock = ManualClock(at(2026, 12, 3, 10))
    driver = MemoryDriver(clock)
    job(name="j", tenant="none", schedule=every("1m", jitter="30s"))(lambda i, ctx: None)
    scheduler = scheduler_for(driver)
    scheduler.run_once(clock.now())
    step_through(clock, [scheduler], at(2026, 12, 3, 11), 5)
    jobs = driver.introspect.list(JobFilter(name="j", limit=100))
    delays = [j.run_at.timestamp() - tick.timestamp() for j in jobs if (tick := tick_of(j.enqueued_by)) is not None]
    assert len(delays) == 60 and all(0 <= d < 30 for d in delays) and len(set(delays)) > 30
    other = scheduler_for(driver)._request(declared_schedules()[0], at(2026, 12, 3, 12))
    assert other.run_at == scheduler._request(declared_schedules()[0], at(2026, 12, 3, 12)).run_at


class Report(BaseModel):
    day: str
    org: str = "acme"


def test_inputs_are_fixed_or_built_from_the_tick_and_the_run_sees_its_tick(registry: None) -> None:
    clock = ManualClock(at(2026, 12, 3, 23, 59))
    driver = MemoryDriver(clock)
    seen: list[tuple[str, datetime | None, str | None]] = []

    def handler(input: Report, ctx: Ctx) -> None:
        seen.append((input.day, ctx.tick, ctx.actor.org_id))

    job(name="report", tenant=lambda i: i.org, input=Report, schedule=[
        cron("0 0 * * *", name="built", input=lambda tick: {"day": (tick - timedelta(days=1)).date().isoformat()}),
        every("1d", name="fixed", input=Report(day="fixed", org="globex")),
    ])(handler)
    scheduler_for(driver).run_once(clock.now())
    clock.advance(120)
    fired = scheduler_for(driver).run_once(clock.now())
    assert sorted(key for key, _ in fired) == ["report:built", "report:fixed"]
    worker = Worker(driver, environment="test", liveness_interval=None)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()
    midnight = datetime(2026, 12, 4, tzinfo=UTC)
    assert sorted(seen, key=lambda s: s[0]) == [("2026-12-03", midnight, "acme"), ("fixed", midnight, "globex")]
    jobs = driver.introspect.list(JobFilter(name="report"))
    assert {j.enqueued_by for j in jobs} == {"schedule:report:built@2026-12-04T00:00:00Z",
                                             "schedule:report:fixed@2026-12-04T00:00:00Z"}


def test_a_paused_schedule_runs_nothing_until_resumed(registry: None) -> None:
    clock = ManualClock(at(2026, 12, 3, 10, 30))
    driver = MemoryDriver(clock)
    job(name="hourly", tenant="none", schedule=every("1h"))(lambda i, ctx: None)
    scheduler = scheduler_for(driver)
    scheduler.run_once(clock.now())
    assert driver.schedules.set_paused("hourly", True, "ops")
    step_through(clock, [scheduler], at(2026, 12, 3, 12, 30), 60)
    assert runs(driver, "hourly") == []
    driver.schedules.set_paused("hourly", False, "ops")
    step_through(clock, [scheduler], at(2026, 12, 3, 13, 30), 60)
    assert runs(driver, "hourly") == [at(2026, 12, 3, 13)]  # the paused ticks are not caught up


def test_an_input_that_fails_to_build_is_logged_and_its_tick_fires_once_it_builds(
        registry: None, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(at(2026, 12, 3, 10, 30))
    driver = MemoryDriver(clock)
    broken = {"now": True}

    def build(tick: datetime) -> dict[str, str]:
        if broken["now"]:
            return {"day": 42}  # type: ignore[dict-item]
        return {"day": tick.date().isoformat()}

    job(name="report", tenant="none", input=Report, schedule=every("1h", input=build))(lambda i, ctx: None)
    scheduler = scheduler_for(driver)
    scheduler.run_once(clock.now())
    clock.advance(1800)
    assert scheduler.run_once(clock.now()) == []
    assert "X_JOB_INPUT" in caplog.text and "report" in caplog.text
    broken["now"] = False
    clock.advance(10)
    assert [key for key, _ in scheduler.run_once(clock.now())] == ["report"]
    assert runs(driver, "report") == [at(2026, 12, 3, 11)]


def test_fire_now_enqueues_one_run_outside_the_ticks(registry: None) -> None:
    clock = ManualClock(at(2026, 12, 3, 10, 30))
    driver = MemoryDriver(clock)
    job(name="hourly", tenant="none", schedule=every("1h"))(lambda i, ctx: None)
    scheduler = scheduler_for(driver)
    job_id = scheduler.fire_now(declared_schedules()[0])
    record = driver.introspect.get(job_id)
    assert record is not None and record.enqueued_by == "schedule:hourly@2026-12-03T10:30:00Z"
    assert scheduler.next_wake(clock.now()) == at(2026, 12, 3, 11)


# -- bad declarations -----------------------------------------------------------------------------

class Needs(BaseModel):
    user_id: int


@pytest.mark.parametrize(("declare", "code"), [
    (lambda: cron("61 * * * *"), "X_SCHEDULE_CRON"),
    (lambda: cron("0 3 * *"), "X_SCHEDULE_CRON"),
    (lambda: cron(""), "X_SCHEDULE_CRON"),
    (lambda: cron("0 3 * * *", tz="Mars/Olympus"), "X_SCHEDULE_TZ"),
    (lambda: every("0s"), "X_SCHEDULE_INTERVAL"),
    (lambda: every(-5), "X_DURATION"),
    (lambda: every("500ms"), "X_SCHEDULE_INTERVAL"),
    (lambda: every("soon"), "X_DURATION"),
    (lambda: every("5m", catch_up="most"), "X_SCHEDULE_CATCH_UP"),
    (lambda: every("5m", name="bad name"), "X_SCHEDULE_NAME"),
    (lambda: every("5m", jitter="-1s"), "X_DURATION"),
])
def test_a_bad_schedule_is_refused_where_it_is_written_naming_the_job(
        registry: None, declare: Any, code: str) -> None:
    with pytest.raises(XError) as raised:
        job(name="billing.remind", tenant="none", schedule=declare())(lambda i, ctx: None)
    assert raised.value.code == code and raised.value.hint
    assert raised.value.message.startswith('job "billing.remind" declares ')
    with pytest.raises(XError) as again:
        declare().check()  # outside a job, on demand
    assert again.value.code == code


@pytest.mark.parametrize(("kwargs", "code", "words"), [
    ({"input": Needs, "schedule": every("1h")}, "X_SCHEDULE_INPUT", "user_id"),
    ({"input": Needs, "schedule": every("1h", input={"user_id": "x"})}, "X_SCHEDULE_INPUT", "user_id"),
    ({"input": Needs, "schedule": every("1h", input=lambda: {"user_id": 1})}, "X_SCHEDULE_INPUT", "tick"),
    ({"schedule": [every("1h"), cron("0 3 * * *")]}, "X_SCHEDULE_NAME", "name each"),
    ({"schedule": "0 3 * * *"}, "X_SCHEDULE", "cron("),
    ({"schedule": [every("1h", name="a"), "hourly"]}, "X_SCHEDULE", "cron("),
])
def test_a_schedule_that_could_never_fire_is_refused_naming_the_job(
        registry: None, kwargs: dict[str, Any], code: str, words: str) -> None:
    with pytest.raises(XError) as raised:
        job(name="billing.remind", tenant="none", **kwargs)(lambda i, ctx: None)
    assert raised.value.code == code
    assert "billing.remind" in raised.value.message and words in str(raised.value)
