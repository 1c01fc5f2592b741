"""Fencing: every write a worker makes for a job carries its claim token, and a token that no
longer holds the job (cancelled, settled, re-claimed after a lapse, or simply wrong) changes
nothing and reports ``False``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver, NackRequest

from .helpers import at, claim_one, enqueue, enqueue_and_claim, get

#: One fenced write: (driver, job id, token) -> whether it took effect.
FencedWrite = Callable[[JobDriver, str, str], bool]

FENCED_WRITES: dict[str, FencedWrite] = {
    "ack": lambda d, job_id, token: d.ack(job_id, token, {"by": token}),
    "nack": lambda d, job_id, token: d.nack(job_id, token, NackRequest(error="stale", delay=5)),
    "dead-letter": lambda d, job_id, token: d.nack(job_id, token, NackRequest(error="x", dead_letter=True)),
    "suspend": lambda d, job_id, token: d.nack(job_id, token, NackRequest(delay=5, counts_as_attempt=False)),
    "heartbeat": lambda d, job_id, token: d.heartbeat(job_id, token, 600),
    "step": lambda d, job_id, token: d.steps.record(job_id, token, "checkpoint", {"by": token}),
}


@pytest.fixture(params=sorted(FENCED_WRITES))
def write(request: pytest.FixtureRequest) -> FencedWrite:
    """Each fenced write in turn."""
    return FENCED_WRITES[request.param]


def test_stale_worker_is_fenced_after_cancel(driver: JobDriver, clock: ManualClock, write: FencedWrite) -> None:
    claimed = enqueue_and_claim(driver)
    driver.cancel(claimed.job.id, "operator said stop")
    before = get(driver, claimed.job.id)
    clock.advance(1)

    assert write(driver, claimed.job.id, claimed.claim_token) is False
    assert get(driver, claimed.job.id) == before
    assert driver.steps.load(claimed.job.run_id) == {}


def test_stale_worker_is_fenced_after_its_claim_was_retaken(
    driver: JobDriver, clock: ManualClock, write: FencedWrite
) -> None:
    stale = enqueue_and_claim(driver, "w1", visibility_timeout=30)
    clock.advance(31)
    fresh = claim_one(driver, "w2", visibility_timeout=30)
    assert fresh.job.id == stale.job.id
    before = get(driver, stale.job.id)
    clock.advance(1)

    assert write(driver, stale.job.id, stale.claim_token) is False
    assert get(driver, stale.job.id) == before
    assert before.state == "running" and before.claimed_by == "w2"
    assert driver.steps.load(stale.job.run_id) == {}

    # The new claimant's token is the one that works.
    assert write(driver, fresh.job.id, fresh.claim_token) is True
    took_effect = get(driver, fresh.job.id) != before or "checkpoint" in driver.steps.load(fresh.job.run_id)
    assert took_effect


def test_settled_job_is_fenced(driver: JobDriver, clock: ManualClock, write: FencedWrite) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.ack(claimed.job.id, claimed.claim_token, "first")
    before = get(driver, claimed.job.id)
    clock.advance(1)

    assert write(driver, claimed.job.id, claimed.claim_token) is False
    assert get(driver, claimed.job.id) == before
    assert before.result == "first"


def test_wrong_token_is_fenced(driver: JobDriver, clock: ManualClock, write: FencedWrite) -> None:
    claimed = enqueue_and_claim(driver, "w1")
    before = get(driver, claimed.job.id)
    clock.advance(1)
    forged = "w1:1:000000000000"
    assert forged != claimed.claim_token

    assert write(driver, claimed.job.id, forged) is False
    assert get(driver, claimed.job.id) == before
    assert driver.steps.load(claimed.job.run_id) == {}


def test_waiting_job_is_fenced(driver: JobDriver, write: FencedWrite) -> None:
    result = enqueue(driver)
    before = get(driver, result.id)
    assert write(driver, result.id, "w1:1:000000000000") is False
    assert get(driver, result.id) == before


def test_unknown_job_is_fenced(driver: JobDriver, write: FencedWrite) -> None:
    assert write(driver, "00000000-0000-4000-8000-000000000000", "w1:1:000000000000") is False
    assert driver.introspect.list() == []


def test_lapsed_claim_nobody_retook_still_holds(driver: JobDriver, clock: ManualClock) -> None:
    # Only the token fences: visibility lapsing merely makes the job claimable by others.
    claimed = enqueue_and_claim(driver, visibility_timeout=30)
    clock.advance(45)
    assert driver.heartbeat(claimed.job.id, claimed.claim_token, 30)
    assert get(driver, claimed.job.id).visible_at == at(clock.now() + 30)
    assert driver.steps.record(claimed.job.id, claimed.claim_token, "s", 1)
    clock.advance(45)
    assert driver.ack(claimed.job.id, claimed.claim_token)
    assert get(driver, claimed.job.id).state == "done"


def test_heartbeat_reports_a_cancel(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.heartbeat(claimed.job.id, claimed.claim_token, 30) is True
    driver.cancel(claimed.job.id)
    assert driver.heartbeat(claimed.job.id, claimed.claim_token, 30) is False
    assert get(driver, claimed.job.id).state == "cancelled"


def test_heartbeat_extends_visibility_from_now(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver, visibility_timeout=30)
    clock.advance(10)
    assert driver.heartbeat(claimed.job.id, claimed.claim_token, 120) is True
    job = get(driver, claimed.job.id)
    assert job.visible_at == at(clock.now() + 120)
    assert job.state == "running" and job.attempt == 1
