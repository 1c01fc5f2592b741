"""Per-attempt history (``introspect.attempts``): every way an attempt ends is recorded once, with
its worker, start, end, outcome and error, whichever path ended it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import (
    WORKER_LOST,
    AttemptRecord,
    BulkRequest,
    JobDriver,
    JobFilter,
    NackRequest,
    WorkerInfo,
)

from .helpers import at, claim, claim_one, dead_letter, enqueue, enqueue_and_claim, retry_later, suspend


def _shape(history: list[AttemptRecord]) -> list[tuple[int, str, str | None]]:
    return [(a.attempt, a.outcome, a.worker_id) for a in history]


@pytest.fixture
def workers_to_drop(driver: JobDriver) -> Iterator[list[str]]:
    """Worker ids a test registers; unregistered afterwards."""
    ids: list[str] = []
    yield ids
    for worker_id in ids:
        driver.workers.unregister(worker_id)


def test_a_job_never_claimed_has_no_attempts(driver: JobDriver) -> None:
    job = enqueue(driver)
    assert driver.introspect.attempts(job.id) == []
    assert driver.introspect.attempts("no-such-job") == []
    assert driver.introspect.attempts("bad\x00id") == []


def test_a_running_attempt_shows_its_worker_and_start(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver, worker="w1")
    assert claimed.job.started_at == at(clock.now())
    [running] = driver.introspect.attempts(claimed.job.id)
    assert running == AttemptRecord(job_id=claimed.job.id, attempt=1, outcome="running", worker_id="w1",
                                    started_at=at(clock.now()), ended_at=None, error=None)


def test_failures_then_success_are_every_attempt_in_order(driver: JobDriver, clock: ManualClock) -> None:
    first = enqueue_and_claim(driver, worker="w1")
    started = clock.now()
    clock.advance(2)
    assert driver.nack(first.job.id, first.claim_token, retry_later(error="boom 1"))
    clock.advance(1)
    second = claim_one(driver, "w2")
    clock.advance(3)
    assert driver.ack(second.job.id, second.claim_token, {"ok": True})

    history = driver.introspect.attempts(first.job.id)
    assert history == [
        AttemptRecord(job_id=first.job.id, attempt=1, outcome="failed", worker_id="w1",
                      started_at=at(started), ended_at=at(started + 2), error="boom 1"),
        AttemptRecord(job_id=first.job.id, attempt=2, outcome="done", worker_id="w2",
                      started_at=at(started + 3), ended_at=at(started + 6), error=None),
    ]


def test_dead_letter_and_suspension_and_release_are_recorded(driver: JobDriver, clock: ManualClock) -> None:
    slept = enqueue_and_claim(driver, worker="w1")
    clock.advance(1)
    assert driver.nack(slept.job.id, slept.claim_token, suspend(delay=0))
    again = claim_one(driver, "w1")
    assert driver.nack(again.job.id, again.claim_token, dead_letter("fatal: no"))
    assert _shape(driver.introspect.attempts(slept.job.id)) == [(1, "suspended", "w1"), (1, "dead", "w1")]
    assert driver.introspect.attempts(slept.job.id)[-1].error == "fatal: no"
    assert driver.introspect.attempts(slept.job.id)[0].error is None

    released = enqueue_and_claim(driver, worker="w3")
    assert driver.nack(released.job.id, released.claim_token, NackRequest(release=True))
    [attempt] = driver.introspect.attempts(released.job.id)
    assert (attempt.attempt, attempt.outcome, attempt.worker_id, attempt.error) == (1, "released", "w3", None)


def test_cancel_of_a_running_job_records_its_attempt(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver, worker="w1")
    clock.advance(4)
    driver.cancel(claimed.job.id, "X_JOB_CANCELLED: by ops")
    [attempt] = driver.introspect.attempts(claimed.job.id)
    assert (attempt.outcome, attempt.worker_id, attempt.error) == ("cancelled", "w1", "X_JOB_CANCELLED: by ops")
    assert attempt.ended_at == at(clock.now())

    waiting = enqueue(driver)
    driver.cancel(waiting.id, "never ran")
    assert driver.introspect.attempts(waiting.id) == []  # no attempt ever started


def test_bulk_cancel_records_the_running_attempts(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver, worker="w1", queue="bulk")
    driver.bulk(BulkRequest("cancel", JobFilter(queue="bulk"), ("running",), reason="stop"))
    assert _shape(driver.introspect.attempts(claimed.job.id)) == [(1, "cancelled", "w1")]


def test_a_lapsed_claim_taken_over_is_recorded_as_lapsed(driver: JobDriver, clock: ManualClock) -> None:
    job = enqueue(driver)
    claim_one(driver, "slow", visibility_timeout=30)
    clock.advance(30)
    claim_one(driver, "fast", visibility_timeout=30)
    assert _shape(driver.introspect.attempts(job.id)) == [(1, "lapsed", "slow"), (2, "running", "fast")]
    assert driver.introspect.attempts(job.id)[0].ended_at == at(clock.now())


def test_a_rescued_attempt_is_recorded_as_lost(driver: JobDriver, workers_to_drop: list[str]) -> None:
    driver.workers.register(WorkerInfo(id="alive", host="h", pid=os.getpid(), concurrency=1))
    workers_to_drop.append("alive")
    driver.workers.register(WorkerInfo(id="gone", host="h", pid=os.getpid(), concurrency=1))
    job = enqueue(driver)
    claim(driver, "gone")
    driver.workers.abandon("gone")
    assert [r.job_id for r in driver.workers.rescue("alive")] == [job.id]
    [lost] = driver.introspect.attempts(job.id)
    assert (lost.outcome, lost.worker_id) == ("lost", "gone")
    assert lost.error is not None and lost.error.startswith(WORKER_LOST)


def test_an_operator_retry_restarts_numbering_and_keeps_the_history(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver, worker="w1")
    driver.nack(claimed.job.id, claimed.claim_token, dead_letter("fatal"))
    driver.retry(claimed.job.id)
    again = claim_one(driver, "w2")
    driver.ack(again.job.id, again.claim_token)
    assert _shape(driver.introspect.attempts(claimed.job.id)) == [(1, "dead", "w1"), (1, "done", "w2")]


def test_a_heartbeat_and_a_refused_settle_record_nothing(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver, worker="w1")
    assert driver.heartbeat(claimed.job.id, claimed.claim_token, 60)
    assert not driver.nack(claimed.job.id, "w9:1:stale", retry_later())
    assert _shape(driver.introspect.attempts(claimed.job.id)) == [(1, "running", "w1")]


def test_the_history_goes_with_the_job(driver: JobDriver, clock: ManualClock) -> None:
    pruned = enqueue_and_claim(driver, worker="w1", queue="p")
    driver.nack(pruned.job.id, pruned.claim_token, dead_letter("x"))
    deleted = enqueue_and_claim(driver, worker="w1", queue="d")
    driver.nack(deleted.job.id, deleted.claim_token, dead_letter("y"))
    driver.bulk(BulkRequest("delete", JobFilter(queue="d"), ("dead",)))
    clock.advance(120)
    assert driver.prune(60) >= 1
    assert driver.introspect.attempts(pruned.job.id) == []
    assert driver.introspect.attempts(deleted.job.id) == []
    # A new job that happens to reuse nothing sees nothing of theirs.
    assert driver.introspect.attempts(enqueue(driver).id) == []
