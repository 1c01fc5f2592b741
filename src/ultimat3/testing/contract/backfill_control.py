"""Steering a backfill pass through its ledger: pause requests, pause and resume (which wakes the
pass's suspended job), the throttle reason, retry passes, and quarantined rows."""

from __future__ import annotations

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import MAX_REASON_LENGTH, JobDriver, RowFailure

from .helpers import at, claim, enqueue, get, suspend
from .transactions import Transaction, transaction

__all__ = [
    "test_a_cancel_closes_a_paused_pass",
    "test_a_pause_request_is_answered_by_progress",
    "test_a_pause_request_survives_a_reopening_and_resume_withdraws_it",
    "test_a_replayed_quarantine_counts_nothing_twice",
    "test_a_retry_pass_never_decides_the_gate",
    "test_bad_quarantine_input_is_refused_whole",
    "test_failures_page_by_key_and_a_later_pass_takes_a_row_over",
    "test_nothing_to_pause_or_resume_is_none",
    "test_pause_then_resume_wakes_the_suspended_job",
    "test_quarantine_joins_the_callers_transaction",
    "test_the_throttle_reason_is_kept_until_cleared",
    "transaction",
]


def test_a_pause_request_is_answered_by_progress(driver: JobDriver) -> None:
    driver.backfills.start("r1", "fill", "c", None)
    assert driver.backfills.progress("r1", 1, 100) is False
    asked = driver.backfills.request_pause("fill", "ops@example.com")
    assert asked is not None and (asked.run_id, asked.status, asked.paused_by) == ("r1", "running", "ops@example.com")
    assert driver.backfills.progress("r1", 2, 200) is True
    assert driver.backfills.pause("r1") is True
    run = driver.backfills.get("r1")
    assert run is not None
    assert (run.status, run.paused_by, run.batches, run.rows) == ("paused", "ops@example.com", 2, 200)
    # A paused pass is not asked again, and pausing twice changes nothing.
    assert driver.backfills.progress("r1", 2, 200) is False
    assert driver.backfills.pause("r1") is False
    # Without a request the pass never pauses itself.
    driver.backfills.start("r2", "other", "c", None)
    assert driver.backfills.pause("r2") is False


def test_the_throttle_reason_is_kept_until_cleared(driver: JobDriver) -> None:
    driver.backfills.start("r1", "fill", "c", None)
    driver.backfills.progress("r1", 3, 30, throttle="oldest transaction open 75 s (limit 60 s)")
    run = driver.backfills.get("r1")
    assert run is not None and run.throttle == "oldest transaction open 75 s (limit 60 s)"
    driver.backfills.progress("r1", 4, 40)
    run = driver.backfills.get("r1")
    assert run is not None and run.throttle is None
    driver.backfills.progress("r1", 4, 40, throttle="x" * (MAX_REASON_LENGTH + 50))
    run = driver.backfills.get("r1")
    assert run is not None and run.throttle == "x" * MAX_REASON_LENGTH
    driver.backfills.finish("r1", "completed")
    run = driver.backfills.get("r1")
    assert run is not None and (run.status, run.throttle) == ("completed", None)


def test_pause_then_resume_wakes_the_suspended_job(driver: JobDriver, clock: ManualClock) -> None:
    job = enqueue(driver, "fill")
    [claimed] = claim(driver)
    driver.backfills.start(job.run_id, "fill", "c", job.id)
    driver.backfills.request_pause("fill", "alice")
    assert driver.backfills.pause(job.run_id)
    # The pass suspends its job until resumed (a long delay, no attempt burnt).
    assert driver.nack(job.id, claimed.claim_token, suspend(10 * 365 * 86400))
    assert get(driver, job.id).state == "suspended"
    clock.advance(60)
    assert claim(driver) == []

    resumed = driver.backfills.resume("fill", "bob")
    assert resumed is not None and (resumed.run_id, resumed.status, resumed.paused_by) == (job.run_id, "running", None)
    woken = get(driver, job.id)
    assert (woken.state, woken.run_at) == ("suspended", at(clock.now()))
    [again] = claim(driver)
    assert again.job.id == job.id and again.job.run_id == job.run_id
    # The same ledger row goes on: progress kept, not a new run.
    assert [run.run_id for run in driver.backfills.list("fill")] == [job.run_id]


def test_a_pause_request_survives_a_reopening_and_resume_withdraws_it(driver: JobDriver) -> None:
    driver.backfills.start("r1", "fill", "c", None)
    driver.backfills.request_pause("fill", "alice")
    driver.backfills.finish("r1", "failed", "worker died")
    # finish clears the request with the pass; a fresh request on the retried pass stands.
    reopened = driver.backfills.start("r1", "fill", "c", None)
    assert reopened.paused_by is None
    driver.backfills.request_pause("fill", "alice")
    assert driver.backfills.start("r1", "fill", "c", None).paused_by == "alice"
    # Resuming a pass that is only asked to pause withdraws the request.
    resumed = driver.backfills.resume("fill", "bob")
    assert resumed is not None and (resumed.status, resumed.paused_by) == ("running", None)
    assert driver.backfills.progress("r1", 1, 1) is False


def test_nothing_to_pause_or_resume_is_none(driver: JobDriver) -> None:
    assert driver.backfills.request_pause("fill", "alice") is None
    assert driver.backfills.resume("fill", "alice") is None
    driver.backfills.start("r1", "fill", "c", None)
    assert driver.backfills.resume("fill", "alice") is None  # running, never asked to pause
    driver.backfills.finish("r1", "completed")
    assert driver.backfills.request_pause("fill", "alice") is None
    with pytest.raises(XError) as caught:
        driver.backfills.request_pause("fill", "bad\x00actor")
    assert caught.value.code == "X_BACKFILL_LEDGER"


def test_a_cancel_closes_a_paused_pass(driver: JobDriver, clock: ManualClock) -> None:
    job = enqueue(driver, "fill")
    [claimed] = claim(driver)
    driver.backfills.start(job.run_id, "fill", "c", job.id)
    driver.backfills.request_pause("fill", "alice")
    driver.backfills.pause(job.run_id)
    driver.nack(job.id, claimed.claim_token, suspend(86400))
    clock.advance(1)
    driver.cancel(job.id, "not needed any more")
    run = driver.backfills.get(job.run_id)
    assert run is not None and (run.status, run.error, run.finished_at) == (
        "cancelled", "not needed any more", at(clock.now()))
    assert driver.backfills.resume("fill", "bob") is None


def test_a_retry_pass_never_decides_the_gate(driver: JobDriver, clock: ManualClock) -> None:
    driver.backfills.start("r1", "fill", "old", None)
    driver.backfills.finish("r1", "completed")
    clock.advance(1)
    retry = driver.backfills.start("r2", "fill", "new", None, kind="retry")
    assert retry.kind == "retry"
    driver.backfills.finish("r2", "completed")
    last = driver.backfills.last_completed("fill")
    assert last is not None and (last.run_id, last.kind) == ("r1", "pass")
    with pytest.raises(XError) as caught:
        driver.backfills.start("r3", "fill", "c", None, kind="sweep")  # type: ignore[arg-type]
    assert caught.value.code == "X_BACKFILL_LEDGER"


def _keys(failures: list[RowFailure]) -> list[str]:
    return [failure.key for failure in failures]


def test_failures_page_by_key_and_a_later_pass_takes_a_row_over(driver: JobDriver, clock: ManualClock) -> None:
    driver.backfills.start("r1", "fill", "c", None)
    driver.backfills.quarantine("r1", "fill", 0, [('{"cursor": 3}', "bad email"), ('{"cursor": 1}', "no owner")], [])
    driver.backfills.quarantine("r1", "fill", 2, [('{"cursor": 7}', "x" * (MAX_REASON_LENGTH + 1))], [])
    assert driver.backfills.outstanding("fill") == 3
    assert driver.backfills.outstanding("other") == 0
    assert _keys(driver.backfills.failures("fill")) == ['{"cursor": 1}', '{"cursor": 3}', '{"cursor": 7}']
    first = driver.backfills.failures("fill", limit=2)
    assert first[0] == RowFailure("fill", '{"cursor": 1}', "no owner", "r1", 0, at(clock.now()))
    assert _keys(driver.backfills.failures("fill", after=first[-1].key)) == ['{"cursor": 7}']
    assert driver.backfills.failures("fill")[2].reason == "x" * MAX_REASON_LENGTH
    run = driver.backfills.get("r1")
    assert run is not None and run.failures == 3
    driver.backfills.finish("r1", "completed")

    # A retry pass: one row fails again (taken over), one is handled (forgotten), one untouched.
    clock.advance(10)
    driver.backfills.start("r2", "fill", "c", None, kind="retry")
    driver.backfills.quarantine("r2", "fill", 0, [('{"cursor": 3}', "still bad")], ['{"cursor": 1}'])
    assert [(f.key, f.reason, f.run_id) for f in driver.backfills.failures("fill")] == [
        ('{"cursor": 3}', "still bad", "r2"), ('{"cursor": 7}', "x" * MAX_REASON_LENGTH, "r1")]
    retry, first_pass = driver.backfills.get("r2"), driver.backfills.get("r1")
    assert retry is not None and retry.failures == 1
    assert first_pass is not None and first_pass.failures == 3  # history is not rewritten


def test_a_replayed_quarantine_counts_nothing_twice(driver: JobDriver) -> None:
    driver.backfills.start("r1", "fill", "c", None)
    for _ in range(3):
        driver.backfills.quarantine("r1", "fill", 4, [('{"cursor": 9}', "bad"), ('{"cursor": 9}', "worse")], [])
    run = driver.backfills.get("r1")
    assert run is not None and run.failures == 1
    assert [(f.key, f.reason) for f in driver.backfills.failures("fill")] == [('{"cursor": 9}', "worse")]
    # A key handled and failed in one call stays failed; handling an unknown key is nothing.
    driver.backfills.quarantine("r1", "fill", 5, [('{"cursor": 2}', "bad")], ['{"cursor": 2}', '{"cursor": 99}'])
    assert driver.backfills.outstanding("fill") == 2


def test_bad_quarantine_input_is_refused_whole(driver: JobDriver) -> None:
    driver.backfills.start("r1", "fill", "c", None)
    with pytest.raises(XError) as caught:
        driver.backfills.quarantine("r1", "fill", 0, [('{"cursor": 1}', "ok"), ("bad\x00key", "nul")], [])
    assert caught.value.code == "X_BACKFILL_FAIL" and caught.value.hint
    assert driver.backfills.outstanding("fill") == 0
    # A reason that no column can hold is escaped, not refused.
    driver.backfills.quarantine("r1", "fill", 0, [('{"cursor": 1}', "nul \x00 in it")], [])
    assert driver.backfills.failures("fill")[0].reason == "nul \\x00 in it"


def test_quarantine_joins_the_callers_transaction(driver: JobDriver, transaction: Transaction | None) -> None:
    driver.backfills.start("r1", "fill", "c", None)
    if transaction is None:
        with pytest.raises(XError) as caught:
            driver.backfills.quarantine("r1", "fill", 0, [('{"cursor": 1}', "bad")], [], connection=object())
        assert caught.value.code.startswith("X_") and caught.value.hint
        return
    with transaction() as conn:
        driver.backfills.quarantine("r1", "fill", 0, [('{"cursor": 1}', "bad")], [], connection=conn)
        conn.rollback()
    assert driver.backfills.outstanding("fill") == 0
    with transaction() as conn:
        driver.backfills.quarantine("r1", "fill", 0, [('{"cursor": 1}', "bad")], [], connection=conn)
        assert driver.backfills.outstanding("fill") == 0, "not visible to others before the commit"
        conn.commit()
    assert driver.backfills.outstanding("fill") == 1
    run = driver.backfills.get("r1")
    assert run is not None and run.failures == 1
