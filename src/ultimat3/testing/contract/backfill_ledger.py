"""The backfill ledger: one row per pass, reopened on retry, history kept."""

from __future__ import annotations

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import BackfillRun, JobDriver

from .helpers import at


def test_start_opens_a_running_row(driver: JobDriver, clock: ManualClock) -> None:
    run = driver.backfills.start("run-1", "fill-emails", "sha-1", "job-1")
    assert run == BackfillRun(
        run_id="run-1",
        name="fill-emails",
        checksum="sha-1",
        status="running",
        batches=0,
        rows=0,
        started_at=at(clock.now()),
        job_id="job-1",
        finished_at=None,
        error=None,
    )
    assert driver.backfills.get("run-1") == run


def test_start_without_a_job(driver: JobDriver) -> None:
    assert driver.backfills.start("run-1", "fill", "c", None).job_id is None


def test_progress_and_finish(driver: JobDriver, clock: ManualClock) -> None:
    driver.backfills.start("run-1", "fill", "c", "job-1")
    clock.advance(10)
    driver.backfills.progress("run-1", 3, 2_500)
    run = driver.backfills.get("run-1")
    assert run is not None and (run.batches, run.rows, run.status) == (3, 2_500, "running")
    driver.backfills.progress("run-1", 4, 3_000)
    clock.advance(10)
    driver.backfills.finish("run-1", "completed")

    run = driver.backfills.get("run-1")
    assert run is not None
    assert (run.status, run.batches, run.rows, run.error) == ("completed", 4, 3_000, None)
    assert run.finished_at == at(clock.now())
    assert run.started_at == at(clock.now() - 20)


def test_finish_as_failed_keeps_the_error(driver: JobDriver, clock: ManualClock) -> None:
    driver.backfills.start("run-1", "fill", "c", None)
    driver.backfills.finish("run-1", "failed", "boom at batch 3")
    run = driver.backfills.get("run-1")
    assert run is not None
    assert (run.status, run.error, run.finished_at) == ("failed", "boom at batch 3", at(clock.now()))


def test_start_again_reopens_the_same_pass(driver: JobDriver, clock: ManualClock) -> None:
    first = driver.backfills.start("run-1", "fill", "c", "job-1")
    driver.backfills.progress("run-1", 2, 200)
    driver.backfills.finish("run-1", "failed", "boom")
    clock.advance(60)

    again = driver.backfills.start("run-1", "fill", "c", "job-1")
    assert again.run_id == "run-1"
    assert again.status == "running"
    assert again.error is None
    assert again.finished_at is None
    assert again.started_at == first.started_at
    assert (again.batches, again.rows) == (2, 200)  # a retried attempt resumes the pass
    assert driver.backfills.get("run-1") == again
    assert len(driver.backfills.list("fill")) == 1


def test_get_of_an_unknown_run_is_none(driver: JobDriver) -> None:
    assert driver.backfills.get("nope") is None


def test_last_completed(driver: JobDriver, clock: ManualClock) -> None:
    assert driver.backfills.last_completed("fill") is None
    driver.backfills.start("old", "fill", "c1", None)
    clock.advance(1)
    driver.backfills.finish("old", "completed")
    clock.advance(1)
    driver.backfills.start("new", "fill", "c2", None)
    clock.advance(1)
    driver.backfills.finish("new", "completed")
    clock.advance(1)
    driver.backfills.start("failed", "fill", "c3", None)
    driver.backfills.finish("failed", "failed", "x")
    clock.advance(1)
    driver.backfills.start("running", "fill", "c4", None)
    driver.backfills.start("other", "other-fill", "c5", None)
    clock.advance(1)
    driver.backfills.finish("other", "completed")

    last = driver.backfills.last_completed("fill")
    assert last is not None
    assert (last.run_id, last.checksum) == ("new", "c2")
    other = driver.backfills.last_completed("other-fill")
    assert other is not None and other.run_id == "other"
    assert driver.backfills.last_completed("never") is None


def test_last_completed_is_by_finish_time(driver: JobDriver, clock: ManualClock) -> None:
    driver.backfills.start("started-first", "fill", "c", None)
    clock.advance(1)
    driver.backfills.start("started-second", "fill", "c", None)
    clock.advance(1)
    driver.backfills.finish("started-second", "completed")
    clock.advance(1)
    driver.backfills.finish("started-first", "completed")
    last = driver.backfills.last_completed("fill")
    assert last is not None and last.run_id == "started-first"


def test_list_is_newest_first(driver: JobDriver, clock: ManualClock) -> None:
    driver.backfills.start("r1", "fill", "c", None)
    clock.advance(1)
    driver.backfills.start("r2", "other", "c", None)
    clock.advance(1)
    driver.backfills.start("r3", "fill", "c", None)
    # Same started_at: run_id descending breaks the tie.
    driver.backfills.start("r4", "fill", "c", None)

    assert [run.run_id for run in driver.backfills.list("fill")] == ["r4", "r3", "r1"]
    assert [run.run_id for run in driver.backfills.list()] == ["r4", "r3", "r2", "r1"]
    assert driver.backfills.list("none") == []


def test_cancel_of_a_pass_closes_its_running_ledger_row(driver: JobDriver, clock: ManualClock) -> None:
    from .helpers import enqueue

    job = enqueue(driver, "fill")
    driver.backfills.start(job.run_id, "fill", "c", job.id)
    clock.advance(5)
    driver.cancel(job.id, "operator stopped it")
    run = driver.backfills.get(job.run_id)
    assert run is not None
    assert (run.status, run.error, run.finished_at) == ("cancelled", "operator stopped it", at(clock.now()))


def test_cancel_leaves_a_closed_ledger_row_alone(driver: JobDriver, clock: ManualClock) -> None:
    from .helpers import enqueue

    job = enqueue(driver, "fill")
    driver.backfills.start(job.run_id, "fill", "c", job.id)
    driver.backfills.finish(job.run_id, "failed", "boom")
    clock.advance(5)
    driver.cancel(job.id, "too late")
    run = driver.backfills.get(job.run_id)
    assert run is not None and (run.status, run.error) == ("failed", "boom")


def test_finish_does_not_reopen_or_overwrite_a_cancelled_row(driver: JobDriver) -> None:
    from .helpers import enqueue

    job = enqueue(driver, "fill")
    driver.backfills.start(job.run_id, "fill", "c", job.id)
    driver.cancel(job.id, "stop")
    # The pass's worker learns of the cancel late and tries to close its row as completed.
    driver.backfills.finish(job.run_id, "completed")
    run = driver.backfills.get(job.run_id)
    assert run is not None and run.status == "cancelled"
    assert driver.backfills.last_completed("fill") is None
    # A retry of the run reopens the same row.
    driver.retry(job.id)
    assert driver.backfills.start(job.run_id, "fill", "c", job.id).status == "running"
