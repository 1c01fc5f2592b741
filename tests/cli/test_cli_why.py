"""`x jobs why ID`: every reason a waiting job has not started, read from the store (SQLite and
PostgreSQL), and the one coded line for an id that is not there."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cli import cli_app
from tests.cli.conftest import X
from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import ClaimRequest, JobDriver, NackRequest, WorkerInfo


@pytest.fixture
def driver(database: str) -> Iterator[JobDriver]:
    built = create_driver(database)
    try:
        yield built
    finally:
        built.close()


def why(x: X, job_id: str) -> Any:
    result = x("jobs", "why", job_id, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def codes(explained: Any) -> list[str]:
    return [r["code"] for r in explained["reasons"]]


def test_a_job_enqueued_for_later_with_no_worker_says_both(x: X, driver: JobDriver) -> None:
    queued = cli_app.ping.enqueue({"org_id": "o1", "n": 1}, delay="10m", driver=driver)
    explained = why(x, queued.id)
    assert explained["waiting"] and codes(explained) == ["not-due", "no-worker"]
    assert "in 10 min" in explained["reasons"][0]["text"]
    human = x("jobs", "why", queued.id)
    assert human.exit_code == 0 and "not-due:" in human.stdout and "x worker --queue default" in human.stdout


def test_a_paused_queue_names_who_paused_it(x: X, driver: JobDriver) -> None:
    queued = cli_app.ping.enqueue({"org_id": "o1", "n": 1}, driver=driver)
    assert x("queues", "pause", "default", "--actor", "ops@example.com").exit_code == 0
    explained = why(x, queued.id)
    assert codes(explained) == ["queue-paused", "no-worker"]
    assert "paused by ops@example.com" in explained["reasons"][0]["text"]


def test_a_due_job_with_a_live_worker_is_next_in_line(x: X, driver: JobDriver) -> None:
    queued = cli_app.ping.enqueue({"org_id": "o1", "n": 1}, driver=driver)
    driver.workers.register(WorkerInfo(id="w-why", host="h", pid=1, concurrency=4, queues=("default",)))
    try:
        explained = why(x, queued.id)
        assert codes(explained) == ["due"]
        text = explained["reasons"][0]["text"]
        assert "1 live worker(s)" in text and "0 of 4 slots" in text
    finally:
        driver.workers.unregister("w-why")


def test_a_failed_attempt_waits_out_its_backoff_with_its_error(x: X, driver: JobDriver) -> None:
    queued = cli_app.ping.enqueue({"org_id": "o1", "n": 1}, driver=driver)
    [claimed] = driver.claim(ClaimRequest("w1"))
    assert driver.nack(queued.id, claimed.claim_token, NackRequest(error="RuntimeError: upstream 503", delay=300))
    explained = why(x, queued.id)
    assert codes(explained)[0] == "backoff"
    assert "attempt 1 failed" in explained["reasons"][0]["text"] and "upstream 503" in explained["reasons"][0]["text"]


def test_running_and_finished_jobs_are_not_waiting(x: X, driver: JobDriver) -> None:
    queued = cli_app.ping.enqueue({"org_id": "o1", "n": 1}, driver=driver)
    [claimed] = driver.claim(ClaimRequest("w-runner"))
    running = why(x, queued.id)
    assert not running["waiting"] and codes(running) == ["running"] and "w-runner" in running["reasons"][0]["text"]
    driver.ack(queued.id, claimed.claim_token, 1)
    done = why(x, queued.id)
    assert not done["waiting"] and codes(done) == ["finished"] and "ended done" in done["reasons"][0]["text"]


def test_an_unknown_id_is_one_coded_line(x: X) -> None:
    result = x("jobs", "why", "no-such-job")
    assert result.exit_code == 2 and "X_JOB_NOT_FOUND" in result.stderr and "hint:" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_a_full_concurrency_key_names_the_holders(x: X, driver: JobDriver) -> None:
    held = cli_app.sync.enqueue({"org_id": "o1", "n": 1}, driver=driver)
    waiting = cli_app.sync.enqueue({"org_id": "o1", "n": 2}, driver=driver)
    other_org = cli_app.sync.enqueue({"org_id": "o2", "n": 3}, driver=driver)
    claimed = driver.claim(ClaimRequest(worker_id="w-held", limit=1, names=("cli.sync",), flow=True))
    assert [c.job.id for c in claimed] == [held.id]
    explained = why(x, waiting.id)
    assert codes(explained) == ["concurrency-limit", "no-worker"]
    text = explained["reasons"][0]["text"]
    assert "'cli.sync|o1' allows 1 at once" in text and held.id in text and "w-held" in text
    assert codes(why(x, other_org.id)) == ["no-worker"]


def test_an_empty_bucket_says_when_the_next_token_comes(x: X, driver: JobDriver) -> None:
    cli_app.mail.enqueue({"org_id": "o1", "n": 1}, driver=driver)
    waiting = cli_app.mail.enqueue({"org_id": "o1", "n": 2}, driver=driver)
    assert len(driver.claim(ClaimRequest(worker_id="w", limit=5, names=("cli.mail",), flow=True))) == 1
    explained = why(x, waiting.id)
    assert codes(explained) == ["rate-limit", "no-worker"]
    assert "'cli.mail' allows 1 starts/h (burst 1)" in explained["reasons"][0]["text"]
    assert "in 60 min" in explained["reasons"][0]["text"]


def test_a_run_of_a_paused_schedule_says_so_and_still_runs(x: X, driver: JobDriver) -> None:
    from ultimat3.drivers.protocol import EnqueueRequest

    queued = driver.enqueue(EnqueueRequest(name="cli.digest", payload={"kind": "daily"},
                                           enqueued_by="schedule:cli.digest:nightly@2026-06-01T03:00:00Z"))
    assert driver.schedules.set_paused("cli.digest:nightly", True, "ops@example.com")
    explained = why(x, queued.id)
    assert codes(explained) == ["no-worker", "schedule-paused"]
    text = explained["reasons"][1]["text"]
    assert "'cli.digest:nightly' is paused by ops@example.com" in text and "still runs" in text
    driver.schedules.set_paused("cli.digest:nightly", False, "ops@example.com")
    assert codes(why(x, queued.id)) == ["no-worker"]
