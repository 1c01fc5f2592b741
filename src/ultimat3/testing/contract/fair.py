"""Fair claims (``ClaimRequest.fair``): tenants served in turn, a small tenant never stuck behind a
big one's backlog, and everything else a claim promises still held."""

from __future__ import annotations

from typing import Any

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import ClaimedJob, JobDriver

from .helpers import claim, enqueue, get


def queue_for(driver: JobDriver, tenant: str | None, count: int, **fields: Any) -> list[str]:
    """``count`` jobs of ``tenant``, a millisecond apart (so claim order is enqueue order)."""
    ids = []
    for _ in range(count):
        ids.append(enqueue(driver, "fair.task", tenant_id=tenant, **fields).id)
        clock = driver.clock
        assert isinstance(clock, ManualClock)
        clock.advance(0.001)
    return ids


def fair(driver: JobDriver, limit: int, **fields: Any) -> list[ClaimedJob]:
    """A fair claim (an hour's visibility unless given)."""
    fields.setdefault("visibility_timeout", 3600.0)
    return claim(driver, "w1", limit=limit, fair=True, **fields)


def tenants(claimed: list[ClaimedJob]) -> list[str | None]:
    """The claimed jobs' tenants, sorted (no tenant first)."""
    return sorted((c.job.tenant_id for c in claimed), key=lambda t: t or "")


def test_a_small_tenant_starts_in_the_first_claim_behind_a_big_backlog(driver: JobDriver, clock: ManualClock) -> None:
    queue_for(driver, "big", 200)
    small = queue_for(driver, "small", 10)
    clock.advance(1)
    assert [c.job.tenant_id for c in claim(driver, "w0", limit=10)] == ["big"] * 10  # claim order alone
    first = fair(driver, 10)
    assert tenants(first) == ["big"] * 5 + ["small"] * 5
    second = fair(driver, 10)
    assert {c.job.id for c in first + second} >= set(small)
    assert all(get(driver, job_id).state == "running" for job_id in small)


def test_tenants_take_turns_from_where_the_last_claim_stopped(driver: JobDriver, clock: ManualClock) -> None:
    for tenant in ("a", "b", "c"):
        queue_for(driver, tenant, 4)
    queue_for(driver, None, 4)
    clock.advance(1)
    turns = [tenants(fair(driver, 2)) for _ in range(4)]
    # No tenant (tenant='none') takes its turn first, as the tenant ''; then a, b, c, and around.
    assert turns == [[None, "a"], ["b", "c"], [None, "a"], ["b", "c"]]


def test_within_a_tenant_claim_order_holds_and_turns_go_by_priority(driver: JobDriver, clock: ManualClock) -> None:
    low = queue_for(driver, "a", 2)
    high = enqueue(driver, "fair.task", tenant_id="a", priority=5).id
    b_first = queue_for(driver, "b", 1, priority=9)[0]
    clock.advance(1)
    claimed = fair(driver, 4)
    assert {c.job.id for c in claimed} == {high, low[0], b_first, low[1]}
    assert fair(driver, 4) == []


def test_fair_claims_keep_queues_names_pauses_due_times_and_lapses(driver: JobDriver, clock: ManualClock) -> None:
    mine = queue_for(driver, "a", 1)[0]
    elsewhere = enqueue(driver, "fair.task", tenant_id="b", queue="other").id
    other_name = enqueue(driver, "fair.other", tenant_id="c").id
    later = enqueue(driver, "fair.task", tenant_id="d", run_at=clock.now() + 60).id
    clock.advance(1)
    assert [c.job.id for c in fair(driver, 10, queues=("default",), names=("fair.task",))] == [mine]
    driver.queues.pause("other", "ops")
    assert [c.job.id for c in fair(driver, 10, visibility_timeout=5)] == [other_name]
    driver.queues.resume("other", "ops")
    assert [c.job.id for c in fair(driver, 10, visibility_timeout=5)] == [elsewhere]
    clock.advance(60)
    # The two claimed with a 5 s visibility lapsed: taken over, beside the job that came due.
    assert {c.job.id for c in fair(driver, 10)} == {other_name, elsewhere, later}


def test_fair_and_flow_claims_compose(driver: JobDriver, clock: ManualClock) -> None:
    governed = [enqueue(driver, "fair.task", tenant_id="a", flow_key="k", flow_max=1).id for _ in range(2)]
    queue_for(driver, "a", 3)
    queue_for(driver, "b", 3)
    clock.advance(1)
    claimed = fair(driver, 5, flow=True)
    assert sum(1 for c in claimed if c.job.id in governed) == 1
    assert tenants([c for c in claimed if c.job.id not in governed]) == ["a", "a", "b", "b"]


def test_a_weighted_tenant_gets_that_many_jobs_a_turn(driver: JobDriver, clock: ManualClock) -> None:
    queue_for(driver, "gold", 12)
    queue_for(driver, "tin", 12)
    clock.advance(1)
    claimed = fair(driver, 8, weights={"gold": 3})
    assert tenants(claimed) == ["gold"] * 6 + ["tin"] * 2


@pytest.mark.parametrize("weights", [{"a": 0}, {"a": -1}, {"a": 1.5}, {"a": True}, {"a\x00": 2}, {"a": 10**6}])
def test_unusable_weights_are_refused_coded(driver: JobDriver, clock: ManualClock, weights: dict[str, Any]) -> None:
    queue_for(driver, "a", 1)
    clock.advance(1)
    with pytest.raises(XError) as raised:
        fair(driver, 5, weights=weights)
    assert raised.value.code == "X_FAIR_WEIGHT"
    assert fair(driver, 5) != []  # nothing was claimed by the refused call
