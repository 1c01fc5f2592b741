"""Operator tools on many jobs: the job filter, error groups, bulk retry/cancel/delete, the audit log."""

from __future__ import annotations

from typing import Any

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import BULK_STATES, BulkRequest, JobDriver, JobFilter
from ultimat3.jobs.operator import bulk, preview

from .helpers import (
    Wakeups,
    at,
    claim,
    claim_one,
    dead_letter,
    enqueue,
    get,
    retry_later,
)


def _dead(driver: JobDriver, error: str = "fatal", **fields: Any) -> str:
    """One job enqueued, claimed and dead-lettered with ``error`` (enqueued first in claim order)."""
    job_id = enqueue(driver, **{"priority": 1000, **fields}).id
    claimed = claim_one(driver)
    assert claimed.job.id == job_id
    assert driver.nack(job_id, claimed.claim_token, dead_letter(error))
    return job_id


def _ids(driver: JobDriver, flt: JobFilter) -> set[str]:
    return {job.id for job in driver.introspect.list(flt)}


# -- the filter -----------------------------------------------------------------------------------

def test_a_name_pattern_matches_with_star_and_nothing_else_is_a_wildcard(driver: JobDriver) -> None:
    a = enqueue(driver, "billing.charge").id
    b = enqueue(driver, "billing.refund").id
    enqueue(driver, "mail.send")
    odd = enqueue(driver, "billing_%x").id
    assert _ids(driver, JobFilter(name="billing.*")) == {a, b}
    assert _ids(driver, JobFilter(name="*.refund")) == {b}
    assert _ids(driver, JobFilter(name="billing_%x")) == {odd}
    # `_`, `%`, `?` and `[` are themselves, in every dialect.
    assert _ids(driver, JobFilter(name="billing_*")) == {odd}
    assert _ids(driver, JobFilter(name="billing?*")) == set()
    assert _ids(driver, JobFilter(name="BILLING.*")) == set()
    assert driver.introspect.count(JobFilter(name="billing*")) == 3


def test_the_error_filter_matches_a_code_or_any_text_of_the_last_error(driver: JobDriver) -> None:
    lost = _dead(driver, "X_PAYMENT_DOWN: provider answered 503")
    other = _dead(driver, "ValueError: bad amount\nTraceback ...")
    enqueue(driver)
    assert _ids(driver, JobFilter(error="X_PAYMENT_DOWN")) == {lost}
    assert _ids(driver, JobFilter(error="503")) == {lost}
    assert _ids(driver, JobFilter(error="Traceback")) == {other}
    assert _ids(driver, JobFilter(error="x_payment_down")) == set()  # case matters, as in the code


def test_since_and_until_bound_the_last_change_of_state(driver: JobDriver, clock: ManualClock) -> None:
    early = _dead(driver)
    clock.advance(100)
    late = _dead(driver)
    start = clock.now() - 100
    assert _ids(driver, JobFilter(since=start + 50)) == {late}
    assert _ids(driver, JobFilter(until=start + 50)) == {early}
    assert _ids(driver, JobFilter(since=start, until=start + 100)) == {early}  # until is exclusive
    assert _ids(driver, JobFilter(since=start + 100)) == {late}  # since is inclusive


def test_ids_restrict_the_filter_and_combine_with_the_rest(driver: JobDriver) -> None:
    a = enqueue(driver, queue="q1").id
    b = enqueue(driver, queue="q2").id
    enqueue(driver, queue="q1")
    assert _ids(driver, JobFilter(ids=(a, b, "no-such-id"))) == {a, b}
    assert _ids(driver, JobFilter(ids=(a, b), queue="q2")) == {b}
    assert driver.introspect.count(JobFilter(ids=(a, b), queue="q1")) == 1


def test_count_takes_states_and_an_as_of_bound(driver: JobDriver, clock: ManualClock) -> None:
    _dead(driver)
    enqueue(driver)
    clock.advance(10)
    _dead(driver)
    assert driver.introspect.count(JobFilter()) == 3
    assert driver.introspect.count(JobFilter(), ("dead",)) == 2
    assert driver.introspect.count(JobFilter(), ("dead", "ready")) == 3
    assert driver.introspect.count(JobFilter(state="ready"), ("dead",)) == 2  # states replace filter.state
    assert driver.introspect.count(JobFilter(), ("dead",), as_of=clock.now() - 5) == 1


def test_a_filter_value_no_driver_can_store_matches_nothing(driver: JobDriver) -> None:
    enqueue(driver)
    for flt in (JobFilter(queue="a\x00b"), JobFilter(error="\ud800"), JobFilter(ids=("x\x00",))):
        assert driver.introspect.list(flt) == []
        assert driver.introspect.count(flt) == 0
        assert driver.introspect.error_groups(flt) == []
        batch = driver.bulk(BulkRequest("cancel", flt, tuple(BULK_STATES["cancel"])))
        assert batch.touched == ()


# -- why jobs die ---------------------------------------------------------------------------------

def test_error_groups_count_by_first_line_with_code_first_last_seen_and_a_sample(
        driver: JobDriver, clock: ManualClock) -> None:
    first = clock.now()
    down = [_dead(driver, "ConfigError: X_PAYMENT_DOWN: provider down\nTraceback (most recent call last): a")]
    clock.advance(60)
    down.append(_dead(driver, "ConfigError: X_PAYMENT_DOWN: provider down\nTraceback (most recent call last): b"))
    bad = _dead(driver, "ValueError: bad amount")
    odd = _dead(driver, "plain words")
    enqueue(driver)  # no error: not in any group

    groups = driver.introspect.error_groups(JobFilter(state="dead"))
    assert [(g.code, g.message, g.count) for g in groups] == [
        ("X_PAYMENT_DOWN", "ConfigError: X_PAYMENT_DOWN: provider down", 2),
        ("ValueError", "ValueError: bad amount", 1),
        (None, "plain words", 1),
    ]
    assert groups[0].first_seen == at(first) and groups[0].last_seen == at(first + 60)
    assert groups[0].sample_id in down and groups[1].sample_id == bad and groups[2].sample_id == odd
    assert len(driver.introspect.error_groups(JobFilter(state="dead", limit=1))) == 1
    assert driver.introspect.error_groups(JobFilter(state="ready")) == []


def test_error_groups_see_jobs_waiting_to_retry_too(driver: JobDriver) -> None:
    job_id = enqueue(driver).id
    claimed = claim_one(driver)
    assert driver.nack(job_id, claimed.claim_token, retry_later(60, "TimeoutError: slow"))
    [group] = driver.introspect.error_groups(JobFilter(state="ready"))
    assert (group.code, group.count, group.sample_id) == ("TimeoutError", 1, job_id)


# -- one batch ------------------------------------------------------------------------------------

def test_a_bulk_retry_revives_dead_jobs_in_their_run_and_wakes_their_queues(
        driver: JobDriver, clock: ManualClock) -> None:
    job_id = enqueue(driver, queue="billing").id
    claimed = claim_one(driver)
    assert driver.steps.record(job_id, claimed.claim_token, "charge", {"ok": 1})
    assert driver.nack(job_id, claimed.claim_token, dead_letter("X_DOWN: 503"))
    before = get(driver, job_id)
    live = enqueue(driver, queue="billing").id
    clock.advance(5)
    seen = Wakeups()
    unsubscribe = driver.subscribe(seen)
    try:
        batch = driver.bulk(BulkRequest("retry", JobFilter(queue="billing"), ("dead",)))
        assert seen.wait_for("billing")
    finally:
        unsubscribe()
    assert batch.touched == (job_id,)
    after = get(driver, job_id)
    assert (after.state, after.attempt, after.run_id, after.last_error) == ("ready", 0, before.run_id, "X_DOWN: 503")
    assert after.run_at == at(clock.now()) and after.finished_at is None
    assert set(driver.steps.load(before.run_id)) == {"charge"}  # the run's steps replay
    assert get(driver, live).state == "ready"


def test_a_bulk_retry_leaves_a_job_whose_key_a_live_job_holds(driver: JobDriver, clock: ManualClock) -> None:
    held = _dead(driver, idempotency_key="k1")
    holder = enqueue(driver, idempotency_key="k1").id
    claim_one(driver)  # the holder runs
    older = _dead(driver, idempotency_key="k2")  # two dead jobs under k2 ...
    clock.advance(1)
    newer = _dead(driver, idempotency_key="k2")  # ... only the most recently changed is revived
    free = _dead(driver)
    batch = driver.bulk(BulkRequest("retry", JobFilter(), ("dead",)))
    assert set(batch.touched) == {newer, free}
    assert get(driver, held).state == "dead" and get(driver, holder).state == "running"
    assert get(driver, older).state == "dead" and get(driver, newer).state == "ready"


def test_a_bulk_cancel_stops_running_attempts_and_closes_their_ledger_rows(driver: JobDriver) -> None:
    done = enqueue(driver, queue="q").id
    assert driver.ack(done, claim_one(driver).claim_token)
    running_id = enqueue(driver, queue="q").id
    claimed = claim_one(driver)
    driver.backfills.start(claimed.job.run_id, "bf", "sum", running_id)
    waiting = enqueue(driver, queue="q").id
    elsewhere = enqueue(driver, queue="other").id

    batch = driver.bulk(BulkRequest("cancel", JobFilter(queue="q"), tuple(BULK_STATES["cancel"]),
                                    reason="X_BAD_DEPLOY: wrong jobs"))
    assert set(batch.touched) == {waiting, running_id}
    for job_id in (waiting, running_id):
        record = get(driver, job_id)
        assert (record.state, record.last_error) == ("cancelled", "X_BAD_DEPLOY: wrong jobs")
    assert driver.heartbeat(running_id, claimed.claim_token, 30) is False  # the running attempt learns
    assert driver.ack(running_id, claimed.claim_token) is False
    ledger = driver.backfills.get(claimed.job.run_id)
    assert ledger is not None and (ledger.status, ledger.error) == ("cancelled", "X_BAD_DEPLOY: wrong jobs")
    assert get(driver, done).state == "done" and get(driver, elsewhere).state == "ready"


def test_a_bulk_cancel_never_touches_a_finished_job_even_when_asked_to(driver: JobDriver) -> None:
    dead = _dead(driver)
    batch = driver.bulk(BulkRequest("cancel", JobFilter(), ("dead", "done", "ready")))
    assert batch.touched == ()
    assert get(driver, dead).state == "dead"
    batch = driver.bulk(BulkRequest("retry", JobFilter(), ("ready", "dead")))
    assert batch.touched == (dead,)


def test_a_bulk_delete_removes_jobs_and_their_steps_but_never_a_running_one(driver: JobDriver) -> None:
    job_id = enqueue(driver, queue="q").id
    claimed = claim_one(driver)
    assert driver.steps.record(job_id, claimed.claim_token, "s", 1)
    driver.backfills.start(claimed.job.run_id, "bf", "sum", job_id)
    assert driver.nack(job_id, claimed.claim_token, dead_letter())
    running = enqueue(driver, queue="q").id
    running_claim = claim_one(driver)
    assert running_claim.job.id == running
    waiting = enqueue(driver, queue="q", idempotency_key="again").id

    batch = driver.bulk(BulkRequest("delete", JobFilter(queue="q"), ("dead", "ready", "running")))
    assert set(batch.touched) == {job_id, waiting}
    assert driver.introspect.get(job_id) is None and driver.introspect.get(waiting) is None
    assert driver.steps.load(claimed.job.run_id) == {}
    ledger = driver.backfills.get(claimed.job.run_id)
    assert ledger is not None and ledger.status == "cancelled"
    assert get(driver, running).state == "running"
    # The deleted waiting job's key is free again.
    assert enqueue(driver, queue="q", idempotency_key="again").deduped is False


def test_batches_walk_a_cursor_and_as_of_leaves_newer_changes(driver: JobDriver, clock: ManualClock) -> None:
    ids = sorted(_dead(driver) for _ in range(5))
    start = clock.now()
    clock.advance(10)
    batch = driver.bulk(BulkRequest("retry", JobFilter(), ("dead",), limit=2))
    assert batch.touched == tuple(ids[:2]) and batch.last_id == ids[1]
    batch = driver.bulk(BulkRequest("retry", JobFilter(), ("dead",), limit=2, after=ids[1]))
    assert batch.touched == tuple(ids[2:4])
    # The revived ones changed after this cutoff, the last dead one before it.
    batch = driver.bulk(BulkRequest("cancel", JobFilter(), ("ready",), limit=10, as_of=start + 5))
    assert batch.touched == ()
    batch = driver.bulk(BulkRequest("retry", JobFilter(), ("dead",), limit=10, after=ids[3], as_of=start + 5))
    assert batch.touched == (ids[4],)
    empty = driver.bulk(BulkRequest("retry", JobFilter(), ("dead",), limit=10, after=ids[4]))
    assert empty == type(empty)(touched=(), last_id=None)


# -- the whole action -----------------------------------------------------------------------------

def test_bulk_works_in_batches_records_the_audit_and_a_second_run_finds_nothing(
        driver: JobDriver, clock: ManualClock) -> None:
    dead = {_dead(driver, "X_DOWN: 503", queue="billing") for _ in range(7)}
    other = _dead(driver, "X_DOWN: 503", queue="mail")
    clock.advance(1)
    seen: list[tuple[int, int]] = []
    outcome = bulk(driver, "retry", JobFilter(queue="billing", error="X_DOWN"), actor="ops:ann", batch_size=3,
                   on_batch=lambda touched, total: seen.append((touched, total)))
    assert (outcome.matched, outcome.touched, outcome.left, outcome.status) == (7, 7, 0, "completed")
    assert outcome.batches >= 3 and seen[-1] == (7, 7)
    assert {job.id for job in driver.introspect.list(JobFilter(state="ready"))} == dead
    assert get(driver, other).state == "dead"
    [entry] = driver.audit.list()
    assert (entry.id, entry.actor, entry.action, entry.touched, entry.status) == (
        outcome.audit_id, "ops:ann", "retry", 7, "completed")
    assert entry.target == {"queue": "billing", "error": "X_DOWN"} and entry.finished_at is not None
    again = bulk(driver, "retry", JobFilter(queue="billing", error="X_DOWN"), actor="ops:ann", batch_size=3)
    assert (again.matched, again.touched) == (0, 0)


def test_an_interrupted_bulk_action_says_what_it_did_and_a_rerun_finishes(driver: JobDriver) -> None:
    for _ in range(6):
        enqueue(driver, queue="wrong")

    def stop_after_first(touched: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bulk(driver, "cancel", JobFilter(queue="wrong"), actor="ops", batch_size=4, on_batch=stop_after_first)
    [entry] = driver.audit.list()
    assert (entry.status, entry.touched) == ("interrupted", 4)
    assert driver.introspect.count(JobFilter(queue="wrong", state="cancelled")) == 4
    outcome = bulk(driver, "cancel", JobFilter(queue="wrong"), actor="ops", batch_size=4)
    assert (outcome.matched, outcome.touched) == (2, 2)
    assert driver.introspect.count(JobFilter(queue="wrong", state="cancelled")) == 6


def test_bulk_by_ids_acts_on_exactly_those(driver: JobDriver) -> None:
    ids = [enqueue(driver).id for _ in range(5)]
    outcome = bulk(driver, "cancel", JobFilter(ids=(ids[0], ids[3], "missing")), actor="ops", batch_size=1)
    assert outcome.touched == 2
    assert {job.id for job in driver.introspect.list(JobFilter(state="cancelled"))} == {ids[0], ids[3]}


def test_a_retry_that_dies_again_during_the_action_is_not_retried_twice(driver: JobDriver, clock: ManualClock) -> None:
    first = _dead(driver)
    second = _dead(driver)
    clock.advance(1)

    def kill_the_revived(touched: int, total: int) -> None:
        clock.advance(1)
        for claimed in claim(driver, limit=5):
            assert driver.nack(claimed.job.id, claimed.claim_token, dead_letter("again"))

    outcome = bulk(driver, "retry", JobFilter(state="dead"), actor="ops", batch_size=1, on_batch=kill_the_revived)
    assert outcome.touched == 2
    assert get(driver, first).state == get(driver, second).state == "dead"


def test_preview_counts_and_samples_and_changes_nothing(driver: JobDriver) -> None:
    ids = {_dead(driver, queue="billing") for _ in range(3)}
    enqueue(driver, queue="billing")
    shown = preview(driver, "retry", JobFilter(queue="billing"), sample=2)
    assert (shown.count, shown.states, shown.filter) == (3, ("dead",), {"queue": "billing"})
    assert len(shown.sample) == 2 and {job.id for job in shown.sample} <= ids
    assert driver.introspect.count(JobFilter(queue="billing", state="dead")) == 3
    assert driver.audit.list() == []


@pytest.mark.parametrize(("action", "flt", "code"), [
    ("retry", JobFilter(), "X_BULK_NO_FILTER"),
    ("delete", JobFilter(limit=5), "X_BULK_NO_FILTER"),
    ("retry", JobFilter(state="ready"), "X_BULK_STATE"),
    ("cancel", JobFilter(state="done"), "X_BULK_STATE"),
    ("delete", JobFilter(state="running"), "X_BULK_STATE"),
    ("cancel", JobFilter(queue=""), "X_FILTER_VALUE"),
    ("cancel", JobFilter(name="a\x00"), "X_FILTER_VALUE"),
])
def test_a_bulk_action_refuses_an_unbounded_or_impossible_filter_before_writing(
        driver: JobDriver, action: str, flt: JobFilter, code: str) -> None:
    enqueue(driver)
    _dead(driver)
    with pytest.raises(XError) as raised:
        bulk(driver, action, flt, actor="ops")  # type: ignore[arg-type]
    assert raised.value.code == code
    assert driver.audit.list() == []
    assert driver.introspect.count(JobFilter(state="ready")) == 1
    assert bulk(driver, "cancel", JobFilter(), actor="ops", everything=True).touched == 1


# -- the audit log --------------------------------------------------------------------------------

def test_the_audit_log_keeps_every_entry_newest_first(driver: JobDriver, clock: ManualClock) -> None:
    first = driver.audit.open("ops:ann", "retry", {"queue": "billing", "ids": 3})
    clock.advance(1)
    second = driver.audit.open("ops:bob", "delete", {"name": "x.*"})
    assert (first.status, first.touched, first.finished_at) == ("running", 0, None)
    assert first.at == at(clock.now() - 1)
    driver.audit.close(first.id, "completed", 3)
    driver.audit.close(first.id, "failed")  # a closed entry stays as it is
    assert [e.id for e in driver.audit.list()] == [second.id, first.id]
    assert [e.id for e in driver.audit.list(action="retry")] == [first.id]
    assert [e.id for e in driver.audit.list(limit=1)] == [second.id]
    closed = driver.audit.list(action="retry")[0]
    assert (closed.status, closed.touched, closed.finished_at) == ("completed", 3, at(clock.now()))
    assert closed.target == {"queue": "billing", "ids": 3}
