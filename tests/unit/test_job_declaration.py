"""@job declarations and enqueue validation: bad input is refused with a coded error and nothing written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from ultimat3.core import Actor, Ctx, ManualClock, XError, use_ctx
from ultimat3.core.context import CROSS_TENANT_SCOPE
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import JobDuplicateError, JobFilter, RetryPolicy, get_job, job, registered_jobs
from ultimat3.tenancy import granted


class Invoice(BaseModel):
    org_id: str
    invoice_id: int
    email: str


def noop(input: Any, ctx: Ctx, step: Any) -> None:
    return None


def declare(**overrides: Any) -> Any:
    fields: dict[str, Any] = {"name": "billing.send", "tenant": lambda i: i.org_id, "input": Invoice}
    fields.update(overrides)
    return job(**fields)(noop)


def test_declaration_registers_the_handle() -> None:
    handle = declare()
    assert get_job("billing.send") is handle
    assert registered_jobs() == [handle]
    assert handle.retry.max_attempts == 5
    assert not handle.is_async


def test_duplicate_name_refused_at_declaration() -> None:
    declare()
    with pytest.raises(XError) as caught:
        declare()
    assert caught.value.code == "X_JOB_DUPLICATE_NAME"
    assert "billing.send" in caught.value.message
    assert caught.value.hint


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"tenant": None}, "X_JOB_TENANT"),
        ({"tenant": "everyone"}, "X_JOB_TENANT"),
        ({"name": ""}, "X_JOB_NAME"),
        ({"name": "has space"}, "X_JOB_NAME"),
        ({"input": dict}, "X_JOB_INPUT_MODEL"),
        ({"queue": "bad queue"}, "X_JOB_QUEUE"),
        ({"timeout": -1}, "X_DURATION"),
        ({"timeout": 0}, "X_DURATION"),
        ({"timeout": "soon"}, "X_DURATION"),
        ({"retry": 3}, "X_RETRY_POLICY"),
    ],
)
def test_bad_declarations_are_refused(overrides: dict[str, Any], code: str) -> None:
    with pytest.raises(XError) as caught:
        declare(**overrides)
    assert caught.value.code == code
    assert caught.value.hint
    assert registered_jobs() == []


def test_missing_tenant_is_a_coded_error() -> None:
    with pytest.raises(XError) as caught:
        job(name="x.no_tenant")(noop)
    assert caught.value.code == "X_JOB_TENANT"
    assert "x.no_tenant" in caught.value.message


@pytest.mark.parametrize("attempts", [0, -1, 1.5, True])
def test_bad_retry_policy(attempts: Any) -> None:
    with pytest.raises(XError) as caught:
        RetryPolicy(max_attempts=attempts)
    assert caught.value.code == "X_RETRY_POLICY"


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(base=1, factor=2, cap=10, jitter=0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 8, 10, 10]
    jittered = RetryPolicy(base=10, factor=1, cap=100, jitter=0.5)
    assert jittered.delay(1, rand=lambda: 0.0) == 5
    assert jittered.delay(1, rand=lambda: 1.0) == 15


def test_enqueue_validates_and_names_the_field(memory: MemoryDriver) -> None:
    handle = declare()
    with pytest.raises(XError) as caught:
        handle.enqueue({"org_id": "o1", "invoice_id": "not-a-number", "email": "a@b"}, driver=memory)
    assert caught.value.code == "X_JOB_INPUT"
    assert "invoice_id" in caught.value.message
    assert caught.value.hint
    assert memory.introspect.list() == []


def test_enqueue_missing_field(memory: MemoryDriver) -> None:
    handle = declare()
    with pytest.raises(XError) as caught:
        handle.enqueue({"org_id": "o1", "invoice_id": 1}, driver=memory)
    assert caught.value.code == "X_JOB_INPUT"
    assert "email" in caught.value.message


def test_enqueue_writes_payload_tenant_trace_and_actor(memory: MemoryDriver) -> None:
    handle = declare()
    ctx = Ctx(actor=Actor(id="user:7", org_id="o1"), traceparent="00-abc-def-01")
    with use_ctx(ctx):
        result = handle.enqueue(Invoice(org_id="o1", invoice_id=3, email="a@b"), driver=memory)
    row = memory.introspect.get(result.id)
    assert row is not None
    assert row.payload == {"org_id": "o1", "invoice_id": 3, "email": "a@b"}
    assert row.tenant_id == "o1"
    assert row.traceparent == "00-abc-def-01"
    assert row.enqueued_by == "user:7"
    assert row.state == "ready"


def test_enqueue_for_another_org_is_refused(memory: MemoryDriver) -> None:
    handle = declare()
    with use_ctx(Ctx(actor=Actor(id="user:7", org_id="o1"))), pytest.raises(XError) as caught:
        handle.enqueue({"org_id": "o2", "invoice_id": 1, "email": "a@b"}, driver=memory)
    assert caught.value.code == "X_TENANCY_MISMATCH"
    assert memory.introspect.list() == []
    # A scope string carried on a frozen actor is not a grant: only a live grant counts.
    carried = Actor(id="ops", org_id="o1", scopes=frozenset({CROSS_TENANT_SCOPE}))
    with use_ctx(Ctx(actor=carried)), pytest.raises(XError) as caught:
        handle.enqueue({"org_id": "o2", "invoice_id": 1, "email": "a@b"}, driver=memory)
    assert caught.value.code == "X_TENANCY_MISMATCH"
    with use_ctx(Ctx(actor=Actor(id="ops", org_id="o1"))) as ctx, granted(ctx, CROSS_TENANT_SCOPE, "test"):
        handle.enqueue({"org_id": "o2", "invoice_id": 1, "email": "a@b"}, driver=memory)
    assert len(memory.introspect.list()) == 1


def test_tenant_function_returning_nothing_is_refused(memory: MemoryDriver) -> None:
    handle = declare(tenant=lambda i: None)
    with pytest.raises(XError) as caught:
        handle.enqueue({"org_id": "o1", "invoice_id": 1, "email": "a@b"}, driver=memory)
    assert caught.value.code == "X_JOB_TENANT"


def test_delay_and_run_at(memory: MemoryDriver, clock: ManualClock) -> None:
    handle = declare(tenant="none")
    delayed = handle.enqueue({"org_id": "o", "invoice_id": 1, "email": "e"}, delay="5m", driver=memory)
    row = memory.introspect.get(delayed.id)
    assert row is not None and row.state == "delayed"
    assert row.run_at.timestamp() == pytest.approx(clock.now() + 300)
    at = datetime.fromtimestamp(clock.now(), UTC) + timedelta(hours=1)
    later = handle.enqueue({"org_id": "o", "invoice_id": 2, "email": "e"}, run_at=at, driver=memory)
    row = memory.introspect.get(later.id)
    assert row is not None and row.run_at == at
    with pytest.raises(XError) as caught:
        handle.enqueue({"org_id": "o", "invoice_id": 3, "email": "e"}, run_at=datetime(2030, 1, 1), driver=memory)
    assert caught.value.code == "X_JOB_SCHEDULE"
    with pytest.raises(XError) as both:
        handle.enqueue({"org_id": "o", "invoice_id": 3, "email": "e"}, delay=1, run_at=at, driver=memory)
    assert both.value.code == "X_JOB_SCHEDULE"
    assert len(memory.introspect.list()) == 2


def test_idempotency_key_dedupes_live_runs(memory: MemoryDriver) -> None:
    handle = declare(idempotency_key=lambda i: f"invoice:{i.invoice_id}")
    payload = {"org_id": "o1", "invoice_id": 9, "email": "a@b"}
    first = handle.enqueue(payload, driver=memory)
    second = handle.enqueue(payload, driver=memory)
    assert second.deduped and second.id == first.id
    with pytest.raises(JobDuplicateError) as caught:
        handle.enqueue(payload, on_conflict="error", driver=memory)
    assert caught.value.existing_id == first.id
    assert caught.value.code == "X_JOB_DUPLICATE"


def test_enqueue_many_validates_everything_before_writing(memory: MemoryDriver) -> None:
    handle = declare()
    good = {"org_id": "o1", "invoice_id": 1, "email": "a@b"}
    with pytest.raises(XError) as caught:
        handle.enqueue_many([good, {"org_id": "o1"}], driver=memory)
    assert caught.value.code == "X_JOB_INPUT"
    assert "inputs[1]" in caught.value.message
    assert memory.introspect.list() == []
    results = handle.enqueue_many([good, {**good, "invoice_id": 2}], driver=memory)
    assert len(results) == 2
    assert len(memory.introspect.list(JobFilter(name="billing.send"))) == 2


def test_job_without_input_takes_nothing(memory: MemoryDriver) -> None:
    handle = job(name="tick", tenant="none")(noop)
    handle.enqueue(driver=memory)
    with pytest.raises(XError) as caught:
        handle.enqueue({"unexpected": 1}, driver=memory)
    assert caught.value.code == "X_JOB_INPUT"
    assert "unexpected" in caught.value.message


def test_non_finite_numbers_are_refused_before_writing(memory: MemoryDriver) -> None:
    class Reading(BaseModel):
        value: float

    handle = job(name="sensor.reading", tenant="none", input=Reading)(noop)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(XError) as caught:
            handle.enqueue({"value": bad}, driver=memory)
        assert caught.value.code == "X_JOB_INPUT"
    assert memory.introspect.list() == []


@pytest.mark.parametrize("data, field", [
    ({"free": {"a": [1, {"b": float("nan")}]}}, "free.a.1.b"),
    ({"floats": {float("-inf")}}, "floats.0"),
    ({"free": {"when": datetime(2026, 1, 1, tzinfo=UTC), "x": float("inf")}}, "free.x"),
])
def test_non_finite_numbers_anywhere_in_the_input_are_named(memory: MemoryDriver, data: dict[str, Any],
                                                            field: str) -> None:
    class Loose(BaseModel):
        free: Any = None
        floats: set[float] = set()

    handle = job(name="t.loose", tenant="none", input=Loose)(noop)
    with pytest.raises(XError) as caught:
        handle.enqueue(data, driver=memory)
    assert caught.value.code == "X_JOB_INPUT" and f'"{field}"' in caught.value.message
    handle.enqueue({"free": {"when": datetime(2026, 1, 1, tzinfo=UTC), "x": 1.5}, "floats": {2.5}}, driver=memory)
    assert len(memory.introspect.list()) == 1


# -- limits and handler signatures ------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 400, 950, 1_500, 10_000])
def test_deeply_nested_input_is_one_coded_error(memory: MemoryDriver, depth: int) -> None:
    class Free(BaseModel):
        data: Any = None

    handle = job(name="t.free", tenant="none", input=Free)(noop)
    value: Any = 1
    for _ in range(depth):
        value = [value]
    with pytest.raises(XError) as caught:
        handle.enqueue({"data": value}, driver=memory)
    assert caught.value.code == "X_LIMIT_EXCEEDED" and "max_depth" in caught.value.message
    assert memory.introspect.list() == []


def test_a_handler_that_cannot_take_input_ctx_step_is_refused_at_declaration() -> None:
    def no_args() -> None:
        return None

    def four(input: Any, ctx: Any, step: Any, extra: Any) -> None:
        return None

    for bad in (no_args, four, lambda input: None):
        with pytest.raises(XError) as caught:
            job(name="t.bad", tenant="none")(bad)
        assert caught.value.code == "X_JOB_HANDLER" and "t.bad" in caught.value.message
        assert registered_jobs() == []


def test_a_two_argument_handler_runs_without_a_step(memory: MemoryDriver) -> None:
    import asyncio

    from ultimat3.jobs import Worker

    @job(name="t.two", tenant="none")
    def two(input: Any, ctx: Ctx) -> str:
        return "ran"

    @job(name="t.star", tenant="none")
    def star(*args: Any) -> int:
        return len(args)

    assert not two.takes_step and star.takes_step
    first, second = two.enqueue(driver=memory), star.enqueue(driver=memory)
    worker = Worker(memory, environment="test")
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()
    assert [memory.introspect.get(j.id).result for j in (first, second)] == ["ran", 3]  # type: ignore[union-attr]
