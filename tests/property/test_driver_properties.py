"""Bad input at the driver boundary, on every driver: it works (and round-trips exactly) or it is
refused with a coded XError, and a refusal writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import EnqueueRequest, JobDriver, JobFilter
from ultimat3.jobs import RetryPolicy, isolated_registry, job

from .strategies import NASTY, PROPERTY, assert_coded, payloads, same_json, texts, total_jobs


class Anything(BaseModel):
    data: Any = None


with isolated_registry():
    # The handles outlive the isolated registry: enqueue needs the handle, not the registry.
    @job(name="prop.anything", tenant="none", input=Anything)
    def anything(input: Anything, ctx: Any, step: Any) -> None:
        """Never run: the properties only enqueue."""

    @job(name="prop.keyed", tenant=lambda i: i.data["tenant"], input=Anything,
         idempotency_key=lambda i: i.data["key"])
    def keyed(input: Anything, ctx: Any, step: Any) -> None:
        """Never run."""


#: Always tried, whatever hypothesis draws: the values each storage is known to choke on.
EDGE_PAYLOADS = [
    {"nan": float("nan")},
    {"inf": [float("-inf")]},
    {"nul": "a\x00b"},
    {"a\x00": 1},
    {"huge": 10**40, "tiny": 5e-324, "max": 1.7976931348623157e308, "neg0": -0.0},
    {"unicode": "ñ漢字🙂\u202e", "escape": "\\u0000", "quote": "'\"%s$1{}"},
]


@PROPERTY
@given(payload=payloads)
@example(payload=EDGE_PAYLOADS[0])
@example(payload=EDGE_PAYLOADS[1])
@example(payload=EDGE_PAYLOADS[2])
@example(payload=EDGE_PAYLOADS[3])
@example(payload=EDGE_PAYLOADS[4])
@example(payload=EDGE_PAYLOADS[5])
def test_driver_enqueue_round_trips_payloads_or_refuses_them_coded(driver: JobDriver, payload: dict[str, Any]) -> None:
    before = total_jobs(driver)
    try:
        result = driver.enqueue(EnqueueRequest(name="prop.raw", payload=payload))
    except Exception as error:
        assert total_jobs(driver) == before, "a refused enqueue left a row behind"
        assert_coded(error)
        return
    assert total_jobs(driver) == before + 1
    row = driver.introspect.get(result.id)
    assert row is not None and same_json(payload, row.payload), (payload, row and row.payload)


@PROPERTY
@given(payload=payloads)
@example(payload=EDGE_PAYLOADS[0])
@example(payload=EDGE_PAYLOADS[2])
@example(payload=EDGE_PAYLOADS[4])
@example(payload=EDGE_PAYLOADS[5])
def test_job_enqueue_round_trips_payloads_or_refuses_them_coded(driver: JobDriver, payload: dict[str, Any]) -> None:
    before = total_jobs(driver)
    try:
        result = anything.enqueue({"data": payload}, driver=driver)
    except Exception as error:
        assert total_jobs(driver) == before, "a refused enqueue left a row behind"
        assert_coded(error)
        return
    row = driver.introspect.get(result.id)
    assert row is not None and same_json({"data": payload}, row.payload), (payload, row and row.payload)


@PROPERTY
@given(batch=st.lists(payloads, min_size=2, max_size=4))
@example(batch=[{"ok": 1}, EDGE_PAYLOADS[0]])
@example(batch=[{"ok": 1}, {"ok": 2}, EDGE_PAYLOADS[2]])
def test_enqueue_many_is_all_or_nothing(driver: JobDriver, batch: list[dict[str, Any]]) -> None:
    before = total_jobs(driver)
    try:
        results = driver.enqueue_many([EnqueueRequest(name="prop.many", payload=p) for p in batch])
    except Exception as error:
        assert total_jobs(driver) == before, "a refused batch was half-written"
        assert_coded(error)
        return
    assert total_jobs(driver) == before + len(batch)
    for payload, result in zip(batch, results, strict=True):
        row = driver.introspect.get(result.id)
        assert row is not None and same_json(payload, row.payload)


@PROPERTY
@given(key=texts, tenant=texts)
@example(key="k\x00", tenant="t")
@example(key="k", tenant="'; DROP TABLE x_jobs; --")
def test_keys_and_tenants_round_trip_or_are_refused_coded(driver: JobDriver, key: str, tenant: str) -> None:
    before = total_jobs(driver)
    try:
        result = keyed.enqueue({"data": {"key": key, "tenant": tenant}}, driver=driver)
    except Exception as error:
        assert total_jobs(driver) == before
        assert_coded(error)
        return
    row = driver.introspect.get(result.id)
    assert row is not None
    assert (row.idempotency_key, row.tenant_id) == (key, tenant)
    # The same key again is the same live job (dedupe), not a second row.
    again = keyed.enqueue({"data": {"key": key, "tenant": tenant}}, driver=driver)
    assert again.deduped and again.id == result.id
    assert driver.cancel(result.id) is not None  # frees the key for the next example


@PROPERTY
@given(job_id=st.text(max_size=40) | st.sampled_from(NASTY))
@example(job_id="a\x00b")
@example(job_id="\udcff")
def test_unknown_ids_are_none_or_refused_coded(driver: JobDriver, job_id: str) -> None:
    before = [(q.queue, q.counts) for q in driver.introspect.stats()]
    for operation in (driver.introspect.get, driver.cancel, driver.retry, driver.steps.load, driver.backfills.get):
        try:
            assert operation(job_id) in (None, {})
        except AssertionError:
            raise
        except Exception as error:
            assert_coded(error)
    assert [(q.queue, q.counts) for q in driver.introspect.stats()] == before


# -- injection and storage-hostile strings, one case per string and driver -------------------------


def _refused_or(driver: JobDriver, before: int, action: Any) -> Any:
    try:
        return action()
    except Exception as error:
        assert total_jobs(driver) == before, "a refused call left a row behind"
        assert_coded(error)
        return None


@pytest.mark.parametrize("value", NASTY, ids=[repr(v)[:30] for v in NASTY])
def test_hostile_strings_round_trip_exactly_or_are_refused_coded(driver: JobDriver, value: str) -> None:
    before = total_jobs(driver)
    request = EnqueueRequest(name=value or "n", queue=value or "q", idempotency_key=value, tenant_id=value,
                             payload={value: value, "v": [value]})
    result = _refused_or(driver, before, lambda: driver.enqueue(request))
    if result is not None:
        assert total_jobs(driver) == before + 1
        row = driver.introspect.get(result.id)
        assert row is not None
        assert (row.name, row.queue, row.idempotency_key, row.tenant_id) == (
            request.name, request.queue, request.idempotency_key, request.tenant_id)
        assert row.payload == request.payload
        listed = driver.introspect.list(JobFilter(queue=request.queue, name=request.name, tenant_id=value))
        assert [job.id for job in listed] == [result.id]
        again = driver.enqueue(request)
        assert again.deduped and again.id == result.id
        assert driver.cancel(result.id, reason=value) is not None
    # Ids, filters and the step/ledger stores take the same string without harm.
    for action in (lambda: driver.introspect.get(value), lambda: driver.cancel(value, value),
                   lambda: driver.retry(value), lambda: driver.steps.load(value),
                   lambda: driver.backfills.get(value), lambda: driver.backfills.list(value),
                   lambda: driver.introspect.list(JobFilter(queue=value, name=value, tenant_id=value)),
                   lambda: driver.leases.holders(value)):
        _refused_or(driver, total_jobs(driver), action)
    # The tables are intact: every table the driver keeps still answers.
    assert total_jobs(driver) >= before
    driver.introspect.list()
    driver.backfills.list()
    driver.migrations.applied()


@pytest.mark.parametrize("value", NASTY, ids=[repr(v)[:30] for v in NASTY])
def test_hostile_names_are_refused_at_declaration_or_work(driver: JobDriver, value: str) -> None:
    with isolated_registry():
        try:
            handle = job(name=value, tenant="none", queue=value)(lambda i, c, s: None)
        except XError as error:
            assert error.code in ("X_JOB_NAME", "X_JOB_QUEUE"), error.code
            return
    before = total_jobs(driver)
    result = _refused_or(driver, before, lambda: handle.enqueue(driver=driver))
    if result is not None:
        row = driver.introspect.get(result.id)
        assert row is not None and (row.name, row.queue) == (value, value)


@PROPERTY
@given(priority=st.integers() | st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63, 10**30]),
       delay=st.none() | st.floats(min_value=0) | st.integers(min_value=0, max_value=10**30),
       max_attempts=st.integers(min_value=1) | st.sampled_from([2**31 - 1, 2**31, 2**63]))
def test_enqueue_options_work_or_are_refused_coded(driver: JobDriver, priority: int, delay: float | None,
                                                   max_attempts: int) -> None:
    before = total_jobs(driver)
    try:
        with isolated_registry():
            handle = job(name="prop.options", tenant="none", retry=RetryPolicy(max_attempts=max_attempts))(
                lambda i, c, s: None)
        result = handle.enqueue(priority=priority, delay=delay, driver=driver)
    except Exception as error:
        assert total_jobs(driver) == before, "a refused enqueue left a row behind"
        assert_coded(error)
        return
    row = driver.introspect.get(result.id)
    assert row is not None and (row.priority, row.max_attempts) == (priority, max_attempts)
