"""Flow control as declared on a job: the declarations refused where they are written, the keys an
enqueue stores, singletons, and a worker that keeps to the limits (memory driver, manual clock;
the same rules on every driver are the contract's `flow` concern)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from ultimat3.core import Ctx, ManualClock, XError
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import JobFilter, Worker, job, limit, rate_limit


class Mail(BaseModel):
    org: str
    n: int = 0


def declare(**flow: Any) -> Any:
    @job(name="mail.send", tenant="none", input=Mail, **flow)
    def send(value: Mail, ctx: Ctx) -> None:
        return None

    return send


@pytest.mark.parametrize(("flow", "code"), [
    ({"concurrency": limit(max=0)}, "X_FLOW_LIMIT"),
    ({"concurrency": limit(max=True)}, "X_FLOW_LIMIT"),
    ({"concurrency": limit(max=2.5)}, "X_FLOW_LIMIT"),  # type: ignore[arg-type]
    ({"concurrency": 3}, "X_FLOW_LIMIT"),
    ({"concurrency": limit(max=2, key="org")}, "X_FLOW_KEY"),  # type: ignore[arg-type]
    ({"concurrency": limit(max=2, group="bad group")}, "X_FLOW_KEY"),
    ({"rate": rate_limit("fast")}, "X_FLOW_RATE"),
    ({"rate": rate_limit("14 per second")}, "X_FLOW_RATE"),
    ({"rate": rate_limit("0/s")}, "X_FLOW_RATE"),
    ({"rate": rate_limit("5/0s")}, "X_FLOW_RATE"),
    ({"rate": rate_limit("14/s", burst=0)}, "X_FLOW_RATE"),
    ({"rate": "14/s"}, "X_FLOW_RATE"),
    ({"singleton": "always"}, "X_FLOW_SINGLETON"),
    ({"singleton": True, "concurrency": limit(max=2)}, "X_FLOW_SINGLETON"),
    ({"singleton": "skip", "idempotency_key": lambda value: value.org}, "X_FLOW_SINGLETON"),
])
def test_bad_declarations_are_coded_errors_naming_the_job(flow: dict[str, Any], code: str) -> None:
    with pytest.raises(XError) as raised:
        declare(**flow)
    assert raised.value.code == code
    assert 'job "mail.send"' in raised.value.message
    assert raised.value.hint


@pytest.mark.parametrize(("text", "per_second"), [
    ("14/s", 14.0), ("100/m", 100 / 60), ("5/10s", 0.5), ("1000/h", 1000 / 3600), ("2/day", 2 / 86400),
    (" 3 / 500ms ", 6.0), ("1.5/sec", 1.5), ("60/minute", 1.0),
])
def test_rates_parse(text: str, per_second: float) -> None:
    assert rate_limit(text).per_second == pytest.approx(per_second)
    assert rate_limit(text).invalid is None


def test_enqueue_stores_the_keys(memory: MemoryDriver) -> None:
    handle = declare(concurrency=limit(max=2, key=lambda value: value.org),
                     rate=rate_limit("14/s", burst=7, group="smtp"))
    record = memory.introspect.get(handle.enqueue({"org": "acme"}, driver=memory).id)
    assert record is not None
    assert (record.flow_key, record.flow_max) == ("mail.send|acme", 2)
    assert (record.rate_key, record.rate_per_second, record.rate_burst) == ("smtp", 14.0, 7)


def test_a_key_function_that_raises_refuses_the_enqueue(memory: MemoryDriver) -> None:
    handle = declare(concurrency=limit(max=2, key=lambda value: {"acme": "a"}[value.org]))
    with pytest.raises(XError) as raised:
        handle.enqueue({"org": "other"}, driver=memory)
    assert raised.value.code == "X_JOB_INPUT"
    assert "concurrency key function raised KeyError" in raised.value.message
    with pytest.raises(XError) as raised:
        handle.enqueue_many([{"org": "acme"}, {"org": "other"}], driver=memory)
    assert raised.value.code == "X_JOB_INPUT"
    assert raised.value.message.startswith("inputs[1]: ")
    assert memory.introspect.list() == []


def test_a_key_function_must_return_a_key(memory: MemoryDriver) -> None:
    handle = declare(rate=rate_limit("1/s", key=lambda value: None))
    with pytest.raises(XError) as raised:
        handle.enqueue({"org": "acme"}, driver=memory)
    assert raised.value.code == "X_JOB_INPUT"
    assert "returned None" in raised.value.message


def test_singleton_skip_returns_the_live_run(memory: MemoryDriver) -> None:
    handle = declare(singleton="skip")
    first = handle.enqueue({"org": "a"}, driver=memory)
    second = handle.enqueue({"org": "b"}, driver=memory)
    assert second.deduped and second.id == first.id
    assert memory.introspect.count(JobFilter()) == 1


def test_singleton_replace_cancels_the_live_run(memory: MemoryDriver) -> None:
    handle = declare(singleton="replace")
    first = handle.enqueue({"org": "a"}, driver=memory)
    second = handle.enqueue({"org": "b"}, driver=memory)
    assert not second.deduped and second.id != first.id
    old = memory.introspect.get(first.id)
    assert old is not None and old.state == "cancelled"
    assert old.last_error is not None and old.last_error.startswith("X_JOB_REPLACED")
    new = memory.introspect.get(second.id)
    assert new is not None and new.payload == {"org": "b", "n": 0} and new.flow_max == 1
    with pytest.raises(XError) as raised:
        handle.enqueue_many([{"org": "c"}, {"org": "d"}], driver=memory)
    assert raised.value.code == "X_FLOW_SINGLETON"
    assert "2 inputs at once" in raised.value.message and raised.value.hint
    with pytest.raises(XError) as raised:
        handle.enqueue({"org": "c"}, driver=memory, connection=object())
    assert raised.value.code == "X_FLOW_SINGLETON"
    assert "connection=" in raised.value.message and raised.value.hint
    live = [j for j in memory.introspect.list() if j.state not in ("cancelled",)]
    assert [j.id for j in live] == [second.id]  # the refused enqueues wrote nothing, cancelled nothing


def test_singleton_replace_async(memory: MemoryDriver) -> None:
    handle = declare(singleton="replace")
    first = handle.enqueue({"org": "a"}, driver=memory)
    second = asyncio.run(handle.aenqueue({"org": "b"}, driver=memory))
    assert second.id != first.id
    old = memory.introspect.get(first.id)
    assert old is not None and old.state == "cancelled"


def test_a_worker_keeps_to_the_limit_per_key(memory: MemoryDriver, clock: ManualClock) -> None:
    running: dict[str, int] = {}
    peak: dict[str, int] = {}

    @job(name="sync.org", tenant="none", input=Mail, concurrency=limit(max=2, key=lambda value: value.org))
    async def sync(value: Mail, ctx: Ctx) -> None:
        running[value.org] = running.get(value.org, 0) + 1
        peak[value.org] = max(peak.get(value.org, 0), running[value.org])
        for _ in range(5):  # let every other started attempt run too
            await asyncio.sleep(0)
        running[value.org] -= 1

    @job(name="plain", tenant="none")
    def plain(value: Any, ctx: Ctx) -> None:
        return None

    for n in range(12):
        sync.enqueue({"org": "acme" if n % 3 else "globex", "n": n}, driver=memory)
    plain.enqueue(driver=memory)
    clock.advance(1)
    worker = Worker(memory, concurrency=10, environment="test")
    try:
        assert asyncio.run(worker.drain()) == 13
    finally:
        worker.close()
    assert peak == {"acme": 2, "globex": 2}
    assert memory.introspect.count(JobFilter(), states=("done",)) == 13
    assert {j.attempt for j in memory.introspect.list()} == {1}


class _AckAfterClaim(MemoryDriver):
    """An ack batch that commits only once a claim has read the rows it is about to settle: the
    race a drain meets when it claims again as soon as a handler returns."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.claimed, self.acked = threading.Event(), threading.Event()

    def claim(self, request: Any) -> Any:
        # The first claim made while a row is still running (its ack held back until this read).
        racing = not self.claimed.is_set() and any(j.state == "running" for j in self._store.jobs.values())
        batch = super().claim(request)
        if racing:
            self.claimed.set()
            self.acked.wait(10)  # return after the ack committed, as the slower call of the two
        return batch

    def ack_many(self, acks: Any) -> list[bool]:
        self.claimed.wait(10)
        try:
            return super().ack_many(acks)
        finally:
            self.acked.set()


def test_a_drain_claims_again_when_its_claim_raced_the_last_ack(clock: ManualClock) -> None:
    """The claim saw the key still at its limit (its row not yet acked) and took nothing; by the
    time it returned the ack had committed and nothing was held. The drain asks again instead of
    calling the queue empty."""
    driver = _AckAfterClaim(clock)
    driver.migrate()

    @job(name="sync.org", tenant="none", input=Mail, concurrency=limit(max=1, key=lambda value: value.org))
    async def sync(value: Mail, ctx: Ctx) -> None:
        await asyncio.sleep(0)  # ends after the drain's fill: the drain waits on it, not on its ack

    for n in range(2):
        sync.enqueue({"org": "acme", "n": n}, driver=driver)
    clock.advance(1)
    worker = Worker(driver, concurrency=10, environment="test")
    try:
        assert asyncio.run(worker.drain()) == 2
        assert driver.claimed.is_set()  # the race did happen
    finally:
        worker.close()
        driver.close()
    assert driver.introspect.count(JobFilter(), states=("done",)) == 2


def test_a_fair_worker_starts_a_small_tenant_within_its_first_claims(memory: MemoryDriver, clock: ManualClock) -> None:
    class Org(BaseModel):
        org: str

    @job(name="report", tenant=lambda value: value.org, input=Org)
    def report(value: Org, ctx: Ctx) -> None:
        return None

    report.enqueue_many([{"org": "big"}] * 300, driver=memory)
    clock.advance(1)
    small = report.enqueue_many([{"org": "small"}] * 5, driver=memory)
    clock.advance(1)
    for fair, finished in ((False, 0), (True, 5)):
        worker = Worker(memory, concurrency=5, environment="test", fair=fair)
        try:
            assert asyncio.run(worker.drain(max_jobs=12)) == 12
        finally:
            worker.close()
        done = [memory.introspect.get(r.id) for r in small]
        assert sum(1 for j in done if j is not None and j.state == "done") == finished
