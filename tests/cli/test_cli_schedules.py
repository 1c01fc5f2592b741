"""``x schedules`` on SQLite and Postgres against the test app's two schedules of ``cli.digest``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.cli.conftest import X
from ultimat3.drivers.protocol import JobDriver, JobFilter
from ultimat3.jobs import create_driver
from ultimat3.jobs.scheduler import Scheduler, declared_schedules

KEYS = {"name", "job", "schedule", "catch_up", "jitter", "declared", "paused", "due_now", "next_fire", "last_tick",
        "last_job_id", "changed_at", "changed_by"}


def as_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def driver(database: str) -> Iterator[JobDriver]:
    built = create_driver(database)
    try:
        yield built
    finally:
        built.close()


def test_ls_shows_every_declared_schedule_and_what_a_worker_fired(x: X, driver: JobDriver) -> None:
    listed = {s["name"]: s for s in as_json(x("schedules", "ls", "--json"))}
    assert set(listed) == {"cli.digest:hourly", "cli.digest:nightly"}
    nightly = listed["cli.digest:nightly"]
    assert set(nightly) == KEYS
    assert (nightly["job"], nightly["schedule"], nightly["catch_up"]) == (
        "cli.digest", "cron 0 3 * * * (Europe/Berlin)", "latest")
    assert nightly["next_fire"].endswith(("01:00:00Z", "02:00:00Z"))  # 03:00 Berlin in UTC
    assert nightly["last_tick"] is None and nightly["paused"] is False

    # A worker's scheduler registers the schedules; an hour on, it fires the hourly one. The hour is
    # fixed (noon UTC, far from 03:00 Berlin): from the wall clock, a run between 01:00 and 03:00 UTC
    # would see the nightly tick fall inside the hour too.
    noon = datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()
    scheduler = Scheduler(driver, [d for d in declared_schedules() if d.handle.name == "cli.digest"])
    scheduler.run_once(noon)
    fired = scheduler.run_once(noon + 3600)
    [(key, result)] = fired
    assert key == "cli.digest:hourly" and result.job is not None
    hourly = {s["name"]: s for s in as_json(x("schedules", "ls", "--json"))}["cli.digest:hourly"]
    assert hourly["last_job_id"] == result.job.id and hourly["last_tick"] is not None
    human = x("schedules", "ls")
    assert human.exit_code == 0 and "cli.digest:nightly" in human.stdout and "every 1h" in human.stdout


def test_pause_resume_and_run(x: X, driver: JobDriver) -> None:
    assert as_json(x("schedules", "pause", "cli.digest:nightly", "--actor", "ops:ann", "--json")) == {
        "name": "cli.digest:nightly", "paused": True, "changed": True}
    assert "already paused" in x("schedules", "pause", "cli.digest:nightly").stdout
    listed = {s["name"]: s for s in as_json(x("schedules", "ls", "--json"))}
    assert listed["cli.digest:nightly"]["paused"] is True and listed["cli.digest:nightly"]["changed_by"] == "ops:ann"
    assert "paused" in x("schedules", "ls").stdout
    assert as_json(x("schedules", "resume", "cli.digest:nightly", "--json"))["changed"] is True
    audit = [(e["action"], e["target"]) for e in as_json(x("audit", "ls", "--json"))]
    assert audit[0] == ("resume", {"schedule": "cli.digest:nightly"})

    ran = as_json(x("schedules", "run", "cli.digest:hourly", "--json"))
    job = driver.introspect.get(ran["job_id"])
    assert job is not None and job.name == "cli.digest" and job.payload == {"kind": "hourly"}
    assert job.enqueued_by is not None and job.enqueued_by.startswith("schedule:cli.digest:hourly@")
    assert "enqueued job" in x("schedules", "run", "cli.digest:nightly").stdout
    assert len(driver.introspect.list(JobFilter(name="cli.digest"))) == 2


@pytest.mark.parametrize("args", [
    ("schedules", "pause", "cli.nope"),
    ("schedules", "resume", ""),
    ("schedules", "run", "cli.digest"),
])
def test_an_unknown_schedule_is_one_coded_line(x: X, args: tuple[str, ...]) -> None:
    result = x(*args)
    assert result.exit_code == 2 and "X_SCHEDULE_UNKNOWN" in result.stderr and "cli.digest:hourly" in result.stderr
    assert "Traceback" not in result.output
