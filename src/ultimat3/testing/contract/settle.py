"""Settling an attempt: ack, nack (retry later), dead-letter, suspension."""

from __future__ import annotations

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver, NackRequest

from .helpers import Backdoor, at, claim, claim_one, dead_letter, enqueue, enqueue_and_claim, get, retry_later, suspend


def test_ack_marks_the_job_done_with_its_result(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    clock.advance(3)
    result = {"sent": 3, "ids": ["a", "ü"], "meta": {"ok": True, "none": None}}
    assert driver.ack(claimed.job.id, claimed.claim_token, result) is True

    job = get(driver, claimed.job.id)
    assert job.state == "done"
    assert job.result == result
    assert job.finished_at == at(clock.now())
    assert job.updated_at == at(clock.now())
    assert job.attempt == 1


def test_ack_without_a_result_stores_none(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.ack(claimed.job.id, claimed.claim_token)
    job = get(driver, claimed.job.id)
    assert job.state == "done" and job.result is None


def test_second_ack_is_refused(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.ack(claimed.job.id, claimed.claim_token, 1) is True
    assert driver.ack(claimed.job.id, claimed.claim_token, 2) is False
    assert get(driver, claimed.job.id).result == 1


def test_nack_puts_the_job_back_ready(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    clock.advance(2)
    assert driver.nack(claimed.job.id, claimed.claim_token, retry_later(error="boom")) is True

    job = get(driver, claimed.job.id)
    assert job.state == "ready"
    assert job.run_at == at(clock.now())
    assert job.attempt == 1
    assert job.last_error == "boom"
    assert job.visible_at is None
    assert job.finished_at is None

    again = claim_one(driver, "w2")
    assert again.job.id == claimed.job.id
    assert again.job.attempt == 2
    assert again.job.last_error == "boom"


def test_nack_delay_holds_the_job_back(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.nack(claimed.job.id, claimed.claim_token, retry_later(delay=10))
    job = get(driver, claimed.job.id)
    assert job.state == "ready"
    assert job.run_at == at(clock.now() + 10)
    clock.advance(9)
    assert claim(driver) == []
    clock.advance(1)
    assert claim_one(driver).job.attempt == 2


def test_nack_without_an_error_keeps_the_last_one(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.nack(claimed.job.id, claimed.claim_token, retry_later(error="first"))
    again = claim_one(driver)
    assert driver.nack(again.job.id, again.claim_token, NackRequest())
    assert get(driver, claimed.job.id).last_error == "first"


def test_dead_letter_ends_the_job(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    clock.advance(4)
    assert driver.nack(claimed.job.id, claimed.claim_token, dead_letter("gave up")) is True

    job = get(driver, claimed.job.id)
    assert job.state == "dead"
    assert job.last_error == "gave up"
    assert job.finished_at == at(clock.now())
    assert job.attempt == 1
    clock.advance(86_400)
    assert claim(driver) == []


def test_suspension_gives_the_attempt_back(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    assert claimed.job.attempt == 1
    assert driver.nack(claimed.job.id, claimed.claim_token, suspend(100)) is True

    job = get(driver, claimed.job.id)
    assert job.state == "suspended"
    assert job.attempt == 0
    assert job.run_at == at(clock.now() + 100)
    assert job.visible_at is None and job.finished_at is None
    clock.advance(99)
    assert claim(driver) == []
    clock.advance(1)
    woken = claim_one(driver)
    assert woken.job.id == claimed.job.id
    assert woken.job.attempt == 1


def test_repeated_suspensions_never_burn_attempts(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    for _ in range(5):
        assert driver.nack(claimed.job.id, claimed.claim_token, suspend(1))
        clock.advance(1)
        claimed = claim_one(driver)
        assert claimed.job.attempt == 1


def test_suspension_after_a_failed_attempt_keeps_the_failure_counted(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.nack(claimed.job.id, claimed.claim_token, retry_later())
    second = claim_one(driver)
    assert second.job.attempt == 2
    assert driver.nack(second.job.id, second.claim_token, suspend(0))
    job = get(driver, claimed.job.id)
    assert (job.state, job.attempt) == ("suspended", 1)


def test_suspension_never_drives_attempt_below_zero(driver: JobDriver, backdoor: Backdoor) -> None:
    claimed = enqueue_and_claim(driver)
    backdoor.set_attempt(claimed.job.id, 0)
    assert get(driver, claimed.job.id).attempt == 0

    assert driver.nack(claimed.job.id, claimed.claim_token, suspend(5)) is True
    job = get(driver, claimed.job.id)
    assert job.state == "suspended"
    assert job.attempt == 0


def test_suspension_stores_an_error_when_given(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver)
    request = NackRequest(error="sleeping", delay=1, counts_as_attempt=False)
    assert driver.nack(claimed.job.id, claimed.claim_token, request)
    assert get(driver, claimed.job.id).last_error == "sleeping"


def test_ack_many_settles_each_job_under_its_own_fence(driver: JobDriver, clock: ManualClock) -> None:
    from ultimat3.drivers.protocol import Ack

    for n in range(4):
        enqueue(driver, payload={"n": n})
    first, second, third, fourth = claim(driver, "w1", limit=4)
    assert driver.cancel(third.job.id, "operator") is not None  # its claim is gone
    clock.advance(1)
    settled = driver.ack_many([
        Ack(first.job.id, first.claim_token, {"n": 0}),
        Ack(second.job.id, "w1:1:not-the-token", {"n": 1}),
        Ack(third.job.id, third.claim_token, {"n": 2}),
        Ack(fourth.job.id, fourth.claim_token),
        Ack("no-such-job", "w1:1:x"),
    ])
    assert settled == [True, False, False, True, False]
    assert (get(driver, first.job.id).state, get(driver, first.job.id).result) == ("done", {"n": 0})
    assert get(driver, first.job.id).finished_at == at(clock.now())
    assert get(driver, second.job.id).state == "running"
    assert get(driver, third.job.id).state == "cancelled"
    assert (get(driver, fourth.job.id).state, get(driver, fourth.job.id).result) == ("done", None)
    # A second round changes nothing: each ack is fenced on its own token.
    assert driver.ack_many([Ack(first.job.id, first.claim_token, "again")]) == [False]
    assert get(driver, first.job.id).result == {"n": 0}
    assert driver.ack_many([]) == []


def test_ack_many_refuses_a_result_it_cannot_store_before_writing(driver: JobDriver) -> None:
    import pytest

    from ultimat3.core.errors import XError
    from ultimat3.drivers.protocol import Ack

    enqueue(driver)
    enqueue(driver)
    good, bad = claim(driver, "w1", limit=2)
    with pytest.raises(XError) as caught:
        driver.ack_many([Ack(good.job.id, good.claim_token, 1), Ack(bad.job.id, bad.claim_token, float("nan"))])
    assert caught.value.code == "X_JOB_RESULT"
    assert get(driver, good.job.id).state == "running"


def test_a_done_job_carries_no_error_from_an_earlier_attempt(driver: JobDriver) -> None:
    first = enqueue_and_claim(driver)
    assert driver.nack(first.job.id, first.claim_token, retry_later(error="boom"))
    second = claim_one(driver, "w2")
    assert driver.ack(second.job.id, second.claim_token, "ok")
    job = get(driver, first.job.id)
    assert job.state == "done" and job.last_error is None


def test_a_done_job_from_ack_many_carries_no_stale_error(driver: JobDriver) -> None:
    from ultimat3.drivers.protocol import Ack

    first = enqueue_and_claim(driver)
    assert driver.nack(first.job.id, first.claim_token, retry_later(error="boom"))
    second = claim_one(driver, "w2")
    assert driver.ack_many([Ack(second.job.id, second.claim_token, 1)]) == [True]
    assert get(driver, first.job.id).last_error is None


def test_release_returns_the_job_to_ready_unclaimed_with_its_attempt_back(
    driver: JobDriver, clock: ManualClock
) -> None:
    first = enqueue_and_claim(driver)
    assert driver.nack(first.job.id, first.claim_token, retry_later(error="boom"))
    claimed = claim_one(driver, "w2")
    assert claimed.job.attempt == 2
    clock.advance(1)
    released = NackRequest(error="released at shutdown", counts_as_attempt=False, release=True)
    assert driver.nack(claimed.job.id, claimed.claim_token, released) is True

    job = get(driver, claimed.job.id)
    assert job.state == "ready"
    assert job.attempt == 1  # the attempt this claim took is given back
    assert job.claimed_by is None
    assert job.visible_at is None and job.finished_at is None
    assert job.last_error == "boom"  # a release records nothing: the earlier failure stays as it was
    assert job.run_at == at(clock.now())
    # Fenced like every nack, and runnable again at once by anyone.
    assert driver.nack(claimed.job.id, claimed.claim_token, released) is False
    assert claim_one(driver, "w3").job.attempt == 2


def test_release_with_a_delay_holds_the_job_back(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    request = NackRequest(counts_as_attempt=False, release=True, delay=60)
    assert driver.nack(claimed.job.id, claimed.claim_token, request)
    job = get(driver, claimed.job.id)
    assert job.state == "ready" and job.attempt == 0 and job.run_at == at(clock.now() + 60)
    assert claim(driver, "w2") == []
