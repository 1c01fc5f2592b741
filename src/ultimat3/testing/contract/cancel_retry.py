"""Operator actions: cancel an unfinished job, retry a dead or cancelled one."""

from __future__ import annotations

from typing import Any

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver, JobRecord
from ultimat3.jobs.errors import JobDuplicateError

from .helpers import (
    at,
    claim,
    claim_one,
    dead_letter,
    enqueue,
    enqueue_and_claim,
    get,
    retry_later,
    suspend,
)


def _job_in_state(driver: JobDriver, clock: ManualClock, state: str, **fields: Any) -> str:
    """A job brought to ``state`` through the public API; returns its id."""
    if state == "delayed":
        return enqueue(driver, run_at=clock.now() + 3600, **fields).id
    result = enqueue(driver, **fields)
    if state == "ready":
        return result.id
    if state == "cancelled":
        driver.cancel(result.id, "stop")
        return result.id
    claimed = claim_one(driver)
    assert claimed.job.id == result.id
    if state == "done":
        assert driver.ack(result.id, claimed.claim_token, {"ok": True})
    elif state == "dead":
        assert driver.nack(result.id, claimed.claim_token, dead_letter("fatal"))
    elif state == "suspended":
        assert driver.nack(result.id, claimed.claim_token, suspend(3600))
    else:
        assert state == "running"
    assert get(driver, result.id).state == state
    return result.id


@pytest.mark.parametrize("state", ["ready", "delayed", "running", "suspended"])
def test_cancel_stops_an_unfinished_job(driver: JobDriver, clock: ManualClock, state: str) -> None:
    job_id = _job_in_state(driver, clock, state)
    clock.advance(7)
    record = driver.cancel(job_id, "no longer needed")

    assert record is not None
    assert record.state == "cancelled"
    assert record.last_error == "no longer needed"
    assert record.finished_at == at(clock.now())
    assert record.updated_at == at(clock.now())
    assert get(driver, job_id) == record
    clock.advance(7200)
    assert claim(driver, limit=10) == []


def test_cancel_without_a_reason(driver: JobDriver) -> None:
    job_id = enqueue(driver).id
    record = driver.cancel(job_id)
    assert record is not None
    assert (record.state, record.last_error) == ("cancelled", None)


def test_cancel_reaches_a_running_attempt_through_its_heartbeat(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    driver.cancel(claimed.job.id)
    assert driver.heartbeat(claimed.job.id, claimed.claim_token, 30) is False
    assert driver.ack(claimed.job.id, claimed.claim_token) is False
    assert get(driver, claimed.job.id).state == "cancelled"


@pytest.mark.parametrize("state", ["done", "dead", "cancelled"])
def test_cancel_of_a_finished_job_changes_nothing(driver: JobDriver, clock: ManualClock, state: str) -> None:
    job_id = _job_in_state(driver, clock, state)
    before = get(driver, job_id)
    clock.advance(60)
    record = driver.cancel(job_id, "too late")
    assert record == before
    assert get(driver, job_id) == before
    if state == "done":
        assert record is not None and record.result == {"ok": True}


def test_cancel_of_an_unknown_job_is_none(driver: JobDriver) -> None:
    assert driver.cancel("00000000-0000-4000-8000-000000000000", "x") is None


@pytest.mark.parametrize("state", ["dead", "cancelled"])
def test_retry_makes_a_finished_failure_ready_again(driver: JobDriver, clock: ManualClock, state: str) -> None:
    job_id = _job_in_state(driver, clock, state)
    before = get(driver, job_id)
    clock.advance(30)
    record = driver.retry(job_id)

    assert record is not None
    assert record.state == "ready"
    assert record.attempt == 0
    assert record.run_at == at(clock.now())
    assert record.updated_at == at(clock.now())
    assert record.finished_at is None
    assert record.last_error == before.last_error  # kept, for the operator to read
    assert record.run_id == before.run_id
    assert get(driver, job_id) == record

    claimed = claim_one(driver)
    assert claimed.job.id == job_id
    assert claimed.job.attempt == 1


def test_retry_replays_the_same_run(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.steps.record(claimed.job.id, claimed.claim_token, "fetch", [1, 2])
    assert driver.nack(claimed.job.id, claimed.claim_token, dead_letter())
    driver.retry(claimed.job.id)
    again = claim_one(driver)
    assert again.job.run_id == claimed.job.run_id
    assert driver.steps.load(again.job.run_id)["fetch"].result == [1, 2]


@pytest.mark.parametrize("state", ["ready", "delayed", "running", "suspended", "done"])
def test_retry_leaves_other_states_alone(driver: JobDriver, clock: ManualClock, state: str) -> None:
    job_id = _job_in_state(driver, clock, state)
    before = get(driver, job_id)
    clock.advance(5)
    assert driver.retry(job_id) == before
    assert get(driver, job_id) == before


def test_retry_of_an_unknown_job_is_none(driver: JobDriver) -> None:
    assert driver.retry("00000000-0000-4000-8000-000000000000") is None


def test_retry_refuses_a_second_live_job_under_the_key(driver: JobDriver, clock: ManualClock) -> None:
    dead_id = _job_in_state(driver, clock, "dead", name="sync", idempotency_key="k")
    live = enqueue(driver, "sync", idempotency_key="k")
    assert live.deduped is False
    before = get(driver, dead_id)

    with pytest.raises(JobDuplicateError) as caught:
        driver.retry(dead_id)
    assert caught.value.existing_id == live.id
    assert get(driver, dead_id) == before


def test_retried_job_holds_its_key_again(driver: JobDriver, clock: ManualClock) -> None:
    job_id = _job_in_state(driver, clock, "cancelled", name="sync", idempotency_key="k")
    driver.retry(job_id)
    again = enqueue(driver, "sync", idempotency_key="k")
    assert again.deduped is True
    assert again.id == job_id


def test_retry_after_counted_failures_resets_the_attempt(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    for _ in range(2):
        assert driver.nack(claimed.job.id, claimed.claim_token, retry_later())
        claimed = claim_one(driver)
    assert claimed.job.attempt == 3
    assert driver.nack(claimed.job.id, claimed.claim_token, dead_letter())
    record: JobRecord | None = driver.retry(claimed.job.id)
    assert record is not None and record.attempt == 0
