"""A worker registers itself while it runs, leaves the registry when it stops, and rescues the
running jobs of a worker whose liveness signal is gone (memory driver; the SQL drivers are proven
by the contract suite and the process tests)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ultimat3.core import Ctx
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.drivers.protocol import WORKER_LOST, ClaimRequest, EnqueueRequest, WorkerInfo
from ultimat3.jobs import Worker, WorkerEvent, job
from ultimat3.tenancy import operator_context


async def _until(condition: Any, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_a_running_worker_is_registered_and_leaves_on_stop(memory: MemoryDriver) -> None:
    worker = Worker(memory, environment="test", worker_id="w-main", concurrency=3, queues=["a", "b"],
                    liveness_interval=0.01, poll_interval=0.01)
    seen: list[list[str]] = []

    async def scenario() -> None:
        task = asyncio.ensure_future(worker.run())
        await _until(lambda: bool(memory.workers.list()))
        [record] = memory.workers.list()
        seen.append([record.id, str(record.concurrency), ",".join(record.queues or ())])
        worker.stop()
        await task

    asyncio.run(scenario())
    assert seen == [["w-main", "3", "a,b"]]
    assert memory.workers.list() == []


def test_a_dead_workers_job_is_rescued_and_run_by_a_live_one(memory: MemoryDriver) -> None:
    runs: list[str] = []

    @job(name="t.rescued", tenant="none")
    def task(input: Any, ctx: Ctx) -> str:
        runs.append(ctx.actor.id)
        return "ok"

    with operator_context("tester", "unit test"):
        queued = task.enqueue(driver=memory)
    memory.workers.register(WorkerInfo(id="ghost", host="h", pid=1, concurrency=1))
    [held] = memory.claim(ClaimRequest(worker_id="ghost", limit=1, visibility_timeout=3600))
    memory.workers.abandon("ghost")  # the ghost's process died holding the claim
    events: list[WorkerEvent] = []
    worker = Worker(memory, environment="test", worker_id="alive", liveness_interval=0.01, poll_interval=0.01,
                    on_event=events.append)

    async def scenario() -> None:
        running = asyncio.ensure_future(worker.run())
        await _until(lambda: (memory.introspect.get(queued.id) or held.job).state == "done")
        worker.stop()
        await running

    asyncio.run(scenario())
    record = memory.introspect.get(queued.id)
    assert record is not None and record.state == "done" and record.attempt == 2
    assert len(runs) == 1  # the ghost never ran it here; the live worker ran it once
    assert [e.job_id for e in events if e.kind == "rescued"] == [queued.id]
    assert memory.ack(held.job.id, held.claim_token, "late") is False  # the ghost is fenced out


def test_a_second_live_worker_under_the_same_id_is_refused(memory: MemoryDriver) -> None:
    memory.workers.register(WorkerInfo(id="twin", host="h", pid=1, concurrency=1))
    worker = Worker(memory, environment="test", worker_id="twin")
    with pytest.raises(DriverError) as caught:
        asyncio.run(worker.run())
    assert caught.value.code == "X_WORKER_ID_TAKEN"


def test_liveness_can_be_turned_off(memory: MemoryDriver) -> None:
    worker = Worker(memory, environment="test", liveness_interval=None, poll_interval=0.01)

    async def scenario() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.sleep(0.05)
        assert memory.workers.list() == []
        worker.stop()
        await task

    asyncio.run(scenario())


def test_a_bad_liveness_interval_is_refused(memory: MemoryDriver) -> None:
    with pytest.raises(Exception) as caught:
        Worker(memory, liveness_interval=0)
    assert getattr(caught.value, "code", None) == "X_WORKER_CONFIG"


def test_the_rescued_jobs_error_names_the_dead_worker(memory: MemoryDriver) -> None:
    memory.workers.register(WorkerInfo(id="gone", host="h", pid=1, concurrency=1))
    memory.enqueue(EnqueueRequest(name="x", payload={}))
    memory.claim(ClaimRequest(worker_id="gone"))
    memory.workers.abandon("gone")
    [rescued] = memory.workers.rescue("me")
    record = memory.introspect.get(rescued.job_id)
    assert record is not None and record.last_error is not None
    assert record.last_error.startswith(WORKER_LOST) and "(gone)" in record.last_error


def test_run_returns_only_after_its_last_driver_call_ended(memory: MemoryDriver) -> None:
    # The owner closes the driver as soon as run() returns (x worker does): a liveness probe that was
    # still running in its thread then used a closed SQLite connection and crashed the process.
    import threading

    entered, release, ended = threading.Event(), threading.Event(), threading.Event()
    beat = memory.workers.beat

    def held_beat(*args: Any, **kwargs: Any) -> bool:
        entered.set()
        release.wait(5)
        try:
            return beat(*args, **kwargs)
        finally:
            ended.set()

    memory.workers.beat = held_beat  # type: ignore[method-assign]
    worker = Worker(memory, environment="test", worker_id="w-slow", liveness_interval=0.01, poll_interval=0.01)

    async def scenario() -> None:
        task = asyncio.ensure_future(worker.run())
        await _until(entered.is_set)
        worker.stop()
        done, _ = await asyncio.wait({task}, timeout=0.2)  # the old code returned within milliseconds
        assert not done, "run() returned while a probe was still running in its thread"
        release.set()
        await task
        assert ended.is_set()

    asyncio.run(scenario())


@pytest.mark.parametrize("freeze", [True, False])
def test_run_freezes_the_gc_only_when_asked(memory: MemoryDriver, monkeypatch: pytest.MonkeyPatch,
                                            freeze: bool) -> None:
    import gc

    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    worker = Worker(memory, environment="test", worker_id="w-gc", liveness_interval=None, poll_interval=0.01,
                    freeze_gc=freeze)
    assert Worker(memory, environment="test").freeze_gc is False  # the default: a library leaves the GC alone

    async def scenario() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.sleep(0)
        worker.stop()
        await task

    asyncio.run(scenario())
    assert calls == (["freeze"] if freeze else [])
