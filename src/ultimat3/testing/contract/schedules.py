"""The schedule store: each tick fires once, with its job, in one transaction."""

from __future__ import annotations

import threading

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver

from .helpers import at, get, request


def test_register_creates_the_row_once_and_keeps_it(driver: JobDriver, clock: ManualClock) -> None:
    first = driver.schedules.register("reports.daily", 1000.0)
    assert (first.key, first.last_tick, first.paused, first.last_job_id) == ("reports.daily", at(1000.0), False, None)
    again = driver.schedules.register("reports.daily", 5000.0)
    assert again.last_tick == at(1000.0)  # a second sighting (another worker, a restart) changes nothing
    assert [r.key for r in driver.schedules.list()] == ["reports.daily"]
    assert driver.schedules.get("nope") is None


def test_a_tick_fires_once_with_its_job_and_never_again(driver: JobDriver) -> None:
    driver.schedules.register("s", 1000.0)
    key = "schedule:s@1060"
    fired = driver.schedules.fire("s", 1060.0, request(name="tick.job", idempotency_key=key))
    assert fired is not None and fired.tick == 1060.0 and fired.job is not None and not fired.job.deduped
    job = get(driver, fired.job.id)
    assert (job.name, job.idempotency_key, job.state) == ("tick.job", key, "ready")
    row = driver.schedules.get("s")
    assert row is not None and (row.last_tick, row.last_job_id) == (at(1060.0), fired.job.id)
    # The same tick again (another worker), or an older one: nothing.
    assert driver.schedules.fire("s", 1060.0, request(name="tick.job", idempotency_key=key)) is None
    assert driver.schedules.fire("s", 1000.0, request(name="tick.job", idempotency_key="schedule:s@1000")) is None
    assert len(driver.introspect.list()) == 1
    assert driver.schedules.fire("unknown", 1060.0, request()) is None


def test_a_skipped_tick_moves_the_row_and_enqueues_nothing(driver: JobDriver) -> None:
    driver.schedules.register("s", 0.0)
    fired = driver.schedules.fire("s", 60.0, None)
    assert fired is not None and fired.job is None
    row = driver.schedules.get("s")
    assert row is not None and row.last_tick == at(60.0) and row.last_job_id is None
    assert driver.introspect.list() == []


def test_a_paused_schedule_passes_its_ticks_without_running_them(driver: JobDriver, clock: ManualClock) -> None:
    driver.schedules.register("s", 0.0)
    assert driver.schedules.set_paused("s", True, "ops:ann") is True
    assert driver.schedules.set_paused("s", True, "ops:ann") is False
    fired = driver.schedules.fire("s", 60.0, request(idempotency_key="schedule:s@60"))
    assert fired is not None and fired.job is None and driver.introspect.list() == []
    row = driver.schedules.get("s")
    assert row is not None and row.paused and row.changed_by == "ops:ann" and row.changed_at == at(clock.now())
    assert driver.schedules.set_paused("s", False, "ops:bob") is True
    fired = driver.schedules.fire("s", 120.0, request(idempotency_key="schedule:s@120"))
    assert fired is not None and fired.job is not None
    actions = [(e.action, e.actor, e.touched, e.target) for e in driver.audit.list()]
    assert actions == [("resume", "ops:bob", 1, {"schedule": "s"}), ("pause", "ops:ann", 0, {"schedule": "s"}),
                       ("pause", "ops:ann", 1, {"schedule": "s"})]


def test_pausing_a_schedule_never_seen_creates_its_row(driver: JobDriver, clock: ManualClock) -> None:
    assert driver.schedules.set_paused("later", False, "ops") is False
    assert driver.schedules.set_paused("new", True, "ops") is True
    row = driver.schedules.get("new")
    assert row is not None and row.paused and row.last_tick == at(clock.now())
    # A worker that registers it afterwards keeps the operator's row.
    assert driver.schedules.register("new", 0.0).paused is True


def test_a_fire_whose_enqueue_is_refused_moves_nothing(driver: JobDriver) -> None:
    driver.schedules.register("s", 0.0)
    with pytest.raises(XError):
        driver.schedules.fire("s", 60.0, request(payload={"bad": float("nan")}))
    row = driver.schedules.get("s")
    assert row is not None and row.last_tick == at(0.0)  # the tick is still to fire
    assert driver.schedules.fire("s", 60.0, request()) is not None


def test_racing_fires_of_one_tick_enqueue_exactly_one_job(driver: JobDriver) -> None:
    driver.schedules.register("race", 0.0)
    results: list[object] = []
    barrier = threading.Barrier(6)

    def fire() -> None:
        barrier.wait()
        results.append(driver.schedules.fire("race", 60.0, request(name="race.job")))

    threads = [threading.Thread(target=fire) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(1 for r in results if r is not None) == 1
    assert len(driver.introspect.list()) == 1
