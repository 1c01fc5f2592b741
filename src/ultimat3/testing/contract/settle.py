"""Settling an attempt: ack, nack (retry later), dead-letter, suspension."""

from __future__ import annotations

from typing import Any

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import Ack, ClaimRequest, JobDriver, NackRequest

from .helpers import (
    Backdoor,
    at,
    claim,
    claim_one,
    dead_letter,
    enqueue,
    enqueue_and_claim,
    get,
    request,
    retry_later,
    suspend,
)


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


def test_ack_many_answers_a_stale_and_a_live_ack_of_one_job_apart(driver: JobDriver, clock: ManualClock) -> None:
    # A claim that lapsed and was taken again (here by the same worker) leaves two tokens for one
    # job in the worker's hands; both may finish in one batch, in either order. Only the live
    # token settles, and each ack is answered for itself.
    stale_first = enqueue(driver).id
    clock.advance(0.001)
    live_first = enqueue(driver).id
    old = {c.job.id: c.claim_token for c in claim(driver, "w1", limit=2, visibility_timeout=5)}
    clock.advance(10)
    new = {c.job.id: c.claim_token for c in claim(driver, "w1", limit=2, visibility_timeout=60)}
    assert set(new) == {stale_first, live_first}
    settled = driver.ack_many([
        Ack(stale_first, old[stale_first], "stale"),
        Ack(stale_first, new[stale_first], "live"),
        Ack(live_first, new[live_first], "live"),
        Ack(live_first, old[live_first], "stale"),
    ])
    assert settled == [False, True, True, False]
    assert [get(driver, j).result for j in (stale_first, live_first)] == ["live", "live"]
    assert [get(driver, j).state for j in (stale_first, live_first)] == ["done", "done"]


def test_ack_and_claim_answers_a_stale_and_a_live_ack_of_one_job_apart(
    driver: JobDriver, clock: ManualClock
) -> None:
    job = enqueue(driver).id
    old = claim_one(driver, "w1", visibility_timeout=5).claim_token
    clock.advance(10)
    live = claim_one(driver, "w1", visibility_timeout=60).claim_token
    settled, claimed = driver.ack_and_claim([Ack(job, live, "live"), Ack(job, old, "stale")],
                                            _claim_request("w1", limit=1))
    assert (settled, list(claimed)) == ([True, False], [])
    assert get(driver, job).result == "live"


def test_ack_many_refuses_a_result_it_cannot_store_before_writing(driver: JobDriver) -> None:
    import pytest

    from ultimat3.core.errors import XError
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


def _claim_request(worker: str = "w1", limit: int = 2, **fields: Any) -> ClaimRequest:
    fields.setdefault("visibility_timeout", 30.0)
    return ClaimRequest(worker_id=worker, limit=limit, **fields)


def test_ack_and_claim_settles_fenced_acks_and_claims_the_next_jobs_in_order(
    driver: JobDriver, clock: ManualClock
) -> None:
    jobs = []
    for n in range(6):
        jobs.append(enqueue(driver, payload={"n": n}).id)
        clock.advance(0.001)
    first, second = claim(driver, "w1", limit=2)
    clock.advance(1)
    settled, claimed = driver.ack_and_claim(
        [Ack(first.job.id, first.claim_token, {"n": 0}), Ack(second.job.id, "w1:1:not-the-token")],
        _claim_request("w2", limit=2),
    )
    assert settled == [True, False]
    assert [c.job.id for c in claimed] == jobs[2:4]
    assert all(c.job.state == "running" and c.job.claimed_by == "w2" and c.job.attempt == 1 for c in claimed)
    assert len({c.claim_token for c in claimed}) == 2
    assert (get(driver, first.job.id).state, get(driver, first.job.id).result) == ("done", {"n": 0})
    assert get(driver, first.job.id).finished_at == at(clock.now())
    assert get(driver, second.job.id).state == "running"
    # The claim moved on: the next one starts where it stopped, and the acked job is not seen again.
    assert [c.job.id for c in claim(driver, "w3", limit=5)] == jobs[4:]
    # A claimed job is fenced as any other: its token acks it, once.
    assert driver.ack_many([Ack(claimed[0].job.id, claimed[0].claim_token)]) == [True]
    assert driver.ack_and_claim([Ack(claimed[0].job.id, claimed[0].claim_token)], _claim_request()) == ([False], [])


def test_ack_and_claim_with_nothing_to_ack_or_to_claim(driver: JobDriver) -> None:
    only = enqueue(driver).id
    settled, claimed = driver.ack_and_claim([], _claim_request(limit=3))
    assert settled == [] and [c.job.id for c in claimed] == [only]
    settled, claimed = driver.ack_and_claim([Ack(claimed[0].job.id, claimed[0].claim_token, 7)],
                                            _claim_request(limit=3))
    assert settled == [True] and claimed == []
    assert get(driver, only).result == 7
    enqueue(driver)
    for nothing in (_claim_request(limit=0), _claim_request(names=()), _claim_request(queues=())):
        assert driver.ack_and_claim([Ack("no-such-job", "w1:1:x")], nothing) == ([False], [])


def test_ack_and_claim_hands_a_freed_concurrency_slot_to_its_own_claim(driver: JobDriver, clock: ManualClock) -> None:
    held = driver.enqueue(request("flow.task", flow_key="k", flow_max=1)).id
    clock.advance(0.001)
    waiting = driver.enqueue(request("flow.task", flow_key="k", flow_max=1)).id
    clock.advance(1)
    [running] = claim(driver, "w1", limit=5, flow=True)
    assert running.job.id == held
    assert claim(driver, "w1", limit=5, flow=True) == []  # the key is full
    settled, claimed = driver.ack_and_claim([Ack(running.job.id, running.claim_token)],
                                            _claim_request(limit=5, flow=True))
    assert settled == [True] and [c.job.id for c in claimed] == [waiting]


def test_ack_and_claim_takes_over_a_lapsed_claim(driver: JobDriver, clock: ManualClock) -> None:
    lost = enqueue(driver).id
    clock.advance(0.001)
    done = enqueue(driver).id
    first = claim_one(driver, "w1", visibility_timeout=5)
    second = claim_one(driver, "w2", visibility_timeout=60)
    assert (first.job.id, second.job.id) == (lost, done)
    clock.advance(10)
    settled, claimed = driver.ack_and_claim([Ack(done, second.claim_token)], _claim_request("w3", limit=2))
    assert settled == [True]
    assert [(c.job.id, c.job.attempt, c.job.claimed_by) for c in claimed] == [(lost, 2, "w3")]
    assert driver.ack(lost, first.claim_token) is False  # the first claim lost its fence


def test_ack_and_claim_refuses_before_writing_anything(driver: JobDriver, clock: ManualClock) -> None:
    import pytest

    from ultimat3.core.errors import XError

    for _ in range(2):
        enqueue(driver)
        clock.advance(0.001)
    spare = enqueue(driver).id
    good, bad = claim(driver, "w1", limit=2)
    assert spare not in (good.job.id, bad.job.id)
    with pytest.raises(XError) as caught:
        driver.ack_and_claim([Ack(good.job.id, good.claim_token, 1), Ack(bad.job.id, bad.claim_token, float("nan"))],
                             _claim_request(limit=5))
    assert caught.value.code == "X_JOB_RESULT"
    with pytest.raises(XError) as weighed:
        driver.ack_and_claim([Ack(good.job.id, good.claim_token, 1)],
                             _claim_request(limit=5, fair=True, weights={"acme": 0}))
    assert weighed.value.code == "X_FAIR_WEIGHT"
    assert get(driver, good.job.id).state == "running"
    assert get(driver, spare).state == "ready"
