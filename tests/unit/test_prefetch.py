"""How far ahead a worker claims: the adaptive depth from handler time against claim round trip,
and a worker that follows it (memory driver)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from pydantic import BaseModel

from ultimat3.core import Ctx
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import AsyncStep, Worker, WorkerEvent, job
from ultimat3.jobs.prefetch import CEILING, HORIZON, MOST, Prefetch


class Item(BaseModel):
    n: int


def handled(prefetch: Prefetch, seconds: float, times: int = 20, at: float = 100.0) -> None:
    for _ in range(times):
        prefetch.started(at)
        prefetch.finished(at, at + seconds)


def test_the_floor_holds_until_both_a_handler_and_a_claim_were_measured() -> None:
    prefetch = Prefetch(10)
    assert prefetch.depth(0.0) == 10
    handled(prefetch, 0.0001)
    assert prefetch.depth(200.0) == 10  # no round trip measured yet
    fresh = Prefetch(10)
    fresh.claimed(0.005)
    assert fresh.depth(0.0) == 10  # no handler measured yet


def test_quick_handlers_grow_the_depth_to_what_frees_in_two_round_trips() -> None:
    prefetch = Prefetch(10)
    handled(prefetch, 0.004)
    prefetch.claimed(0.005)
    # Ten slots each freeing every 4 ms: 25 jobs start in two 5 ms round trips.
    assert prefetch.depth(200.0) == 25 == round(10 * HORIZON * 0.005 / 0.004)


def test_instant_handlers_stop_at_the_ceiling_and_slow_ones_keep_the_floor() -> None:
    quick = Prefetch(10)
    handled(quick, 0.0)
    quick.claimed(0.005)
    assert quick.depth(200.0) == quick.ceiling == CEILING * 10
    slow = Prefetch(10)
    handled(slow, 0.5)
    slow.claimed(0.005)
    assert slow.depth(200.0) == 10


def test_the_ceiling_is_capped_in_jobs_and_never_below_the_floor() -> None:
    assert Prefetch(10).ceiling == CEILING * 10 < MOST
    assert Prefetch(100).ceiling == MOST
    assert Prefetch(MOST + 50).ceiling == MOST + 50  # a worker this wide keeps its floor
    wide = Prefetch(MOST + 50)
    handled(wide, 0.0)
    wide.claimed(0.005)
    assert wide.depth(200.0) == MOST + 50


def test_a_long_handler_still_running_pulls_the_depth_down_before_it_returns() -> None:
    prefetch = Prefetch(2)
    handled(prefetch, 0.0001)
    prefetch.claimed(0.01)
    assert prefetch.depth(200.0) == prefetch.ceiling
    prefetch.started(300.0)
    prefetch.started(300.5)
    # Both slots have been busy for about a second: nothing frees within a round trip.
    assert prefetch.depth(301.0) == 2
    prefetch.finished(300.0, 301.0)
    prefetch.finished(300.5, 301.0)
    # Returned: the average moved toward them, and no running handler holds it down any more.
    assert 2 <= prefetch.depth(301.0) < prefetch.ceiling


def test_the_averages_follow_a_change_within_a_few_dozen_samples() -> None:
    prefetch = Prefetch(10)
    handled(prefetch, 0.5)
    prefetch.claimed(0.005)
    assert prefetch.depth(200.0) == 10
    handled(prefetch, 0.0001, times=40)
    assert prefetch.depth(200.0) == prefetch.ceiling
    handled(prefetch, 0.5, times=40)
    assert prefetch.depth(200.0) == 10


def test_a_fixed_prefetch_ignores_every_measurement() -> None:
    for depth in (0, 3):
        fixed = Prefetch.fixed(depth)
        handled(fixed, 0.0)
        fixed.claimed(1.0)
        assert fixed.depth(200.0) == depth


class SlowDatabase(MemoryDriver):
    """A memory driver whose claims take as long as a far database's round trip."""

    def claim(self, request: Any) -> Any:
        time.sleep(0.02)
        return super().claim(request)

    def ack_and_claim(self, acks: Any, request: Any) -> Any:
        time.sleep(0.02)
        return super().ack_and_claim(acks, request)


def run_until_done(driver: MemoryDriver, count: int, on_claim: Any = None, **kwargs: Any) -> list[int]:
    """Run a worker until ``count`` attempts finished; the size of each claim, in order."""
    claims: list[int] = []
    finished = threading.Event()

    def seen(event: WorkerEvent) -> None:
        if event.kind == "claimed":
            claims.append(event.count)
            if on_claim is not None:
                on_claim()
        elif event.kind == "done" and worker.processed == count - 1:
            finished.set()  # the last attempt settles as this event is sent

    worker = Worker(driver, environment="test", poll_interval=0.01, on_event=seen, **kwargs)

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.to_thread(finished.wait, 30)
        worker.stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert finished.is_set()
    return claims


def test_a_worker_with_quick_handlers_and_a_slow_claim_claims_past_its_floor() -> None:
    driver = SlowDatabase()
    driver.migrate()
    try:
        @job(name="quick", tenant="none", input=Item)
        async def quick(input: Item, ctx: Ctx, step: AsyncStep) -> None:
            return None

        quick.enqueue_many([{"n": n} for n in range(300)], driver=driver)
        claims = run_until_done(driver, 300, concurrency=2)
        # The floor alone would hold two running and two ahead: no claim above four.
        assert sum(claims) == 300 and max(claims) > 4
        assert max(claims) <= 2 + CEILING * 2
    finally:
        driver.close()


def test_a_worker_with_slow_handlers_holds_no_more_than_its_floor(memory: MemoryDriver) -> None:
    @job(name="slow", tenant="none", input=Item)
    async def slow(input: Item, ctx: Ctx, step: AsyncStep) -> None:
        await asyncio.sleep(0.03)

    slow.enqueue_many([{"n": n} for n in range(16)], driver=memory)
    held: list[int] = []

    def count_held() -> None:
        held.append(sum(s.counts.get("running", 0) for s in memory.introspect.stats()))

    claims = run_until_done(memory, 16, on_claim=count_held, concurrency=2)
    assert sum(claims) == 16
    # Two running and two claimed ahead at most: a slow handler's slot frees long after a claim.
    assert held and max(held) <= 4


class Recorded(MemoryDriver):
    """A memory driver whose ack batches take 50 ms, recording each worker call and how many ack
    batches were already in flight when it started."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []
        self._in_flight = 0
        self._lock = threading.Lock()

    def _slow(self, kind: str, call: Any) -> Any:
        with self._lock:
            self.calls.append((kind, self._in_flight))
            self._in_flight += 1
        try:
            time.sleep(0.05)
            return call()
        finally:
            with self._lock:
                self._in_flight -= 1

    def ack_many(self, acks: Any) -> Any:
        return self._slow("ack_many", lambda: super(Recorded, self).ack_many(acks))

    def ack_and_claim(self, acks: Any, request: Any) -> Any:
        return self._slow("ack_and_claim", lambda: super(Recorded, self).ack_and_claim(acks, request))


def test_an_ack_batch_sent_while_another_rides_with_a_claim_still_claims() -> None:
    driver = Recorded()
    driver.migrate()
    try:
        @job(name="brief", tenant="none", input=Item)
        async def brief(input: Item, ctx: Ctx, step: AsyncStep) -> None:
            await asyncio.sleep(0.01)

        brief.enqueue_many([{"n": n} for n in range(8)], driver=driver)
        run_until_done(driver, 8, concurrency=1, prefetch=1)
        # Job 2 (claimed ahead) finishes while job 1's ack is in flight with the claim replacing
        # job 1: that claim's slot is not job 1's as well, so job 2's ack has a slot to claim for.
        overlapping = [kind for kind, in_flight in driver.calls if in_flight]
        assert overlapping, driver.calls
        assert all(kind == "ack_and_claim" for kind in overlapping), driver.calls
    finally:
        driver.close()
