"""The backfill pacer: what it ASKS to sleep, on a ManualClock — never real time."""

from __future__ import annotations

import math
import threading
import time

import pytest

from ultimat3.backfill import DEFAULT_BACKFILL_BATCH, DEFAULT_BACKFILL_RATE, Pacer
from ultimat3.backfill.pacer import RESOLUTION
from ultimat3.core import ManualClock, XError
from ultimat3.jobs import AbortSignal, JobAbortedError


class RecordingSleep:
    """Records each requested wait and moves the clock by exactly that much."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.asked: list[float] = []

    def __call__(self, seconds: float, signal: AbortSignal) -> None:
        self.asked.append(seconds)
        self.clock.advance(seconds)


@pytest.fixture
def sleep(clock: ManualClock) -> RecordingSleep:
    return RecordingSleep(clock)


def test_defaults() -> None:
    assert DEFAULT_BACKFILL_RATE == 5
    assert DEFAULT_BACKFILL_BATCH == 1000


def test_first_batch_never_waits(clock: ManualClock, sleep: RecordingSleep) -> None:
    pacer = Pacer(5, "b", clock=clock, sleep=sleep)
    pacer.wait(AbortSignal("b"))
    assert sleep.asked == []


def test_fast_batches_wait_out_the_rest_of_the_interval(clock: ManualClock, sleep: RecordingSleep) -> None:
    pacer = Pacer(5, "b", clock=clock, sleep=sleep)
    signal = AbortSignal("b")
    pacer.wait(signal)
    clock.advance(0.05)  # the batch's own work
    pacer.wait(signal)
    clock.advance(0.0)  # an instant batch
    pacer.wait(signal)
    assert sleep.asked == [pytest.approx(0.15), pytest.approx(0.2)]


def test_a_batch_slower_than_the_interval_waits_for_nothing(clock: ManualClock, sleep: RecordingSleep) -> None:
    pacer = Pacer(5, "b", clock=clock, sleep=sleep)
    signal = AbortSignal("b")
    pacer.wait(signal)
    clock.advance(0.3)
    pacer.wait(signal)
    clock.advance(0.2)  # exactly one interval: nothing left to wait
    pacer.wait(signal)
    assert sleep.asked == []


def test_a_remainder_under_the_resolution_is_no_wait_but_is_not_forgiven(
        clock: ManualClock, sleep: RecordingSleep) -> None:
    pacer = Pacer(5, "b", clock=clock, sleep=sleep)
    signal = AbortSignal("b")
    pacer.wait(signal)
    clock.advance(0.2 - RESOLUTION / 2)
    pacer.wait(signal)
    assert sleep.asked == []
    clock.advance(0.2 - 2 * RESOLUTION)
    pacer.wait(signal)  # the half resolution skipped above is waited here
    assert sleep.asked == [pytest.approx(2.5 * RESOLUTION)]


def test_batches_just_under_the_interval_never_run_above_the_rate(clock: ManualClock, sleep: RecordingSleep) -> None:
    # Rate 500 (2 ms) with batches of 1.1 ms: every remainder (0.9 ms) is under the resolution.
    # Skipping each one and restarting from the skip ran 1,000 batches in 1.1 s, at ~900 a second.
    pacer = Pacer(500, "b", clock=clock, sleep=sleep)
    signal = AbortSignal("b")
    start = clock.monotonic()
    for _ in range(1_001):
        pacer.wait(signal)
        clock.advance(0.0011)
    elapsed = clock.monotonic() - start - 0.0011  # the last batch's work is after its slot
    assert 1_000 * 0.002 - 1e-9 <= elapsed <= 1_000 * 0.002 + 0.002


def test_fractional_rates_are_rates(clock: ManualClock, sleep: RecordingSleep) -> None:
    pacer = Pacer(0.5, "b", clock=clock, sleep=sleep)
    assert pacer.rate == 0.5 and pacer.interval == 2.0
    signal = AbortSignal("b")
    pacer.wait(signal)
    pacer.wait(signal)
    assert sleep.asked == [pytest.approx(2.0)]


def test_the_interval_restarts_after_each_wait(clock: ManualClock, sleep: RecordingSleep) -> None:
    pacer = Pacer(10, "b", clock=clock, sleep=sleep)
    signal = AbortSignal("b")
    for _ in range(4):
        pacer.wait(signal)
        clock.advance(0.04)
    assert sleep.asked == [pytest.approx(0.06)] * 3


def test_an_abort_before_the_wait_raises_without_sleeping(clock: ManualClock, sleep: RecordingSleep) -> None:
    pacer = Pacer(5, "b", clock=clock, sleep=sleep)
    signal = AbortSignal("b")
    pacer.wait(signal)
    signal.abort("cancelled")
    with pytest.raises(JobAbortedError) as caught:
        pacer.wait(signal, "batch:1")
    assert caught.value.reason == "cancelled"
    assert 'step "batch:1"' in caught.value.message
    assert sleep.asked == []


def test_an_abort_during_the_wait_raises_at_once(clock: ManualClock) -> None:
    asked: list[float] = []

    def aborting_sleep(seconds: float, signal: AbortSignal) -> None:
        asked.append(seconds)
        signal.abort("cancelled")  # the sleeper returns early, without the clock moving

    pacer = Pacer(5, "b", clock=clock, sleep=aborting_sleep)
    signal = AbortSignal("b")
    pacer.wait(signal)
    with pytest.raises(JobAbortedError):
        pacer.wait(signal, "batch:1")
    assert asked == [pytest.approx(0.2)]


def test_the_default_sleep_ends_early_on_abort() -> None:
    pacer = Pacer(0.01, "b")  # a 100 s interval
    signal = AbortSignal("b")
    pacer.wait(signal)
    timer = threading.Timer(0.05, signal.abort, args=("cancelled",))
    timer.start()
    started = time.monotonic()
    with pytest.raises(JobAbortedError):
        pacer.wait(signal)
    timer.join()
    assert time.monotonic() - started < 5


def test_one_pacer_keeps_its_pace_across_attempts(clock: ManualClock, sleep: RecordingSleep) -> None:
    pacer = Pacer(5, "b", clock=clock, sleep=sleep)
    pacer.wait(AbortSignal("b"))  # the last batch of attempt 1
    clock.advance(0.1)
    pacer.wait(AbortSignal("b"))  # the first batch of attempt 2, same declaration
    assert sleep.asked == [pytest.approx(0.1)]


@pytest.mark.parametrize("rate", [0, -1, math.nan, math.inf, -math.inf, True, "5", None])
def test_the_constructor_refuses_a_bad_rate(rate: object) -> None:
    with pytest.raises(XError) as caught:
        Pacer(rate, "posts.fill")  # type: ignore[arg-type]
    assert caught.value.code == "X_BACKFILL_RATE"
    assert "posts.fill" in caught.value.message
    assert "no unthrottled mode" in caught.value.hint


def test_timer_overshoot_is_not_charged_to_the_next_interval(clock: ManualClock) -> None:
    """A sleeper that wakes 50% late still yields the declared rate over a pass: the next wait is
    measured from the slot waited for, not from the late wake-up."""
    asked: list[float] = []

    def late_sleep(seconds: float, signal: AbortSignal) -> None:
        asked.append(seconds)
        clock.advance(seconds * 1.5)

    pacer = Pacer(rate=10, job="late", clock=clock, sleep=late_sleep)
    start = clock.monotonic()
    for _ in range(101):
        pacer.wait(AbortSignal())
    elapsed = clock.monotonic() - start
    # 100 intervals of 0.1 s, plus at most the last wake's overshoot.
    assert 10.0 <= elapsed <= 10.0 + 0.1
    assert all(seconds <= 0.1 + 1e-9 for seconds in asked)


def test_a_very_late_wake_catches_up_at_most_one_interval(clock: ManualClock) -> None:
    asked: list[float] = []
    stall = {"seconds": 5.0}  # the first wait's wake comes 5 s late (the process was descheduled)

    def sleep(seconds: float, signal: AbortSignal) -> None:
        asked.append(seconds)
        clock.advance(stall.pop("seconds", seconds))

    pacer = Pacer(rate=10, job="stalled", clock=clock, sleep=sleep)
    pacer.wait(AbortSignal())
    clock.advance(0.01)
    pacer.wait(AbortSignal())  # asks 0.09, wakes 5 s later
    pacer.wait(AbortSignal())  # one catch-up batch without waiting...
    pacer.wait(AbortSignal())  # ...then the full interval again
    assert asked == [pytest.approx(0.09), pytest.approx(0.1)]
