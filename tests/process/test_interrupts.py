"""Ctrl-C, for real: signals sent to real `x` processes in the middle of a backfill pass.

- A foreground `x db backfill NAME --wait` interrupted releases its claim at once (exit 130, one
  coded line): the next run resumes the pass immediately, not after the 30 s visibility timeout.
- A worker given a second SIGINT releases its running attempt at once instead of waiting out its
  grace period, without burning the attempt.
Runs on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.postgres import postgres_database
from ultimat3.backfill import engine_for_url
from ultimat3.drivers import create_driver

pytestmark = pytest.mark.process

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'x.db'}"
        return
    with postgres_database("x_interrupts") as url:
        yield url


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"X_DATABASE_URL": url, "X_ENV": "test",
                "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])})
    return env


def _x(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ultimat3", "--app", "backfill_app", *args], env=_env(url),
                            cwd=HERE, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _prepare(url: str) -> dict[str, str]:
    prepared = subprocess.run([sys.executable, "-c", "import backfill_app; backfill_app.prepare()"],
                              env=_env(url), cwd=HERE, text=True, capture_output=True, timeout=60)
    assert prepared.returncode == 0, prepared.stderr
    ids: dict[str, str] = json.loads(prepared.stdout.strip().splitlines()[-1])
    return ids


def _handled(url: str) -> int:
    with engine_for_url(url).connect() as conn:
        try:
            return int(conn.execute(sa.text("SELECT count(*) FROM handled")).scalar_one())
        except sa.exc.DBAPIError:
            return 0


def _wait_for(what: str, condition: Callable[[], bool], timeout: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            output = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"the process ended ({proc.returncode}) before {what}: {output}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def test_ctrl_c_of_a_foreground_pass_releases_it_and_the_next_run_resumes_at_once(url: str) -> None:
    ids = _prepare(url)
    first = _x(url, "db", "backfill", "kill.sweep", "--wait")
    _wait_for("two batches handled", lambda: _handled(url) >= 500, 60, first)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-2].startswith("error X_INTERRUPTED: interrupted: released backfill"), err
    assert lines[-1].startswith("  hint: "), err
    assert "Traceback" not in err

    driver = create_driver(url)
    try:
        row = driver.introspect.get(ids["job_id"])
        assert row is not None and row.state == "ready" and row.claimed_by is None, row
        assert row.attempt == 0, "a release burns no attempt"
        ledger = driver.backfills.get(ids["run_id"])
        assert ledger is not None and ledger.status == "running" and ledger.batches >= 1
        started = time.monotonic()
        second = _x(url, "db", "backfill", "kill.sweep", "--wait")
        _, err = second.communicate(timeout=120)
        elapsed = time.monotonic() - started
        assert second.returncode == 0, err
        # Released, not left to lapse: the visibility timeout (30 s) never had to pass.
        assert elapsed < 25, f"the second run took {elapsed:.1f}s: the claim was not released"
        done = driver.introspect.get(ids["job_id"])
        assert done is not None and done.state == "done" and done.last_error is None
        finished = driver.backfills.get(ids["run_id"])
        assert finished is not None and finished.status == "completed"
        with engine_for_url(url).connect() as conn:
            counts = conn.execute(sa.text("SELECT min(n), max(n), count(*) FROM handled")).one()
        assert counts[2] == 10_000 and counts[0] == 1 and counts[1] <= 2, counts
    finally:
        driver.close()


def test_a_second_sigint_releases_a_workers_attempt_at_once(url: str) -> None:
    ids = _prepare(url)
    worker = _x(url, "worker", "--grace", "120", "--concurrency", "1")
    _wait_for("the pass to start", lambda: _handled(url) >= 250, 60, worker)
    worker.send_signal(signal.SIGINT)
    time.sleep(0.3)
    started = time.monotonic()
    worker.send_signal(signal.SIGINT)
    _, err = worker.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert worker.returncode == 0, err
    assert elapsed < 20, f"the worker took {elapsed:.1f}s after the second signal (grace was 120 s)"
    assert "second signal: releasing 1 running attempt(s) now" in err
    driver = create_driver(url)
    try:
        row = driver.introspect.get(ids["job_id"])
        assert row is not None and row.state == "ready" and row.attempt == 0 and row.claimed_by is None, row
        ledger = driver.backfills.get(ids["run_id"])
        assert ledger is not None and ledger.status == "running"
    finally:
        driver.close()
