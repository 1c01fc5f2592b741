"""Enqueue: the row it writes, delayed vs ready, idempotency per (name, key), batches."""

from __future__ import annotations

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver, JobFilter
from ultimat3.jobs.errors import DriverError, JobDuplicateError

from .helpers import at, claim_one, dead_letter, enqueue, get, is_uuid, request


def test_enqueue_writes_a_ready_job_with_defaults(driver: JobDriver, clock: ManualClock) -> None:
    result = enqueue(driver, "send-email", {"to": "a@example.com"})

    assert result.deduped is False
    assert is_uuid(result.id) and is_uuid(result.run_id)
    job = get(driver, result.id)
    assert job.id == result.id and job.run_id == result.run_id
    assert job.name == "send-email"
    assert job.payload == {"to": "a@example.com"}
    assert job.queue == "default"
    assert job.state == "ready"
    assert (job.priority, job.attempt, job.max_attempts) == (0, 0, 5)
    now = at(clock.now())
    assert job.run_at == job.created_at == job.updated_at == now
    unset = (job.claimed_by, job.visible_at, job.finished_at, job.last_error, job.result)
    assert unset == (None, None, None, None, None)


def test_every_enqueue_gets_its_own_ids(driver: JobDriver) -> None:
    first = enqueue(driver)
    second = enqueue(driver)
    assert len({first.id, first.run_id, second.id, second.run_id}) == 4


def test_enqueue_round_trips_every_field(driver: JobDriver) -> None:
    result = enqueue(
        driver,
        "report",
        queue="reports",
        priority=7,
        max_attempts=3,
        idempotency_key="k-1",
        tenant_id="org_42",
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        enqueued_by="user_7",
    )
    job = get(driver, result.id)
    assert job.queue == "reports"
    assert job.priority == 7
    assert job.max_attempts == 3
    assert job.idempotency_key == "k-1"
    assert job.tenant_id == "org_42"
    assert job.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert job.enqueued_by == "user_7"


def test_payload_round_trips_exactly(driver: JobDriver) -> None:
    payload = {
        "greeting": "héllo wörld — こんにちは 👋",
        "nested": {"list": [1, 2.5, -3, True, False, None, "x"], "empty": {}, "none": None},
        "deep": [[{"a": [{"b": "ç"}]}]],
        "big": 12345678901234567,
        'quote"key': "back\\slash\nnewline\ttab",
        "": "empty key",
    }
    job = get(driver, enqueue(driver, payload=payload).id)
    assert job.payload == payload
    assert driver.introspect.list()[0].payload == payload


def test_payload_is_stored_not_shared(driver: JobDriver) -> None:
    payload = {"items": [1, 2]}
    result = enqueue(driver, payload=payload)
    payload["items"].append(3)
    assert get(driver, result.id).payload == {"items": [1, 2]}


def test_future_run_at_makes_a_delayed_job(driver: JobDriver, clock: ManualClock) -> None:
    job = get(driver, enqueue(driver, run_at=clock.now() + 60).id)
    assert job.state == "delayed"
    assert job.run_at == at(clock.now() + 60)


@pytest.mark.parametrize("offset", [0.0, -30.0])
def test_run_at_now_or_past_makes_a_ready_job(driver: JobDriver, clock: ManualClock, offset: float) -> None:
    job = get(driver, enqueue(driver, run_at=clock.now() + offset).id)
    assert job.state == "ready"
    assert job.run_at == at(clock.now() + offset)


def test_live_duplicate_is_returned_deduped(driver: JobDriver) -> None:
    first = enqueue(driver, "sync", {"n": 1}, idempotency_key="k")
    second = enqueue(driver, "sync", {"n": 2}, idempotency_key="k")
    assert second.deduped is True
    assert (second.id, second.run_id) == (first.id, first.run_id)
    jobs = driver.introspect.list()
    assert len(jobs) == 1
    assert jobs[0].payload == {"n": 1}


def test_no_key_never_dedupes(driver: JobDriver) -> None:
    first = enqueue(driver, "sync")
    second = enqueue(driver, "sync")
    assert second.deduped is False
    assert second.id != first.id
    assert len(driver.introspect.list()) == 2


def test_same_key_under_another_name_does_not_dedupe(driver: JobDriver) -> None:
    first = enqueue(driver, "sync-users", idempotency_key="org_1")
    second = enqueue(driver, "sync-invoices", idempotency_key="org_1")
    assert second.deduped is False
    assert second.id != first.id
    assert {job.name for job in driver.introspect.list()} == {"sync-users", "sync-invoices"}


@pytest.mark.parametrize("offset", [0.0, 60.0])
def test_waiting_job_holds_its_key(driver: JobDriver, clock: ManualClock, offset: float) -> None:
    first = enqueue(driver, "sync", idempotency_key="k", run_at=clock.now() + offset)
    again = enqueue(driver, "sync", idempotency_key="k")
    assert again.deduped is True and again.id == first.id


def test_running_job_holds_its_key(driver: JobDriver) -> None:
    first = enqueue(driver, "sync", idempotency_key="k")
    claim_one(driver)
    again = enqueue(driver, "sync", idempotency_key="k")
    assert again.deduped is True and again.id == first.id


@pytest.mark.parametrize("ending", ["done", "dead", "cancelled"])
def test_finished_job_frees_its_key(driver: JobDriver, ending: str) -> None:
    first = enqueue(driver, "sync", idempotency_key="k")
    if ending == "cancelled":
        driver.cancel(first.id)
    else:
        claimed = claim_one(driver)
        if ending == "done":
            assert driver.ack(first.id, claimed.claim_token)
        else:
            assert driver.nack(first.id, claimed.claim_token, dead_letter())
    assert get(driver, first.id).state == ending

    second = enqueue(driver, "sync", idempotency_key="k")
    assert second.deduped is False
    assert second.id != first.id
    assert get(driver, second.id).state == "ready"


def test_on_conflict_error_raises_with_the_existing_id(driver: JobDriver) -> None:
    first = enqueue(driver, "sync", idempotency_key="k")
    with pytest.raises(JobDuplicateError) as caught:
        enqueue(driver, "sync", idempotency_key="k", on_conflict="error")
    assert caught.value.existing_id == first.id
    assert caught.value.code == "X_JOB_DUPLICATE"
    assert len(driver.introspect.list()) == 1


def test_on_conflict_error_without_a_live_duplicate_writes(driver: JobDriver) -> None:
    result = enqueue(driver, "sync", idempotency_key="k", on_conflict="error")
    assert result.deduped is False
    assert get(driver, result.id).idempotency_key == "k"


def test_enqueue_many_returns_results_in_order(driver: JobDriver) -> None:
    results = driver.enqueue_many([request("a"), request("b", queue="other"), request("c")])
    assert [r.deduped for r in results] == [False, False, False]
    assert [get(driver, r.id).name for r in results] == ["a", "b", "c"]
    assert len({r.id for r in results}) == 3


# Every column a batch may share or not: shared ones travel once per batch, differing ones per item
# (PostgreSQL's enqueue_many), and either way each row must hold its own request's values.
_MIXED = [
    {"queue": "q1", "priority": 1, "max_attempts": 2, "idempotency_key": "k1", "tenant_id": "org_1",
     "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "enqueued_by": "user_1",
     "flow_key": "f1", "flow_max": 1, "rate_key": "r1", "rate_per_second": 0.5, "rate_burst": 2},
    {"queue": "q2", "priority": -3, "max_attempts": 9, "idempotency_key": None, "tenant_id": None,
     "traceparent": None, "enqueued_by": None},
    {"queue": "q1", "priority": 1, "max_attempts": 2, "idempotency_key": "k,2", "tenant_id": "org_2",
     "enqueued_by": "user_2", "flow_key": "f2", "flow_max": 3, "rate_key": "r2", "rate_per_second": 4.0,
     "rate_burst": 1},
]


@pytest.mark.parametrize("shared", [False, True], ids=["items-differ", "batch-shares"])
def test_enqueue_many_stores_each_items_own_values(driver: JobDriver, clock: ManualClock, shared: bool) -> None:
    # Shared: everything but the key (one per item, as a keyed job's inputs give).
    fields = [{**_MIXED[0], "idempotency_key": f"k{i}"} for i in range(3)] if shared else _MIXED
    names = ["same"] * 3 if shared else ["a", "b", "c"]
    delays = [None] * 3 if shared else [None, 60.0, -5.0]
    payloads = [{"i": i, "text": f'quote " comma , [{i}]'} for i in range(3)]
    requests = [request(name, payload, run_at=None if delay is None else clock.now() + delay, **extra)
                for name, payload, delay, extra in zip(names, payloads, delays, fields, strict=True)]
    results = driver.enqueue_many(requests)
    assert [r.deduped for r in results] == [False] * 3
    for result, sent, delay in zip(results, requests, delays, strict=True):
        job = get(driver, result.id)
        assert (job.id, job.run_id) == (result.id, result.run_id)
        assert (job.name, job.payload, job.queue, job.priority, job.max_attempts) == (
            sent.name, sent.payload, sent.queue, sent.priority, sent.max_attempts)
        assert (job.idempotency_key, job.tenant_id, job.traceparent, job.enqueued_by) == (
            sent.idempotency_key, sent.tenant_id, sent.traceparent, sent.enqueued_by)
        assert (job.flow_key, job.flow_max, job.rate_key, job.rate_per_second, job.rate_burst) == (
            sent.flow_key, sent.flow_max, sent.rate_key, sent.rate_per_second, sent.rate_burst)
        assert job.state == ("delayed" if delay is not None and delay > 0 else "ready")
        assert job.run_at == at(clock.now() if delay is None else clock.now() + delay)
        assert job.created_at == at(clock.now())


# Keyless jobs differing in every column but their first run time and rate: SQLite writes such a
# batch as one statement over a JSON array, so texts and integers make a round trip through JSON.
_KEYLESS = [
    {"queue": "q1", "priority": 2**31 - 1, "max_attempts": 2, "tenant_id": "org_\U0001f600",
     "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "enqueued_by": 'user "1" \\',
     "flow_key": "f1", "flow_max": 1, "rate_key": "r1", "rate_per_second": 0.1, "rate_burst": 2},
    {"queue": "q2", "priority": -(2**31), "max_attempts": 9, "tenant_id": None, "traceparent": None,
     "enqueued_by": None, "rate_key": "r2", "rate_per_second": 0.1, "rate_burst": 7},
    {"queue": "\u00e9\u2028", "priority": 0, "max_attempts": 1, "tenant_id": "org_2", "enqueued_by": "u\tv",
     "flow_key": "f,2", "flow_max": 3, "rate_key": "r3", "rate_per_second": 0.1, "rate_burst": 1},
]


@pytest.mark.parametrize("times", ["shared", "differing"])
def test_enqueue_many_of_keyless_jobs_stores_each_items_own_values(driver: JobDriver, clock: ManualClock,
                                                                   times: str) -> None:
    # Shared first run times (one enqueue_many call's) and rate, or differing ones (the rate too).
    delays = [30.0] * 3 if times == "shared" else [None, 60.0, -5.0]
    fields = _KEYLESS if times == "shared" else [{**f, "rate_per_second": 0.1 * (i + 1)}
                                                 for i, f in enumerate(_KEYLESS)]
    payloads = [{"i": i, "text": f"\U0001f600 quote \" [{i}] \\u0000", "big": 2**53 + i} for i in range(3)]
    requests = [request(name, payload, run_at=None if delay is None else clock.now() + delay, **extra)
                for name, payload, delay, extra in zip("abc", payloads, delays, fields, strict=True)]
    results = driver.enqueue_many(requests)
    assert [r.deduped for r in results] == [False] * 3
    for result, sent, delay in zip(results, requests, delays, strict=True):
        job = get(driver, result.id)
        assert (job.id, job.run_id, job.attempt) == (result.id, result.run_id, 0)
        assert (job.name, job.payload, job.queue, job.priority, job.max_attempts) == (
            sent.name, sent.payload, sent.queue, sent.priority, sent.max_attempts)
        assert (job.idempotency_key, job.tenant_id, job.traceparent, job.enqueued_by) == (
            None, sent.tenant_id, sent.traceparent, sent.enqueued_by)
        assert (job.flow_key, job.flow_max, job.rate_key, job.rate_per_second, job.rate_burst) == (
            sent.flow_key, sent.flow_max, sent.rate_key, sent.rate_per_second, sent.rate_burst)
        assert job.state == ("delayed" if delay is not None and delay > 0 else "ready")
        assert job.run_at == at(clock.now() if delay is None else clock.now() + delay)
        assert job.created_at == job.updated_at == at(clock.now())


def test_enqueue_many_dedupes_inside_the_batch_and_against_live_jobs(driver: JobDriver) -> None:
    live = enqueue(driver, "sync", idempotency_key="live")
    results = driver.enqueue_many(
        [
            request("sync", idempotency_key="live"),
            request("sync", idempotency_key="new"),
            request("sync", idempotency_key="new"),
        ]
    )
    assert (results[0].id, results[0].deduped) == (live.id, True)
    assert results[1].deduped is False
    assert (results[2].id, results[2].deduped) == (results[1].id, True)
    assert len(driver.introspect.list()) == 2


def test_enqueue_many_is_all_or_nothing(driver: JobDriver) -> None:
    live = enqueue(driver, "sync", idempotency_key="k")
    batch = [
        request("before"),
        request("sync", idempotency_key="k", on_conflict="error"),
        request("after"),
    ]
    with pytest.raises(JobDuplicateError) as caught:
        driver.enqueue_many(batch)
    assert caught.value.existing_id == live.id
    assert [job.id for job in driver.introspect.list()] == [live.id]


def test_enqueue_many_duplicate_within_the_batch_writes_nothing(driver: JobDriver) -> None:
    batch = [
        request("sync", idempotency_key="k"),
        request("sync", idempotency_key="k", on_conflict="error"),
    ]
    with pytest.raises(JobDuplicateError):
        driver.enqueue_many(batch)
    assert driver.introspect.list() == []


def test_enqueue_many_of_nothing_writes_nothing(driver: JobDriver) -> None:
    assert driver.enqueue_many([]) == []
    assert driver.introspect.list(JobFilter()) == []


def test_a_connection_the_driver_cannot_join_is_refused(driver: JobDriver) -> None:
    # Memory joins no transaction at all; the SQL drivers join only their own kind of connection.
    # Either way an object that is not such a connection is refused before anything is written.
    with pytest.raises(DriverError) as caught:
        driver.enqueue(request("sync"), connection=object())
    assert caught.value.code == "X_DRIVER_CONNECTION"
    assert caught.value.hint
    with pytest.raises(DriverError):
        driver.enqueue_many([request("sync")], connection=object())
    assert driver.introspect.list() == []


# -- limits every driver holds an enqueue to ------------------------------------------------------------


@pytest.fixture
def small_limits() -> object:
    from ultimat3.drivers.limits import configure_limits, current_limits

    before = current_limits()
    yield configure_limits(max_payload_bytes=1_000, max_depth=5, max_key_length=20)
    configure_limits(max_payload_bytes=before.max_payload_bytes, max_depth=before.max_depth,
                     max_key_length=before.max_key_length)


@pytest.mark.parametrize(
    ("fields", "limit"),
    [
        ({"payload": {"blob": "x" * 2_000}}, "max_payload_bytes=1000"),
        ({"payload": {"a": [[[[[[1]]]]]]}}, "max_depth=5"),
        ({"tenant_id": "o" * 21}, "max_key_length=20"),
        ({"idempotency_key": "k" * 21}, "max_key_length=20"),
    ],
    ids=["payload size", "nesting depth", "tenant id length", "key length"],
)
def test_each_limit_is_refused_coded_and_writes_nothing(driver: JobDriver, small_limits: object,
                                                       fields: dict[str, object], limit: str) -> None:
    from ultimat3.core import XError

    with pytest.raises(XError) as caught:
        enqueue(driver, **fields)  # type: ignore[arg-type]
    assert caught.value.code == "X_LIMIT_EXCEEDED" and limit in caught.value.message
    assert "configure_limits" in caught.value.hint
    assert driver.introspect.list() == []


def test_values_at_the_limits_are_accepted(driver: JobDriver, small_limits: object) -> None:
    enqueue(driver, payload={"a": [[[1]]]}, tenant_id="o" * 20, idempotency_key="k" * 20)
    assert len(driver.introspect.list()) == 1


def test_a_hostile_depth_is_refused_without_exhausting_the_stack(driver: JobDriver) -> None:
    from ultimat3.core import XError

    deep: dict[str, object] = {}
    node = deep
    for _ in range(5_000):
        child: dict[str, object] = {}
        node["n"] = child
        node = child
    with pytest.raises(XError) as caught:
        enqueue(driver, payload=deep)
    assert caught.value.code == "X_LIMIT_EXCEEDED"
    assert driver.introspect.list() == []
