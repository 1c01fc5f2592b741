"""Claim: what is runnable, in which order, for whom, and never twice at once."""

from __future__ import annotations

import threading

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import ClaimedJob, ClaimRequest, JobDriver

from .helpers import at, claim, claim_one, dead_letter, enqueue, get, request


def test_claim_moves_the_job_to_running(driver: JobDriver, clock: ManualClock) -> None:
    result = enqueue(driver, "sync")
    clock.advance(5)
    claimed = claim_one(driver, "worker-a", visibility_timeout=30)

    job = claimed.job
    assert job.id == result.id
    assert job.state == "running"
    assert job.attempt == 1
    assert job.claimed_by == "worker-a"
    assert job.visible_at == at(clock.now() + 30)
    assert job.updated_at == at(clock.now())
    assert claimed.claim_token.startswith("worker-a:1:")
    # What claim hands back is what the store now holds.
    assert get(driver, result.id) == job


#: A payload with what JSON must escape or keep exact: each driver reads it back as it went in.
_RICH_PAYLOAD = {"text": "caf\u00e9 \u2028 \"q\" \\ \t \U0001f600", "big": 2**53 + 1, "neg": -(2**31), "f": 0.1,
                 "nested": {"list": [1, None, True, "x"], "empty": {}}, "none": None}


@pytest.mark.parametrize("path", ["plain", "lapsed", "fair", "flow", "rate", "several queues"])
def test_every_claim_path_hands_back_the_stored_record(driver: JobDriver, clock: ManualClock, path: str) -> None:
    fields: dict[str, object] = {
        "queue": "q1", "idempotency_key": "k-1", "priority": 3, "max_attempts": 7, "tenant_id": "org|a",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "enqueued_by": "ops|alice",
    }
    if path == "flow":
        fields.update(flow_key="org|a", flow_max=2)
    if path == "rate":
        fields.update(rate_key="org|a", rate_per_second=2.5, rate_burst=3)
    result = enqueue(driver, "rich", dict(_RICH_PAYLOAD), **fields)
    clock.advance(1)
    how: dict[str, object] = {"visibility_timeout": 30}
    if path == "lapsed":
        claim_one(driver, "w0", **how)
        clock.advance(31)
    elif path == "fair":
        how["fair"] = True
    elif path in ("flow", "rate"):
        how["flow"] = True
    elif path == "several queues":
        how["queues"] = ("q1", "q2")
    claimed = claim_one(driver, "w1", **how)
    assert claimed.job.id == result.id
    assert claimed.job.payload == _RICH_PAYLOAD
    assert claimed.job.state == "running"
    assert claimed.claim_token.startswith(f"w1:{claimed.job.attempt}:")
    assert get(driver, result.id) == claimed.job


def test_claim_with_nothing_runnable_returns_nothing(driver: JobDriver) -> None:
    assert claim(driver, limit=10) == []


def test_running_job_is_not_claimed_again_while_visible(driver: JobDriver, clock: ManualClock) -> None:
    enqueue(driver)
    claim_one(driver, "w1", visibility_timeout=30)
    clock.advance(29)
    assert claim(driver, "w2") == []


def test_finished_jobs_are_never_claimed(driver: JobDriver, clock: ManualClock) -> None:
    done = enqueue(driver, "a")
    dead = enqueue(driver, "b")
    cancelled = enqueue(driver, "c")
    driver.cancel(cancelled.id)
    for claimed in claim(driver, limit=2):
        if claimed.job.id == done.id:
            assert driver.ack(done.id, claimed.claim_token)
        else:
            assert driver.nack(dead.id, claimed.claim_token, dead_letter())
    clock.advance(3600)
    assert claim(driver, limit=10) == []
    assert {get(driver, j.id).state for j in (done, dead, cancelled)} == {"done", "dead", "cancelled"}


def test_delayed_job_is_claimable_once_run_at_passes(driver: JobDriver, clock: ManualClock) -> None:
    result = enqueue(driver, run_at=clock.now() + 60)
    assert claim(driver) == []
    clock.advance(59)
    assert claim(driver) == []
    clock.advance(1)  # run_at <= now: due exactly at run_at
    claimed = claim_one(driver)
    assert claimed.job.id == result.id
    assert claimed.job.state == "running"


def test_claim_takes_higher_priority_first(driver: JobDriver) -> None:
    low = enqueue(driver, priority=0)
    high = enqueue(driver, priority=10)
    mid = enqueue(driver, priority=5)
    negative = enqueue(driver, priority=-3)
    order = [c.job.id for c in claim(driver, limit=10)]
    assert order == [high.id, mid.id, low.id, negative.id]


def test_claim_takes_earlier_run_at_first_within_a_priority(driver: JobDriver, clock: ManualClock) -> None:
    now = clock.now()
    middle = enqueue(driver, run_at=now - 20)
    latest = enqueue(driver, run_at=now - 10)
    earliest = enqueue(driver, run_at=now - 30)
    order = [c.job.id for c in claim(driver, limit=10)]
    assert order == [earliest.id, middle.id, latest.id]


def test_priority_outranks_run_at(driver: JobDriver, clock: ManualClock) -> None:
    old_low = enqueue(driver, priority=0, run_at=clock.now() - 3600)
    new_high = enqueue(driver, priority=1)
    assert [c.job.id for c in claim(driver, limit=2)] == [new_high.id, old_low.id]


def test_claim_breaks_ties_by_id(driver: JobDriver) -> None:
    ids = [enqueue(driver).id for _ in range(6)]  # same priority, same run_at
    assert [c.job.id for c in claim(driver, limit=10)] == sorted(ids)


def test_claim_respects_the_batch_limit(driver: JobDriver) -> None:
    ids = {enqueue(driver).id for _ in range(5)}
    first = claim(driver, limit=3)
    second = claim(driver, limit=3)
    assert (len(first), len(second)) == (3, 2)
    assert {c.job.id for c in first} | {c.job.id for c in second} == ids
    assert claim(driver, limit=3) == []
    assert len({c.claim_token for c in first + second}) == 5


def test_claim_filters_by_queue(driver: JobDriver) -> None:
    mail = enqueue(driver, queue="mail")
    enqueue(driver, queue="reports")
    default = enqueue(driver)
    assert claim(driver, limit=10, queues=("nothing",)) == []
    assert [c.job.id for c in claim(driver, limit=10, queues=("mail",))] == [mail.id]
    assert [c.job.id for c in claim(driver, limit=10, queues=("default", "mail"))] == [default.id]
    assert [c.job.queue for c in claim(driver, limit=10)] == ["reports"]


def test_claim_filters_by_name(driver: JobDriver) -> None:
    a = enqueue(driver, "a")
    b = enqueue(driver, "b")
    enqueue(driver, "c")
    claimed = {c.job.id for c in claim(driver, limit=10, names=("a", "b"))}
    assert claimed == {a.id, b.id}
    assert [c.job.name for c in claim(driver, limit=10)] == ["c"]


def test_claim_filters_by_queue_and_name_together(driver: JobDriver) -> None:
    target = enqueue(driver, "a", queue="q1")
    enqueue(driver, "a", queue="q2")
    enqueue(driver, "b", queue="q1")
    claimed = claim(driver, limit=10, queues=("q1",), names=("a",))
    assert [c.job.id for c in claimed] == [target.id]


def test_lapsed_claim_is_claimed_again(driver: JobDriver, clock: ManualClock) -> None:
    result = enqueue(driver)
    first = claim_one(driver, "w1", visibility_timeout=30)
    clock.advance(30)  # visible_at <= now: the claim has lapsed
    second = claim_one(driver, "w2", visibility_timeout=30)
    assert second.job.id == result.id
    assert second.job.attempt == 2
    assert second.job.claimed_by == "w2"
    assert second.job.visible_at == at(clock.now() + 30)
    assert second.claim_token != first.claim_token
    assert second.claim_token.startswith("w2:2:")


def test_same_worker_reclaiming_gets_a_new_token(driver: JobDriver, clock: ManualClock) -> None:
    enqueue(driver)
    first = claim_one(driver, "w1", visibility_timeout=10)
    clock.advance(11)
    second = claim_one(driver, "w1", visibility_timeout=10)
    assert second.claim_token != first.claim_token
    assert not driver.ack(first.job.id, first.claim_token)
    assert driver.ack(second.job.id, second.claim_token)


def test_heartbeat_keeps_the_claim_alive(driver: JobDriver, clock: ManualClock) -> None:
    result = enqueue(driver)
    claimed = claim_one(driver, visibility_timeout=30)
    clock.advance(20)
    assert driver.heartbeat(result.id, claimed.claim_token, 30)
    assert get(driver, result.id).visible_at == at(clock.now() + 30)
    clock.advance(20)  # 40s after the claim, 20s after the heartbeat
    assert claim(driver, "w2") == []
    clock.advance(10)
    assert claim_one(driver, "w2").job.id == result.id


def test_concurrent_claims_never_hand_one_job_to_two_claimers(driver: JobDriver) -> None:
    total, threads, per_claim = 200, 8, 5
    ids = {r.id for r in driver.enqueue_many([request("bulk", {"i": i}) for i in range(total)])}
    barrier = threading.Barrier(threads)
    taken: list[list[ClaimedJob]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            barrier.wait()
            while True:
                batch = driver.claim(ClaimRequest(worker_id=f"w{index}", limit=per_claim, visibility_timeout=300))
                if not batch:
                    return
                assert len(batch) <= per_claim
                taken[index].extend(batch)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in pool)
    assert errors == [], [repr(error) for error in errors]

    claimed_ids = [c.job.id for batch in taken for c in batch]
    assert len(claimed_ids) == len(set(claimed_ids)), "a job was handed to two claimers"
    assert set(claimed_ids) == ids
    # Each job's claimant is the thread that got it, and its token is the one that works.
    for index, batch in enumerate(taken):
        for c in batch:
            assert c.job.claimed_by == f"w{index}"
    assert claim(driver, limit=10) == []
    stats = {s.queue: s.counts for s in driver.introspect.stats()}
    assert stats["default"]["running"] == total


@pytest.mark.parametrize("limit", [1, 7])
def test_claim_returns_at_most_what_is_runnable(driver: JobDriver, limit: int) -> None:
    for _ in range(3):
        enqueue(driver)
    assert len(claim(driver, limit=limit)) == min(limit, 3)
