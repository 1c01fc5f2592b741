"""The read side: list (newest first, filtered, limited), get, stats."""

from __future__ import annotations

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import ConfigError
from ultimat3.drivers.protocol import DEFAULT_LIST_LIMIT, JOB_STATES, JobDriver, JobFilter

from .helpers import claim_one, dead_letter, enqueue, get, suspend


def test_list_is_newest_first_with_a_default_limit_of_100(driver: JobDriver, clock: ManualClock) -> None:
    ids = []
    for i in range(105):
        ids.append(enqueue(driver, payload={"i": i}).id)
        clock.advance(1)
    rows = driver.introspect.list()
    assert DEFAULT_LIST_LIMIT == 100
    assert len(rows) == 100
    assert [row.id for row in rows] == list(reversed(ids))[:100]
    assert rows[0].payload == {"i": 104}
    assert rows[-1].payload == {"i": 5}


def test_list_honours_an_explicit_limit(driver: JobDriver, clock: ManualClock) -> None:
    ids = []
    for _ in range(5):
        ids.append(enqueue(driver).id)
        clock.advance(1)
    assert [row.id for row in driver.introspect.list(JobFilter(limit=2))] == [ids[4], ids[3]]
    assert len(driver.introspect.list(JobFilter(limit=500))) == 5


def test_list_breaks_created_at_ties_by_id_descending(driver: JobDriver) -> None:
    ids = [enqueue(driver).id for _ in range(6)]
    assert [row.id for row in driver.introspect.list()] == sorted(ids, reverse=True)


def test_list_filters(driver: JobDriver, clock: ManualClock) -> None:
    a1 = enqueue(driver, "a", queue="q1", tenant_id="org_1").id
    clock.advance(1)
    a2 = enqueue(driver, "a", queue="q2", tenant_id="org_2").id
    clock.advance(1)
    b1 = enqueue(driver, "b", queue="q1", tenant_id="org_1").id
    clock.advance(1)
    b2 = enqueue(driver, "b", queue="q2").id
    cancelled = driver.cancel(b1)
    assert cancelled is not None

    def ids(**filters: object) -> list[str]:
        return [row.id for row in driver.introspect.list(JobFilter(**filters))]  # type: ignore[arg-type]

    assert ids(queue="q1") == [b1, a1]
    assert ids(name="a") == [a2, a1]
    assert ids(state="cancelled") == [b1]
    assert ids(state="ready") == [b2, a2, a1]
    assert ids(tenant_id="org_1") == [b1, a1]
    assert ids(queue="q2", name="b") == [b2]
    assert ids(queue="q1", state="ready", tenant_id="org_1") == [a1]
    assert ids(queue="nowhere") == []
    assert ids(state="dead") == []


def test_get_returns_the_row_list_returns(driver: JobDriver) -> None:
    result = enqueue(driver, "a", {"x": [1]})
    assert driver.introspect.list() == [get(driver, result.id)]


def test_get_of_an_unknown_id_is_none(driver: JobDriver) -> None:
    enqueue(driver)
    assert driver.introspect.get("00000000-0000-4000-8000-000000000000") is None


def test_stats_of_an_empty_store_is_empty(driver: JobDriver) -> None:
    assert driver.introspect.stats() == []


def test_stats_counts_every_state_per_queue(driver: JobDriver, clock: ManualClock) -> None:
    # queue "b": one job in each of the seven states.
    enqueue(driver, "ready", queue="b")
    enqueue(driver, "delayed", queue="b", run_at=clock.now() + 3600)
    driver.cancel(enqueue(driver, "cancelled", queue="b").id)
    for name in ("running", "suspended", "done", "dead"):
        enqueue(driver, name, queue="b")
    for name in ("running", "suspended", "done", "dead"):
        claimed = claim_one(driver, names=(name,))
        if name == "suspended":
            assert driver.nack(claimed.job.id, claimed.claim_token, suspend(3600))
        elif name == "done":
            assert driver.ack(claimed.job.id, claimed.claim_token)
        elif name == "dead":
            assert driver.nack(claimed.job.id, claimed.claim_token, dead_letter())
    # queue "a": two ready jobs only, so the other six states must be reported as 0.
    enqueue(driver, "x", queue="a")
    enqueue(driver, "y", queue="a")

    stats = driver.introspect.stats()
    assert [s.queue for s in stats] == ["a", "b"]
    assert stats[0].counts == {state: (2 if state == "ready" else 0) for state in JOB_STATES}
    assert stats[1].counts == dict.fromkeys(JOB_STATES, 1)


def test_waiting_names_counts_waiting_jobs_per_queue_and_name(driver: JobDriver, clock: ManualClock) -> None:
    from .helpers import claim_one, enqueue

    enqueue(driver, "a", queue="q1")
    enqueue(driver, "a", queue="q1")
    enqueue(driver, "b", queue="q1", run_at=clock.now() + 60)
    enqueue(driver, "a", queue="q2")
    running = enqueue(driver, "c", queue="q3")
    claimed = claim_one(driver, queues=("q3",))
    assert claimed.job.id == running.id
    names = driver.introspect.waiting_names()
    assert [(n.queue, n.name, n.count) for n in names] == [("q1", "a", 2), ("q1", "b", 1), ("q2", "a", 1)]


def test_waiting_names_of_an_empty_store_is_empty(driver: JobDriver) -> None:
    assert driver.introspect.waiting_names() == []


def test_list_pages_by_keyset_through_every_job_once(driver: JobDriver, clock: ManualClock) -> None:
    ids = []
    for i in range(7):
        ids.append(enqueue(driver, queue="paged").id)
        if i % 3 == 0:
            clock.advance(1)  # some created_at ties, broken by id
    expected = [row.id for row in driver.introspect.list(JobFilter(queue="paged"))]
    seen: list[str] = []
    before = None
    while True:
        page = driver.introspect.list(JobFilter(queue="paged", limit=3, before=before))
        if not page:
            break
        seen.extend(row.id for row in page)
        before = page[-1].id
    assert seen == expected and sorted(seen) == sorted(ids)
    # A page after a job that no longer exists (or never did) is empty, not the first page again.
    assert driver.introspect.list(JobFilter(before="no-such-job")) == []
    assert driver.introspect.list(JobFilter(before="bad\x00id")) == []


def test_completions_count_done_jobs_per_queue_and_bucket(driver: JobDriver, clock: ManualClock) -> None:
    start = clock.now()
    base = start - start % 60  # the buckets are aligned to multiples of the bucket

    def finish(queue: str, *, ok: bool = True) -> None:
        enqueue(driver, queue=queue)
        claimed = claim_one(driver, "w1")
        if ok:
            assert driver.ack(claimed.job.id, claimed.claim_token)
        else:
            assert driver.nack(claimed.job.id, claimed.claim_token, dead_letter())

    finish("a")
    finish("a")
    finish("b", ok=False)  # dead: not a completion
    clock.advance(60)
    finish("a")
    finish("b")
    done = [(c.queue, c.at.timestamp(), c.done) for c in driver.introspect.completions(base)]
    assert done == [("a", base, 2), ("a", base + 60, 1), ("b", base + 60, 1)]
    assert [c.done for c in driver.introspect.completions(base + 60)] == [1, 1]
    assert driver.introspect.completions(clock.now() + 1) == []
    for bad in (0, -60, float("nan"), float("inf")):
        with pytest.raises(ConfigError) as refused:
            driver.introspect.completions(base, bad)
        assert refused.value.code == "X_BUCKET"
