"""Retention: finished jobs (and their steps) older than a cutoff are deleted."""

from __future__ import annotations

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver

from .helpers import claim_one, dead_letter, enqueue, enqueue_and_claim


def _finish_three(driver: JobDriver) -> tuple[str, str, str]:
    """A done job (with a step), a dead one and a cancelled one, all finished now."""
    done = enqueue_and_claim(driver, name="done")
    assert driver.steps.record(done.job.id, done.claim_token, "s", 1)
    assert driver.ack(done.job.id, done.claim_token)
    dead = enqueue_and_claim(driver, name="dead")
    assert driver.nack(dead.job.id, dead.claim_token, dead_letter())
    cancelled = enqueue(driver, "cancelled").id
    driver.cancel(cancelled)
    return done.job.id, dead.job.id, cancelled


def test_prune_deletes_old_finished_jobs_and_their_steps(driver: JobDriver, clock: ManualClock) -> None:
    done_id, dead_id, cancelled_id = _finish_three(driver)
    done_run = driver.introspect.get(done_id)
    assert done_run is not None
    clock.advance(100)

    assert driver.prune(50) == 3
    for job_id in (done_id, dead_id, cancelled_id):
        assert driver.introspect.get(job_id) is None
    assert driver.steps.load(done_run.run_id) == {}
    assert driver.introspect.list() == []
    assert driver.prune(50) == 0


def test_prune_keeps_recently_finished_jobs(driver: JobDriver, clock: ManualClock) -> None:
    ids = _finish_three(driver)
    clock.advance(100)
    assert driver.prune(200) == 0
    assert {job.id for job in driver.introspect.list()} == set(ids)


def test_prune_cutoff_is_inclusive(driver: JobDriver, clock: ManualClock) -> None:
    _finish_three(driver)
    clock.advance(60)
    assert driver.prune(61) == 0
    assert driver.prune(60) == 3  # finished_at <= now - older_than


def test_prune_never_touches_live_jobs(driver: JobDriver, clock: ManualClock) -> None:
    ready = enqueue(driver, "ready").id
    delayed = enqueue(driver, "delayed", run_at=clock.now() + 10).id
    running = enqueue(driver, "running").id
    claimed = claim_one(driver, names=("running",))
    assert driver.steps.record(running, claimed.claim_token, "s", "kept")
    enqueue(driver, "done")
    old_done = claim_one(driver, names=("done",))
    assert driver.ack(old_done.job.id, old_done.claim_token)
    clock.advance(86_400)

    assert driver.prune(0) == 1
    assert {job.id for job in driver.introspect.list()} == {ready, delayed, running}
    assert driver.steps.load(claimed.job.run_id)["s"].result == "kept"
