"""PostgreSQL goes away mid-drain: every connection of the workers is terminated, again and again,
for an outage window; they reconnect by themselves and finish, losing nothing.

``pg_terminate_backend`` of the workers' backends (found by their ``application_name``) stands in
for a server restart without restarting the server other suites share: it drops the pool's
connections, the LISTEN connection and the app's connections at once, mid-statement, exactly as a
restart does, and keeps dropping the new ones for the whole window.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.process import chaos_app
from tests.process.harness import Fleet, job_counts, postgres_schema, postgres_test_url, wait_for
from ultimat3.drivers import create_driver
from ultimat3.jobs import isolated_registry

pytestmark = [pytest.mark.process, pytest.mark.postgres]

JOBS = 2_000
WORKERS = 3
CONCURRENCY = 4
OUTAGE = 1.5  # seconds during which every new connection of the workers is killed too
ROUND = 0.1


def terminate(admin: psycopg.Connection[tuple[int]], application_name: str) -> int:
    """Terminate every backend of the workers (not the admin's own); how many there were."""
    rows = admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = %s AND pid <> pg_backend_pid()",
        (application_name,),
    ).fetchall()
    return len(rows)


def test_workers_survive_postgres_connection_loss_mid_drain(tmp_path: Path) -> None:
    app_name = f"x_restart_{uuid.uuid4().hex[:8]}"
    with postgres_schema("x_restart", application_name=app_name) as url:
        # The controller's own connections carry another name: only the workers lose theirs.
        control_url = url.replace(app_name, f"{app_name}_ctl")
        app = chaos_app.AppDb(control_url)
        app.create_tables()
        driver = create_driver(control_url)
        try:
            with isolated_registry():
                effect = chaos_app.declare()["chaos.effect"]
                effect.enqueue_many([{"n": n, "work_ms": 5} for n in range(JOBS)], driver=driver)
            started = time.monotonic()
            with Fleet(tmp_path / "fleet", url, url, concurrency=CONCURRENCY, visibility=3.0, heartbeat=0.3,
                       poll=0.2, grace=2.0) as fleet:
                for _ in range(WORKERS):
                    fleet.start()
                wait_for(lambda: job_counts(driver)["done"] >= JOBS // 5, timeout=60,
                         message="a fifth of the jobs to be done before the outage", on_fail=fleet.logs)
                done_before = job_counts(driver)["done"]
                terminated = rounds = 0
                with psycopg.connect(postgres_test_url(), autocommit=True) as admin:
                    outage_end = time.monotonic() + OUTAGE
                    while time.monotonic() < outage_end:
                        killed = terminate(admin, app_name)
                        terminated += killed
                        rounds += killed > 0
                        time.sleep(ROUND)  # the outage's cadence, not a wait for a result
                fleet.check_healthy()
                wait_for(lambda: job_counts(driver)["done"] == JOBS, timeout=90,
                         message="every job done after the outage", on_fail=fleet.logs)
                elapsed = time.monotonic() - started
                fleet.check_healthy()
                codes = fleet.stop_all()
                logs = "".join(path.read_text() for path in (tmp_path / "fleet").glob("*.log"))
            counts = job_counts(driver)
        finally:
            driver.close()
        effects = app.scalar("SELECT count(DISTINCT n) FROM chaos_effects")
        rows = app.scalar("SELECT count(*) FROM chaos_effects")
        executions = app.scalar("SELECT count(*) FROM chaos_attempts")
        app.close()

    replays = executions - JOBS
    bound = rounds * WORKERS * CONCURRENCY
    print(f"[pg outage] jobs={JOBS} done_before_outage={done_before} backends_terminated={terminated} "
          f"rounds={rounds} executions={executions} replays={replays} (bound {bound}) "
          f"driver_reconnects={logs.count('PostgreSQL connection lost')} "
          f"listener_reconnects={logs.count('LISTEN x_jobs lost')} unsettled={logs.count('could not settle')} "
          f"elapsed={elapsed:.1f}s")
    assert terminated >= WORKERS, "the outage terminated nothing: the workers' backends were not found"
    assert all(code == 0 for code in codes.values()), codes
    assert counts["done"] == JOBS and counts["dead"] == 0, counts
    assert (rows, effects) == (JOBS, JOBS)
    assert 0 <= replays <= bound
