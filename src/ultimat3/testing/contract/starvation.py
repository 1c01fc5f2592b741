"""No runnable job starves: whatever way it became runnable, and wherever a claimer stands in
claim order, a claim hands it out by :data:`~ultimat3.drivers.protocol.CLAIM_STARVATION_BOUND`
seconds later at the latest (PostgreSQL keeps a cursor per claimer to stay off what earlier jobs
left in its index; these cases are what a cursor could pass by)."""

from __future__ import annotations

from typing import Any

from ultimat3.core.clock import ManualClock, to_datetime
from ultimat3.drivers.protocol import CLAIM_STARVATION_BOUND, ClaimedJob, JobDriver

from .helpers import Backdoor, claim, claim_one, enqueue


def _ids(claimed: list[ClaimedJob]) -> list[str]:
    return [c.job.id for c in claimed]


def _in_order(driver: JobDriver, clock: ManualClock, count: int, **fields: Any) -> list[str]:
    """``count`` jobs a millisecond apart, so claim order is enqueue order (not the id tiebreak)."""
    ids = []
    for _ in range(count):
        ids.append(enqueue(driver, **fields).id)
        clock.advance(0.001)
    return ids


def test_a_job_enqueued_with_an_earlier_run_at_than_the_last_claim_is_claimed_next(
        driver: JobDriver, clock: ManualClock) -> None:
    first, second = _in_order(driver, clock, 2)
    assert _ids(claim(driver, visibility_timeout=300)) == [first]
    behind = enqueue(driver, run_at=clock.now() - 3600).id
    assert _ids(claim(driver, limit=2, visibility_timeout=300)) == [behind, second]


def test_a_higher_priority_job_enqueued_after_the_claims_moved_on_is_claimed_next(
        driver: JobDriver, clock: ManualClock) -> None:
    low = _in_order(driver, clock, 3)
    assert _ids(claim(driver, visibility_timeout=300)) == low[:1]
    urgent = enqueue(driver, priority=5).id
    assert _ids(claim(driver, limit=2, visibility_timeout=300)) == [urgent, low[1]]


def test_a_lower_priority_job_is_claimed_once_the_higher_ones_are_gone(
        driver: JobDriver, clock: ManualClock) -> None:
    high = enqueue(driver, priority=5).id
    clock.advance(0.001)
    assert _ids(claim(driver, visibility_timeout=300)) == [high]
    low = enqueue(driver, priority=-5).id
    later_high = enqueue(driver, priority=5).id
    assert _ids(claim(driver, limit=5, visibility_timeout=300)) == [later_high, low]


def test_a_job_of_a_resumed_queue_is_claimed_though_claims_over_every_queue_moved_past_it(
        driver: JobDriver, clock: ManualClock) -> None:
    driver.queues.pause("billing", "ops")
    held = enqueue(driver, queue="billing").id
    clock.advance(1)
    mail = _in_order(driver, clock, 3, queue="mail")
    assert _ids(claim(driver, limit=2, visibility_timeout=300)) == mail[:2]
    driver.queues.resume("billing", "ops")
    assert _ids(claim(driver, limit=2, visibility_timeout=300)) == [held, mail[2]]


def test_a_lapsed_claim_is_claimed_again_whatever_claims_came_in_between(
        driver: JobDriver, clock: ManualClock) -> None:
    lost = enqueue(driver).id
    clock.advance(0.001)
    claim_one(driver, "w1", visibility_timeout=5)
    fresh = _in_order(driver, clock, 3)
    for expected in fresh[:2]:
        clock.advance(1)
        assert _ids(claim(driver, "w2", visibility_timeout=300)) == [expected]
    clock.advance(4)  # w1's claim lapses now, between two of w2's claims
    assert _ids(claim(driver, "w2", limit=5, visibility_timeout=300)) == [lost, fresh[2]]


def test_a_job_made_runnable_behind_the_claims_without_notice_is_claimed_within_the_bound(
        driver: JobDriver, clock: ManualClock, backdoor: Backdoor) -> None:
    # A row written by another process whose notice this claimer never hears (or a commit that
    # landed after the claims passed its place): only the bound promises it.
    jobs = _in_order(driver, clock, 4)
    assert _ids(claim(driver, visibility_timeout=300)) == jobs[:1]
    backdoor.set_run_at(jobs[3], to_datetime(clock.now() - 3600))
    claimed = _ids(claim(driver, visibility_timeout=300))
    if jobs[3] not in claimed:
        clock.advance(CLAIM_STARVATION_BOUND)
        claimed = _ids(claim(driver, visibility_timeout=300))
    assert claimed == [jobs[3]]
