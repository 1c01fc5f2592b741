"""Four worker processes share one SQLite file (or one Postgres database) and drain 2,000 jobs:
with nobody killed, every job runs exactly once — the claim never hands one job to two workers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process import chaos_app
from tests.process.harness import Fleet, job_counts, postgres_schema, wait_for
from ultimat3.drivers import create_driver
from ultimat3.jobs import isolated_registry

pytestmark = pytest.mark.process

JOBS = 2_000
WORKERS = 4


def drain_with_fleet(url: str, app_url: str, root: Path) -> None:
    app = chaos_app.AppDb(app_url)
    app.create_tables()
    driver = create_driver(url)
    try:
        with isolated_registry():
            effect = chaos_app.declare()["chaos.effect"]
            effect.enqueue_many([{"n": n, "work_ms": 1} for n in range(JOBS)], driver=driver)
        started = time.monotonic()
        # A long visibility timeout: no claim may lapse, so any second execution is a claim bug.
        with Fleet(root, url, app_url, concurrency=4, visibility=60, heartbeat=5, poll=0.2, grace=5) as fleet:
            for _ in range(WORKERS):
                fleet.start()
            wait_for(lambda: job_counts(driver)["done"] == JOBS, timeout=120, interval=0.1,
                     message=f"{JOBS} jobs done", on_fail=fleet.logs)
            elapsed = time.monotonic() - started
            codes = fleet.stop_all()
            assert all(code == 0 for code in codes.values()), codes
            per_worker = {wid: sum(1 for e in fleet.events(wid) if e["kind"] == "done") for wid in fleet.procs}
        executions = app.scalar("SELECT count(*) FROM chaos_attempts")
        distinct = app.scalar("SELECT count(DISTINCT n) FROM chaos_attempts")
        effects = app.scalar("SELECT count(*) FROM chaos_effects")
        print(f"[fleet {url.split(':')[0]}] {JOBS} jobs in {elapsed:.1f}s, per worker {per_worker}")
        assert (executions, distinct, effects) == (JOBS, JOBS, JOBS), "a job ran twice, or not at all"
        assert sum(per_worker.values()) == JOBS
        assert sum(1 for count in per_worker.values() if count > 0) >= 2, "the work was shared by the fleet"
    finally:
        app.close()
        driver.close()


def test_four_processes_on_one_sqlite_file_run_each_job_once(tmp_path: Path) -> None:
    drain_with_fleet(f"sqlite:///{tmp_path / 'x.db'}", f"sqlite:///{tmp_path / 'app.db'}", tmp_path / "fleet")


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_schema("x_fleet") as url:
        yield url


@pytest.mark.postgres
def test_four_processes_on_one_postgres_run_each_job_once(pg_url: str, tmp_path: Path) -> None:
    drain_with_fleet(pg_url, pg_url, tmp_path / "fleet")
