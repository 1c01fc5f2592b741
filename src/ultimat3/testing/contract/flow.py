"""Flow control at claim: per-key concurrency limits, rate limits, and what a claim that does not
ask for them sees (nothing of theirs)."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import Ack, ClaimedJob, JobDriver, JobFilter, NackRequest

from .helpers import claim, enqueue, get


def limited(driver: JobDriver, key: str, max: int = 2, **fields: Any) -> str:
    """Enqueue one job under concurrency key ``key``; its id. The clock moves a millisecond after
    each, so jobs enqueued one after another are claimed in that order."""
    job_id = enqueue(driver, "flow.task", flow_key=key, flow_max=max, **fields).id
    _tick(driver)
    return job_id


def rated(driver: JobDriver, key: str, per_second: float, burst: int, **fields: Any) -> str:
    """Enqueue one job under rate key ``key``; its id (the clock moves as in :func:`limited`)."""
    job_id = enqueue(driver, "flow.task", rate_key=key, rate_per_second=per_second, rate_burst=burst, **fields).id
    _tick(driver)
    return job_id


def _tick(driver: JobDriver) -> None:
    clock = driver.clock
    assert isinstance(clock, ManualClock), "the contract suite runs drivers on a ManualClock"
    clock.advance(0.001)


def flow_claim(driver: JobDriver, limit: int = 10, worker: str = "w1", **fields: Any) -> list[ClaimedJob]:
    """A claim that takes flow-controlled jobs (an hour's visibility unless given)."""
    fields.setdefault("visibility_timeout", 3600.0)
    return claim(driver, worker, limit=limit, flow=True, **fields)


def ids(claimed: list[ClaimedJob]) -> set[str]:
    """The ids of what a claim returned."""
    return {c.job.id for c in claimed}


def test_at_most_max_run_per_key(driver: JobDriver, clock: ManualClock) -> None:
    a = [limited(driver, "org|a") for _ in range(5)]
    b = [limited(driver, "org|b") for _ in range(3)]
    plain = enqueue(driver, "plain").id
    clock.advance(1)

    first = flow_claim(driver, limit=10)
    assert ids(first) == {a[0], a[1], b[0], b[1], plain}
    assert flow_claim(driver, limit=10) == []
    # Over the limit: claimable by nothing, and no attempt spent on them.
    assert [get(driver, job_id).attempt for job_id in a[2:]] == [0, 0, 0]
    assert {get(driver, job_id).state for job_id in a[2:]} == {"ready"}

    held = next(c for c in first if c.job.id == a[0])
    assert driver.ack_many([Ack(held.job.id, held.claim_token)]) == [True]
    assert ids(flow_claim(driver, limit=10)) == {a[2]}
    assert flow_claim(driver, limit=10) == []


def test_every_way_out_of_running_frees_the_slot(driver: JobDriver, clock: ManualClock) -> None:
    jobs = [limited(driver, "k", max=1) for _ in range(5)]
    clock.advance(1)
    order: list[str] = []
    for settle in ("ack", "retry", "dead", "cancel", "release"):
        [held] = flow_claim(driver, limit=5)
        order.append(held.job.id)
        assert flow_claim(driver, limit=5) == []
        if settle == "ack":
            assert driver.ack(held.job.id, held.claim_token)
        elif settle == "retry":
            assert driver.nack(held.job.id, held.claim_token, NackRequest(error="boom", delay=3600))
        elif settle == "dead":
            assert driver.nack(held.job.id, held.claim_token, NackRequest(error="fatal", dead_letter=True))
        elif settle == "cancel":
            assert driver.cancel(held.job.id, reason="stop") is not None
        else:
            assert driver.nack(held.job.id, held.claim_token, NackRequest(release=True, delay=3600))
    assert order == jobs


def test_a_full_key_stands_in_no_ones_way(driver: JobDriver, clock: ManualClock) -> None:
    backlog = [limited(driver, "busy", max=1, priority=10) for _ in range(40)]
    clock.advance(1)
    other = limited(driver, "quiet", max=1)
    rate_ok = rated(driver, "r", 10, 5)
    plain = [enqueue(driver, "plain", priority=-1).id for _ in range(3)]
    clock.advance(1)

    assert ids(flow_claim(driver, limit=1)) == {backlog[0]}
    # The busy key's 39 waiting jobs come first in claim order, yet the jobs behind them run.
    assert ids(flow_claim(driver, limit=2)) == {other, rate_ok}
    assert ids(flow_claim(driver, limit=5)) == set(plain)
    assert {get(driver, job_id).attempt for job_id in backlog[1:]} == {0}


def test_a_claim_that_does_not_ask_takes_none_of_them(driver: JobDriver, clock: ManualClock) -> None:
    limited(driver, "k")
    rated(driver, "r", 5, 5)
    plain = enqueue(driver, "plain").id
    clock.advance(1)
    assert ids(claim(driver, "w1", limit=10)) == {plain}
    assert claim(driver, "w1", limit=10) == []
    assert len(flow_claim(driver)) == 2


def test_flow_claims_honour_queues_names_pauses_and_order(driver: JobDriver, clock: ManualClock) -> None:
    low = limited(driver, "k", max=5, priority=1)
    high = limited(driver, "k", max=5, priority=9)
    other_queue = limited(driver, "k", max=5, queue="elsewhere")
    other_name = enqueue(driver, "flow.other", flow_key="k2", flow_max=5).id
    later = limited(driver, "k", max=5, run_at=clock.now() + 60)
    clock.advance(1)
    assert [c.job.id for c in flow_claim(driver, queues=("default",), names=("flow.task",))] == [high, low]
    driver.queues.pause("elsewhere", "ops")
    assert ids(flow_claim(driver)) == {other_name}
    driver.queues.resume("elsewhere", "ops")
    assert ids(flow_claim(driver)) == {other_queue}
    clock.advance(60)
    assert ids(flow_claim(driver)) == {later}


def test_a_lapsed_holder_keeps_its_slot_until_taken_over(driver: JobDriver, clock: ManualClock) -> None:
    first = limited(driver, "k", max=1)
    second = limited(driver, "k", max=1)
    clock.advance(1)
    [held] = flow_claim(driver, worker="lost", visibility_timeout=10)
    assert held.job.id == first
    clock.advance(11)
    # The lapsed job is taken over (in its slot); the key still runs one at a time.
    taken = flow_claim(driver, worker="w2", limit=5)
    assert ids(taken) == {first}
    assert flow_claim(driver, worker="w3", limit=5) == []
    assert not driver.ack(first, held.claim_token)  # the lost worker is fenced out
    assert driver.ack(first, taken[0].claim_token)
    assert ids(flow_claim(driver, worker="w3")) == {second}


def test_rate_limit_spends_a_burst_then_refills(driver: JobDriver, clock: ManualClock) -> None:
    jobs = [rated(driver, "smtp", per_second=2, burst=2) for _ in range(6)]
    clock.advance(1)
    batch = flow_claim(driver)
    assert [c.job.id for c in batch] == jobs[:2]
    assert getattr(batch, "wake_at", None) == pytest.approx(clock.now() + 0.5)
    assert [get(driver, job_id).attempt for job_id in jobs[2:]] == [0, 0, 0, 0]
    assert flow_claim(driver) == []
    clock.advance(0.5)
    assert [c.job.id for c in flow_claim(driver)] == [jobs[2]]
    clock.advance(0.25)
    assert flow_claim(driver) == []
    clock.advance(0.25)
    assert [c.job.id for c in flow_claim(driver)] == [jobs[3]]
    # A quiet spell refills the bucket up to its burst, never beyond.
    clock.advance(60)
    assert [c.job.id for c in flow_claim(driver)] == jobs[4:6]


def test_rate_keys_are_independent_and_settling_gives_no_token_back(driver: JobDriver, clock: ManualClock) -> None:
    a = [rated(driver, "a", per_second=1, burst=1) for _ in range(2)]
    b = [rated(driver, "b", per_second=1, burst=1) for _ in range(2)]
    clock.advance(1)
    batch = flow_claim(driver)
    assert ids(batch) == {a[0], b[0]}
    for held in batch:
        assert driver.ack(held.job.id, held.claim_token)
    assert flow_claim(driver) == []  # a rate counts starts, not running jobs
    clock.advance(1)
    assert ids(flow_claim(driver)) == {a[1], b[1]}


def test_concurrency_and_rate_together(driver: JobDriver, clock: ManualClock) -> None:
    jobs = []
    for _ in range(3):
        jobs.append(enqueue(driver, "flow.task", flow_key="k", flow_max=1, rate_key="r", rate_per_second=1,
                            rate_burst=5).id)
        clock.advance(0.001)
    clock.advance(1)
    [held] = flow_claim(driver)
    assert held.job.id == jobs[0]
    assert driver.ack(held.job.id, held.claim_token)
    [held] = flow_claim(driver)  # the burst allows it, the slot is free again
    assert held.job.id == jobs[1]
    assert flow_claim(driver) == []
    # Only the two starts spent a token: a job turned away by its full key spends none.
    bucket = driver.introspect.rate_bucket("r")
    assert bucket is not None and bucket.level(clock.now()) == pytest.approx(3.0)


def test_records_carry_the_flow_fields(driver: JobDriver) -> None:
    job_id = enqueue(driver, "flow.task", flow_key="org|a", flow_max=3, rate_key="smtp", rate_per_second=14.0,
                     rate_burst=7).id
    record = get(driver, job_id)
    assert (record.flow_key, record.flow_max, record.rate_key, record.rate_per_second, record.rate_burst) == (
        "org|a", 3, "smtp", 14.0, 7)


@pytest.mark.parametrize("fields", [
    {"flow_key": "k"},
    {"flow_max": 2},
    {"flow_key": "k", "flow_max": 0},
    {"flow_key": "k\x00", "flow_max": 1},
    {"rate_key": "r", "rate_per_second": 0.0, "rate_burst": 1},
    {"rate_key": "r", "rate_per_second": float("nan"), "rate_burst": 1},
    {"rate_key": "r", "rate_per_second": 1.0},
    {"rate_key": "r", "rate_per_second": 1.0, "rate_burst": 0},
])
def test_incoherent_flow_fields_are_refused_whole(driver: JobDriver, fields: dict[str, Any]) -> None:
    with pytest.raises(XError) as raised:
        enqueue(driver, "flow.task", **fields)
    assert raised.value.code == "X_FLOW_FIELDS"
    assert driver.introspect.list() == []


def test_concurrent_claimers_never_exceed_the_limit(driver: JobDriver, clock: ManualClock) -> None:
    for _ in range(30):
        limited(driver, "shared", max=3)
    clock.advance(1)
    seen: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer(index: int) -> None:
        try:
            for _ in range(500):
                batch = flow_claim(driver, limit=2, worker=f"w{index}")
                if not batch and driver.introspect.count(JobFilter(), states=("ready",)) == 0:
                    return
                with lock:
                    running = [j for j in driver.introspect.list() if j.state == "running"]
                    seen.append(len(running))
                for held in batch:
                    assert driver.ack(held.job.id, held.claim_token)
        except BaseException as error:  # surfaced below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(claimer, i)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert max(seen) <= 3
    assert sum(1 for j in driver.introspect.list() if j.state == "done") == 30


def test_slot_holders_and_rate_buckets_are_readable(driver: JobDriver, clock: ManualClock) -> None:
    first = limited(driver, "org|a", max=2)
    second = limited(driver, "org|a", max=2)
    limited(driver, "org|a", max=2)
    clock.advance(1)
    claimed = {c.job.id: c for c in flow_claim(driver, worker="w7")}
    assert set(claimed) == {first, second}
    holders = driver.introspect.slot_holders("org|a")
    assert [h.id for h in holders] == sorted([first, second], key=lambda i: (claimed[i].job.updated_at, i))
    assert {h.claimed_by for h in holders} == {"w7"}
    assert driver.introspect.slot_holders("org|b") == []
    assert driver.introspect.slot_holders("bad\x00key") == []

    assert driver.introspect.rate_bucket("smtp") is None
    rated(driver, "smtp", per_second=4, burst=3)
    clock.advance(1)
    flow_claim(driver)
    bucket = driver.introspect.rate_bucket("smtp")
    assert bucket is not None
    assert (bucket.key, bucket.per_second, bucket.burst) == ("smtp", 4.0, 3)
    assert bucket.tokens == pytest.approx(2.0)
    assert bucket.at == pytest.approx(clock.now(), abs=1e-3)
    assert bucket.level(clock.now() + 0.125) == pytest.approx(2.5)


def test_prune_forgets_buckets_that_are_full_again(driver: JobDriver, clock: ManualClock) -> None:
    for key in ("quiet", "busy"):
        rated(driver, key, per_second=1, burst=2)
    clock.advance(1)
    assert len(flow_claim(driver)) == 2
    for _ in range(4):
        rated(driver, "busy", per_second=1, burst=2)
    clock.advance(1)  # quiet: 1 + 1 s of refill = 2 = full; busy: spent its refilled token again
    assert len(flow_claim(driver)) == 2
    driver.prune(3600)
    assert driver.introspect.rate_bucket("quiet") is None
    busy = driver.introspect.rate_bucket("busy")
    assert busy is not None and busy.level(clock.now()) < 1
    # A forgotten bucket starts full, as it was: the rate is what it would have been.
    rated(driver, "quiet", per_second=1, burst=2)
    rated(driver, "quiet", per_second=1, burst=2)
    rated(driver, "quiet", per_second=1, burst=2)
    assert len([c for c in flow_claim(driver) if c.job.rate_key == "quiet"]) == 2
