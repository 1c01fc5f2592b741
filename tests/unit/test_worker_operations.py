"""A worker that is pleasant to run: log lines a person can act on, JSON logs, a warning about jobs
nobody here can run, a start that waits for the database, throttled outage warnings, and a
foreground pass that shows another worker's progress."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from ultimat3.backfill import BackfillProgress, BackfillReport, add_progress_listener, backfill, run_backfill
from ultimat3.cli.config import Config
from ultimat3.cli.logs import JsonFormatter
from ultimat3.cli.worker import connect_with_retry
from ultimat3.core import Ctx, ManualClock, XError
from ultimat3.core.throttle import ThrottledLog
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import ClaimRequest, RetryPolicy, SyncStep, Worker, job


def drain(driver: MemoryDriver) -> None:
    worker = Worker(driver, environment="test", concurrency=1)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()


def test_every_attempt_line_names_the_job_and_a_failure_its_error(memory: MemoryDriver,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    @job(name="t.flaky", tenant="none", queue="mail", retry=RetryPolicy(max_attempts=2, base=0, jitter=0))
    def flaky(input: Any, ctx: Ctx, step: SyncStep) -> None:
        raise RuntimeError("smtp said no\nsecond line of detail")

    queued = flaky.enqueue(driver=memory)
    with caplog.at_level(logging.INFO, logger="ultimat3.worker"):
        drain(memory)
    lines = [r for r in caplog.records if r.name == "ultimat3.worker" and "t.flaky" in r.getMessage()]
    assert [r.outcome for r in lines] == ["retry", "dead"]  # type: ignore[attr-defined]
    first = lines[0].getMessage()
    assert f"id={queued.id}" in first and "queue=mail" in first and "attempt=1/2" in first
    assert first.endswith("error: RuntimeError: smtp said no"), first
    assert lines[0].levelno == logging.WARNING and lines[1].levelno == logging.ERROR
    assert lines[1].error == "RuntimeError: smtp said no"  # type: ignore[attr-defined]


def test_json_logs_carry_the_fields(memory: MemoryDriver) -> None:
    record = logging.LogRecord("ultimat3.worker", logging.WARNING, __file__, 1, "job %s %s", ("a", "retry"), None)
    record.job_id = "j-1"
    record.attempt = 2
    data = json.loads(JsonFormatter().format(record))
    assert data["message"] == "job a retry" and data["level"] == "WARNING"
    assert data["job_id"] == "j-1" and data["attempt"] == 2 and "time" in data


def test_a_worker_names_the_waiting_jobs_it_cannot_run(memory: MemoryDriver,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    @job(name="t.known", tenant="none", queue="q1")
    def known(input: Any, ctx: Ctx, step: SyncStep) -> None:
        return None

    @job(name="t.elsewhere", tenant="none", queue="q1")
    def elsewhere(input: Any, ctx: Ctx, step: SyncStep) -> None:
        return None

    elsewhere.enqueue(driver=memory)
    elsewhere.enqueue(driver=memory)
    worker = Worker(memory, environment="test", names=["t.known"], queues=["q1"], poll_interval=0.01,
                    unknown_names_interval=0.05)
    assert [(w.queue, w.name, w.count) for w in worker.unknown_names()] == [("q1", "t.elsewhere", 2)]

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.sleep(0.2)
        worker.stop()
        await asyncio.wait_for(task, 10)

    with caplog.at_level(logging.WARNING, logger="ultimat3.worker"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if "does not declare" in r.getMessage()]
    assert len(warnings) >= 2, "at start and again periodically"
    assert 'queue q1 holds 2 job(s) named "t.elsewhere"' in warnings[0] and "--app" in warnings[0]


def test_release_all_hands_running_attempts_back_at_once(memory: MemoryDriver) -> None:
    entered = threading.Event()

    @job(name="t.long", tenant="none")
    def long(input: Any, ctx: Ctx, step: SyncStep) -> None:
        entered.set()
        step.signal.wait(30)
        step.signal.raise_if_aborted()

    queued = long.enqueue(driver=memory)
    worker = Worker(memory, environment="test", grace_period=60, poll_interval=0.01)

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        await asyncio.to_thread(entered.wait, 10)
        worker.stop()
        await asyncio.sleep(0.05)
        worker.release_all()
        await asyncio.wait_for(task, 10)  # far less than the 60 s grace

    asyncio.run(main())
    row = memory.introspect.get(queued.id)
    assert row is not None and row.state == "ready" and row.attempt == 0 and row.claimed_by is None


def test_the_worker_waits_for_the_database_at_start_with_backoff() -> None:
    unreachable = XError("the database at postgresql://x@db/app is unreachable: refused", "start it",
                         code="X_DATABASE_UNREACHABLE")
    attempts: list[int] = []
    now = [0.0]
    slept: list[float] = []

    class Flaky(Config):
        def driver(self, *, migrate: bool = True) -> Any:
            attempts.append(1)
            if len(attempts) < 4:
                raise unreachable
            return "driver"

    config = Flaky(apps=(), url="postgresql://x@db/app", environment="test")

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    assert connect_with_retry(config, timeout=60, sleep=sleep, clock=lambda: now[0]) == "driver"
    assert slept == [0.5, 1.0, 2.0], "exponential backoff"
    attempts.clear()
    now[0] = 0.0
    with pytest.raises(XError) as caught:
        connect_with_retry(config, timeout=0, sleep=sleep, clock=lambda: now[0])  # --fail-fast
    assert caught.value.code == "X_DATABASE_UNREACHABLE" and len(attempts) == 1

    class Broken(Config):
        def driver(self, *, migrate: bool = True) -> Any:
            raise XError("bad url", "fix it", code="X_DATABASE_URL")

    with pytest.raises(XError) as caught:
        connect_with_retry(Broken(apps=(), url="nope://", environment="test"), timeout=60, sleep=sleep)
    assert caught.value.code == "X_DATABASE_URL", "what waiting cannot heal is raised at once"


def test_outage_warnings_are_one_line_each_and_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    throttled = ThrottledLog(logging.getLogger("t.throttle"), every=10, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="t.throttle"):
        for _ in range(50):
            throttled.warning("claim", "claim failed (%s)", "connection refused")
            now[0] += 0.1
        now[0] += 10
        throttled.warning("claim", "claim failed (%s)", "connection refused")
        throttled.recovered("claim", "claiming works again")
        throttled.recovered("claim", "claiming works again")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "claim failed (connection refused)",
        "claim failed (connection refused) (49 similar in the last 10s not shown)",
        "claiming works again",
    ]


def test_a_foreground_run_attached_to_another_workers_pass_shows_its_progress(memory: MemoryDriver,
                                                                              clock: ManualClock) -> None:
    sweep = backfill(name="t.attached", tenant="none", engine="job-store",
                     source=lambda ctx: sa.select(sa.table("t", sa.column("id"))), handle=lambda batch: None)
    queued = sweep.enqueue(driver=memory)
    [other] = memory.claim(ClaimRequest(worker_id="other-worker", visibility_timeout=3600))
    memory.backfills.start(queued.run_id, "t.attached", "c", queued.id)
    memory.backfills.progress(queued.run_id, 7, 7_000)
    events: list[BackfillProgress] = []
    remove = add_progress_listener(events.append)
    result: list[BackfillReport] = []
    # The thread carries the test's (operator) context, as asyncio.to_thread would.
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(lambda: result.append(
        run_backfill(sweep, driver=memory, environment="test", poll_interval=0.01)),))
    try:
        thread.start()
        for _ in range(500):
            if events:
                break
            threading.Event().wait(0.01)
        memory.backfills.progress(queued.run_id, 9, 9_000)
        memory.backfills.finish(queued.run_id, "completed")
        memory.ack(other.job.id, other.claim_token, {"name": "t.attached", "batches": 9, "rows": 9_000})
        thread.join(10)
    finally:
        remove()
    assert events and (events[0].batches, events[0].rows) == (7, 7_000), "the other worker's real progress"
    assert result == [BackfillReport("t.attached", 9, 9_000)]
