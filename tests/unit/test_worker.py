"""The worker over the memory driver: steps replay, retries, dead-letter, suspension, timeout,
cancel and shutdown. Time that matters to a rule moves on the ManualClock; only heartbeats and
timeouts run on short real timers (no test sleeps for a fixed time to pass)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel

from ultimat3.core import Actor, Ctx, Grant, ManualClock, XError, current_ctx
from ultimat3.core.context import run_context
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import (
    AsyncStep,
    JobAbortedError,
    RetryPolicy,
    SyncStep,
    Worker,
    WorkerEvent,
    job,
)

NO_JITTER = RetryPolicy(max_attempts=3, base=10, factor=2, cap=60, jitter=0)


class Item(BaseModel):
    n: int


def drain(driver: MemoryDriver, **kwargs: Any) -> int:
    worker = Worker(driver, environment="test", **kwargs)
    try:
        return asyncio.run(worker.drain())
    finally:
        worker.close()


def state(driver: MemoryDriver, job_id: str) -> str:
    row = driver.introspect.get(job_id)
    assert row is not None
    return row.state


def test_async_and_sync_handlers_run_and_store_results(memory: MemoryDriver) -> None:
    @job(name="double", tenant="none", input=Item)
    async def double(input: Item, ctx: Ctx, step: AsyncStep) -> dict[str, int]:
        return {"value": input.n * 2}

    @job(name="triple", tenant="none", input=Item)
    def triple(input: Item, ctx: Ctx, step: SyncStep) -> int:
        return input.n * 3

    a = double.enqueue({"n": 2}, driver=memory)
    b = triple.enqueue({"n": 2}, driver=memory)
    assert drain(memory) == 2
    row_a, row_b = memory.introspect.get(a.id), memory.introspect.get(b.id)
    assert row_a is not None and row_a.state == "done" and row_a.result == {"value": 4}
    assert row_b is not None and row_b.state == "done" and row_b.result == 6
    assert row_a.attempt == 1


def test_handler_runs_under_the_job_context(memory: MemoryDriver) -> None:
    seen: list[Ctx] = []

    @job(name="ctx.org", tenant=lambda i: f"org-{i.n}", input=Item)
    def handler(input: Item, ctx: Ctx, step: SyncStep) -> None:
        seen.append(current_ctx())

    result = handler.enqueue({"n": 4}, driver=memory)
    drain(memory)
    assert seen[0].actor.org_id == "org-4"
    assert seen[0].actor.id == f"job:ctx.org:{result.id}"
    assert seen[0].environment == "test"
    assert not seen[0].actor.scopes


def test_a_run_context_is_the_context_it_stands_for() -> None:
    """run_context (built without the frozen dataclasses' __init__) equals the context built the
    ordinary way, stays frozen, and copies like one."""
    tick = datetime(2026, 1, 1, tzinfo=UTC)
    grant = Grant("system", "a test")
    built = run_context("job:a:1", "org-1", "test", "00-trace", (grant,), tick)
    assert built == Ctx(actor=Actor(id="job:a:1", org_id="org-1"), environment="test", traceparent="00-trace",
                        grants=(grant,), tick=tick)
    assert hash(built.actor) == hash(Actor(id="job:a:1", org_id="org-1"))
    with pytest.raises(FrozenInstanceError):
        built.actor.id = "someone else"  # type: ignore[misc]
    assert built.actor.with_scope("ops").scopes == frozenset({"ops"}) and built.actor.scopes == frozenset()


def test_steps_replay_on_retry_without_rerunning(memory: MemoryDriver, clock: ManualClock) -> None:
    calls: list[str] = []

    @job(name="steps", tenant="none", retry=NO_JITTER)
    async def steps(input: Any, ctx: Ctx, step: AsyncStep) -> list[int]:
        async def charge() -> int:
            calls.append("charge")
            return 42

        first = await step.run("charge", charge)
        second = await step.run("email", lambda: calls.append("email") or 7)
        if len(calls) < 4:
            raise RuntimeError("flaky network")
        return [first, second]

    result = steps.enqueue(driver=memory)
    drain(memory)
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "ready" and row.attempt == 1
    assert "flaky network" in (row.last_error or "")
    assert row.run_at.timestamp() == pytest.approx(clock.now() + 10)
    assert drain(memory) == 0  # not runnable before its backoff passes
    clock.advance(10)
    drain(memory)
    # Recorded steps were replayed: the attempt raised again, no step ran twice.
    assert calls == ["charge", "email"]
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "ready" and row.attempt == 2
    assert row.run_at.timestamp() == pytest.approx(clock.now() + 20)


def test_dead_letter_after_last_attempt_keeps_error(memory: MemoryDriver, clock: ManualClock) -> None:
    @job(name="always.fails", tenant="none", retry=NO_JITTER)
    def fails(input: Any, ctx: Ctx, step: SyncStep) -> None:
        raise ValueError("bad data in row 7")

    result = fails.enqueue(driver=memory)
    for _ in range(3):
        drain(memory)
        clock.advance(100)
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "dead" and row.attempt == 3
    assert "ValueError: bad data in row 7" in (row.last_error or "")
    assert row.finished_at is not None


def test_non_retryable_error_dead_letters_at_once(memory: MemoryDriver) -> None:
    @job(name="permanent", tenant="none", retry=NO_JITTER)
    def permanent(input: Any, ctx: Ctx, step: SyncStep) -> None:
        err = XError("this can never work", "fix the data", code="X_APP_PERMANENT")
        err.retryable = False
        raise err

    result = permanent.enqueue(driver=memory)
    drain(memory)
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "dead" and row.attempt == 1
    assert "X_APP_PERMANENT" in (row.last_error or "")


def test_duplicate_step_name_is_refused(memory: MemoryDriver) -> None:
    @job(name="dup.steps", tenant="none", retry=NO_JITTER)
    def dup(input: Any, ctx: Ctx, step: SyncStep) -> None:
        step.run("a", lambda: 1)
        step.run("a", lambda: 2)

    result = dup.enqueue(driver=memory)
    drain(memory)
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "dead"
    assert "X_STEP_DUPLICATE" in (row.last_error or "")
    assert '"a"' in (row.last_error or "")


def test_step_result_must_be_json(memory: MemoryDriver) -> None:
    @job(name="bad.step", tenant="none", retry=NO_JITTER)
    def bad(input: Any, ctx: Ctx, step: SyncStep) -> None:
        step.run("obj", lambda: object())

    result = bad.enqueue(driver=memory)
    drain(memory)
    row = memory.introspect.get(result.id)
    assert row is not None and "X_STEP_RESULT" in (row.last_error or "")


def test_sleep_suspends_without_burning_an_attempt(memory: MemoryDriver, clock: ManualClock) -> None:
    calls: list[str] = []

    @job(name="drip", tenant="none", retry=RetryPolicy(max_attempts=1))
    async def drip(input: Any, ctx: Ctx, step: AsyncStep) -> str:
        await step.run("welcome", lambda: calls.append("welcome") or "sent")
        await step.sleep("wait-3-days", "3d")
        await step.run("follow-up", lambda: calls.append("follow-up") or "sent")
        return "finished"

    result = drip.enqueue(driver=memory)
    drain(memory)
    row = memory.introspect.get(result.id)
    # max_attempts=1 and still alive: a suspension is not an attempt.
    assert row is not None and row.state == "suspended" and row.attempt == 0
    clock.advance(86400)
    assert drain(memory) == 0
    clock.advance(2 * 86400)
    drain(memory)
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "done" and row.result == "finished"
    assert calls == ["welcome", "follow-up"]


def test_timeout_aborts_the_attempt_and_retries(memory: MemoryDriver) -> None:
    observed: list[str | None] = []

    @job(name="slow", tenant="none", timeout=0.05, retry=NO_JITTER)
    def slow(input: Any, ctx: Ctx, step: SyncStep) -> None:
        step.signal.wait(5)  # returns as soon as the worker aborts the attempt
        observed.append(step.signal.reason)
        step.signal.raise_if_aborted()

    result = slow.enqueue(driver=memory)
    drain(memory)
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "ready" and row.attempt == 1
    assert "X_JOB_TIMEOUT" in (row.last_error or "")
    assert observed == ["timeout"]


def test_async_timeout_cancels_the_task(memory: MemoryDriver) -> None:
    cancelled = threading.Event()
    reasons: list[str | None] = []

    @job(name="slow.async", tenant="none", timeout=0.05, retry=RetryPolicy(max_attempts=1))
    async def slow(input: Any, ctx: Ctx, step: AsyncStep) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            reasons.append(step.signal.reason)  # the signal says why while the handler unwinds
            raise

    result = slow.enqueue(driver=memory)
    drain(memory)
    assert cancelled.is_set()
    assert reasons == ["timeout"]
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "dead"
    assert "X_JOB_TIMEOUT" in (row.last_error or "")


def test_cancel_reaches_a_running_attempt_through_heartbeat(memory: MemoryDriver) -> None:
    started = threading.Event()
    reasons: list[str | None] = []

    @job(name="long", tenant="none")
    def long(input: Any, ctx: Ctx, step: SyncStep) -> None:
        started.set()
        step.signal.wait(10)
        reasons.append(step.signal.reason)
        step.run("after-cancel", lambda: "must not be recorded")

    result = long.enqueue(driver=memory)

    def cancel_when_started() -> None:
        started.wait(10)
        memory.cancel(result.id, "operator said stop")

    canceller = threading.Thread(target=cancel_when_started)
    canceller.start()
    events: list[WorkerEvent] = []
    drain(memory, visibility_timeout=5, heartbeat_interval=0.01, on_event=events.append)
    canceller.join()
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "cancelled" and row.last_error == "operator said stop"
    assert reasons == ["cancelled"]
    assert memory.steps.load(row.run_id) == {}
    assert [e.kind for e in events if e.kind != "claimed"] == ["aborted"]


def test_stale_attempt_cannot_record_steps_or_ack(memory: MemoryDriver, clock: ManualClock) -> None:
    """A worker whose claim lapsed and was re-taken is fenced out of steps and settlement."""
    release = threading.Event()
    entered = threading.Event()

    @job(name="stale", tenant="none")
    def stale(input: Any, ctx: Ctx, step: SyncStep) -> str:
        entered.set()
        release.wait(10)
        step.run("late", lambda: "from the stale attempt")
        return "stale result"

    result = stale.enqueue(driver=memory)

    def steal() -> None:
        entered.wait(10)
        clock.advance(60)  # the first claim's visibility lapses...
        from ultimat3.jobs import ClaimRequest

        taken = memory.claim(ClaimRequest(worker_id="other", visibility_timeout=300))
        assert [c.job.id for c in taken] == [result.id]  # ...and another worker re-claims
        release.set()

    thief = threading.Thread(target=steal)
    thief.start()
    # Heartbeats far apart so only the fence, not a heartbeat, can stop the stale attempt.
    drain(memory, visibility_timeout=30, heartbeat_interval=10)
    thief.join()
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "running" and row.claimed_by == "other"
    assert memory.steps.load(row.run_id) == {}


def test_shutdown_releases_unfinished_attempts_without_burning_them(memory: MemoryDriver) -> None:
    entered = threading.Event()

    @job(name="stubborn", tenant="none", retry=RetryPolicy(max_attempts=1))
    def stubborn(input: Any, ctx: Ctx, step: SyncStep) -> None:
        entered.set()
        step.signal.wait(10)
        step.signal.raise_if_aborted()

    result = stubborn.enqueue(driver=memory)
    worker = Worker(memory, environment="test", grace_period=0.05, poll_interval=0.01)

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.to_thread(entered.wait, 10)
        worker.stop()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    row = memory.introspect.get(result.id)
    # A release is a return to ready: no claim, the attempt given back, no error recorded.
    assert row is not None and row.state == "ready" and row.attempt == 0
    assert row.claimed_by is None and row.last_error is None


def test_run_loop_picks_up_new_jobs_and_stops(memory: MemoryDriver) -> None:
    done = threading.Event()
    seen: list[int] = []

    @job(name="collect", tenant="none", input=Item)
    async def collect(input: Item, ctx: Ctx, step: AsyncStep) -> None:
        seen.append(input.n)
        if len(seen) == 20:
            done.set()

    worker = Worker(memory, environment="test", concurrency=4, poll_interval=5)

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.sleep(0)
        for n in range(20):  # enqueued after the worker went idle: the subscription wakes it
            await collect.aenqueue({"n": n}, driver=memory)
        await asyncio.to_thread(done.wait, 10)
        worker.stop()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    assert sorted(seen) == list(range(20))


def test_aborted_error_without_abort_is_a_failure(memory: MemoryDriver) -> None:
    @job(name="raises.aborted", tenant="none", retry=RetryPolicy(max_attempts=1))
    def handler(input: Any, ctx: Ctx, step: SyncStep) -> None:
        raise JobAbortedError("raises.aborted", "made up")

    result = handler.enqueue(driver=memory)
    drain(memory)
    assert state(memory, result.id) == "dead"


def test_attempts_exhausted_by_lost_workers_dead_letters(memory: MemoryDriver, clock: ManualClock) -> None:
    from ultimat3.jobs import ClaimRequest

    @job(name="poison", tenant="none", retry=RetryPolicy(max_attempts=2))
    def poison(input: Any, ctx: Ctx, step: SyncStep) -> None:
        raise AssertionError("must not run: its attempts were spent by lost workers")

    result = poison.enqueue(driver=memory)
    for _ in range(2):  # two workers claim it and die without settling
        memory.claim(ClaimRequest(worker_id="doomed", visibility_timeout=1))
        clock.advance(2)
    drain(memory)
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "dead"
    assert "X_JOB_ATTEMPTS_EXHAUSTED" in (row.last_error or "")


def test_worker_config_is_validated(memory: MemoryDriver) -> None:
    with pytest.raises(XError) as caught:
        Worker(memory, concurrency=0)
    assert caught.value.code == "X_WORKER_CONCURRENCY"
    with pytest.raises(XError) as caught:
        Worker(memory, visibility_timeout=3, heartbeat_interval=5)
    assert caught.value.code == "X_WORKER_CONFIG"


def test_acks_of_attempts_finishing_together_share_one_commit(memory: MemoryDriver) -> None:
    batches: list[int] = []
    original = memory.ack_many

    def counting_ack_many(acks: Any) -> list[bool]:
        batches.append(len(acks))
        return original(acks)

    memory.ack_many = counting_ack_many  # type: ignore[method-assign]
    gate = asyncio.Event()
    arrived: list[int] = []

    @job(name="together", tenant="none", input=Item)
    async def together(input: Item, ctx: Ctx, step: AsyncStep) -> int:
        arrived.append(input.n)
        if len(arrived) == 5:
            gate.set()
        await gate.wait()
        return input.n

    together.enqueue_many([{"n": n} for n in range(5)], driver=memory)
    drain(memory, concurrency=5, ack_delay=1.0)
    assert sum(batches) == 5 and max(batches) > 1, batches
    assert sorted(job.result for job in memory.introspect.list()) == [0, 1, 2, 3, 4]


def test_acks_of_handlers_that_never_wait_share_one_commit_at_once(memory: MemoryDriver) -> None:
    """Attempts started together whose handlers return without awaiting (on 3.12+ each runs to its
    ack inside the start itself): one commit for all of them, written when the last one acks, not
    one per ack and not after ack_delay."""
    batches: list[int] = []
    for name in ("ack_many", "ack_and_claim"):
        original = getattr(memory, name)

        def counting(acks: Any, *rest: Any, _original: Any = original) -> Any:
            batches.append(len(acks))
            return _original(acks, *rest)

        setattr(memory, name, counting)

    @job(name="at.once", tenant="none", input=Item)
    async def at_once(input: Item, ctx: Ctx, step: AsyncStep) -> int:
        return input.n

    at_once.enqueue_many([{"n": n} for n in range(5)], driver=memory)
    worker = Worker(memory, environment="test", concurrency=5, ack_delay=30)
    try:
        assert asyncio.run(asyncio.wait_for(worker.drain(), 5)) == 5
    finally:
        worker.close()
    assert batches == [5]
    assert sorted(job.result for job in memory.introspect.list()) == [0, 1, 2, 3, 4]


def test_an_ack_still_queued_at_stop_is_written_before_run_returns(memory: MemoryDriver) -> None:
    """An attempt ends with its ack's commit, not when its handler returns: an ack still waiting
    for company (ack_delay far off) when the worker stops is written by the shutdown, and the
    'done' event comes once the row says so."""
    finished, entered = threading.Event(), threading.Event()
    states: list[str] = []

    @job(name="quick", tenant="none")
    async def quick(input: Any, ctx: Ctx, step: AsyncStep) -> str:
        finished.set()
        return "ok"

    @job(name="slow", tenant="none")
    async def slow(input: Any, ctx: Ctx, step: AsyncStep) -> None:
        entered.set()
        await asyncio.Event().wait()  # until the shutdown cancels it

    def on_event(event: WorkerEvent) -> None:
        if event.kind == "done" and event.job_id is not None:
            states.append(state(memory, event.job_id))

    first = slow.enqueue(driver=memory)
    second = quick.enqueue(driver=memory)
    worker = Worker(memory, environment="test", concurrency=2, ack_delay=30, grace_period=0.05,
                    poll_interval=0.01, on_event=on_event)

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.to_thread(entered.wait, 10)
        await asyncio.to_thread(finished.wait, 10)
        worker.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert state(memory, second.id) == "done" and states == ["done"]
    row = memory.introspect.get(first.id)
    assert row is not None and row.state == "ready" and row.attempt == 0  # released, not burned


def test_a_lone_ack_is_not_held_back(memory: MemoryDriver) -> None:
    """With nothing else running, the ack is written at once, not after ack_delay."""

    @job(name="alone", tenant="none")
    async def alone(input: Any, ctx: Ctx, step: AsyncStep) -> str:
        return "ok"

    alone.enqueue(driver=memory)
    worker = Worker(memory, environment="test", concurrency=4, ack_delay=30)
    try:
        assert asyncio.run(asyncio.wait_for(worker.drain(), 5)) == 1
    finally:
        worker.close()
    assert memory.introspect.list()[0].state == "done"


def test_a_worker_with_prune_after_deletes_finished_jobs_older_than_that(
    memory: MemoryDriver, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ultimat3.jobs.worker as worker_module

    monkeypatch.setattr(worker_module, "PRUNE_INTERVAL", 0.01)

    @job(name="noop", tenant="none", input=Item)
    def noop(input: Item, ctx: Ctx) -> None:
        return None

    old = noop.enqueue({"n": 1}, driver=memory).id
    assert drain(memory) == 1
    clock.advance(8 * 86400)
    recent = noop.enqueue({"n": 2}, driver=memory).id
    assert drain(memory) == 1
    worker = Worker(memory, environment="test", liveness_interval=None, schedules=False, prune_after=7 * 86400)

    async def run() -> None:
        task = asyncio.ensure_future(worker._prune(7 * 86400))
        for _ in range(200):
            if memory.introspect.get(old) is None:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(run())
    worker.close()
    assert memory.introspect.get(old) is None
    assert state(memory, recent) == "done"


def test_prune_after_must_be_positive(memory: MemoryDriver) -> None:
    with pytest.raises(XError) as refused:
        Worker(memory, prune_after=0)
    assert refused.value.code == "X_WORKER_CONFIG" and "prune_after=0" in refused.value.message


def test_an_abort_that_lands_after_an_async_handler_returned_does_not_cancel_its_ack(memory: MemoryDriver) -> None:
    # The handler runs in the attempt's own task, which the signal cancels: once the handler has
    # returned, a late abort (a heartbeat that lost the race, a stop) must not hit the settle.
    @job(name="late.abort", tenant="none")
    async def late(input: Any, ctx: Ctx, step: AsyncStep) -> str:
        asyncio.get_running_loop().call_soon(step.signal.abort, "cancelled")
        return "finished"

    result = late.enqueue(driver=memory)
    assert drain(memory) == 1
    row = memory.introspect.get(result.id)
    assert row is not None and row.state == "done" and row.result == "finished"


def test_an_async_handler_cancelled_mid_await_ends_at_once_and_the_worker_carries_on(memory: MemoryDriver) -> None:
    seen: list[str] = []

    @job(name="cancel.mid", tenant="none")
    async def waits(input: Any, ctx: Ctx, step: AsyncStep) -> None:
        asyncio.get_running_loop().call_later(0.01, step.signal.abort, "cancelled")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    @job(name="after.cancel", tenant="none")
    async def after(input: Any, ctx: Ctx) -> str:
        return "ran"

    first = waits.enqueue(driver=memory)
    second = after.enqueue(driver=memory)
    started = time.monotonic()
    drain(memory, concurrency=1)
    assert time.monotonic() - started < 5  # not the 30 s sleep
    assert seen == ["cancelled"]
    assert state(memory, first.id) == "running"  # aborted: nothing written; the claim lapses (or a cancel wrote it)
    assert state(memory, second.id) == "done"


def test_jobs_claimed_ahead_go_back_to_ready_unburned_at_stop(memory: MemoryDriver) -> None:
    entered = threading.Event()

    @job(name="holder", tenant="none", input=Item, retry=RetryPolicy(max_attempts=1))
    def holder(input: Item, ctx: Ctx, step: SyncStep) -> None:
        entered.set()
        step.signal.wait(10)
        step.signal.raise_if_aborted()

    ids = [holder.enqueue({"n": n}, driver=memory).id for n in range(3)]
    worker = Worker(memory, environment="test", concurrency=1, prefetch=2, grace_period=0.05, poll_interval=0.01)

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.to_thread(entered.wait, 10)
        # One running, two claimed ahead of a free slot: the worker holds all three claims.
        assert [state(memory, job_id) for job_id in ids] == ["running"] * 3
        worker.stop()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    rows = [memory.introspect.get(job_id) for job_id in ids]
    assert all(r is not None and r.state == "ready" and r.attempt == 0 and r.claimed_by is None for r in rows)


def test_prefetch_zero_claims_only_for_free_slots_and_a_bad_prefetch_is_refused(memory: MemoryDriver) -> None:
    claimed: list[int] = []
    finished = threading.Event()

    @job(name="quick", tenant="none", input=Item)
    async def quick(input: Item, ctx: Ctx, step: AsyncStep) -> None:
        return None

    def seen(event: WorkerEvent) -> None:
        if event.kind == "claimed":
            claimed.append(event.count)
        elif event.kind == "done" and sum(claimed) == 6 and worker.processed == 5:
            finished.set()  # the sixth attempt settles as this event is sent

    for n in range(6):
        quick.enqueue({"n": n}, driver=memory)
    worker = Worker(memory, environment="test", concurrency=2, prefetch=0, poll_interval=0.01, on_event=seen)

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.to_thread(finished.wait, 10)
        worker.stop()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    assert claimed and max(claimed) <= 2 and sum(claimed) == 6
    for bad in (-1, 1.5, True):
        with pytest.raises(XError) as caught:
            Worker(memory, environment="test", prefetch=bad)  # type: ignore[arg-type]
        assert caught.value.code == "X_WORKER_CONFIG"
