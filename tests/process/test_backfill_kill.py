"""A real worker process is SIGKILLed in the middle of a pass; a second one finishes it.

Every row must be handled (counted in an app-side table) and no row more than twice: the killed
batch is the only one that can be handled again. Runs on a SQLite file and on PostgreSQL (a
database created per test from ``X_TEST_DATABASE_URL``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import sqlalchemy as sa

from tests.postgres import postgres_database
from ultimat3.drivers import create_driver

pytestmark = pytest.mark.process

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
ROWS = 10_000


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'x.db'}"
        return
    with postgres_database("x_backfill_kill") as url:
        yield url


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "X_DATABASE_URL": url,
        "X_ENV": "test",
        "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")]),
    })
    return env


def _python(code: str, url: str, log: IO[str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], env=_env(url), cwd=HERE, text=True,
                            stdout=subprocess.PIPE if log is None else log,
                            stderr=subprocess.STDOUT if log is not None else None)


def _wait_for(what: str, condition: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}; worker log:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_killed_worker_leaves_a_pass_the_next_one_finishes(url: str, tmp_path: Path) -> None:
    driver = create_driver(url)
    try:
        prepared = _python("import backfill_app; backfill_app.prepare()", url)
        out, _ = prepared.communicate(timeout=60)
        assert prepared.returncode == 0, out
        ids: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        run_id, job_id = ids["run_id"], ids["job_id"]

        def batches() -> int:
            run = driver.backfills.get(run_id)
            return 0 if run is None else run.batches

        log = tmp_path / "workers.log"
        with log.open("w") as sink:
            first = _python("import backfill_app; backfill_app.work()", url, sink)
            try:
                _wait_for("the first worker to record 5 batches", lambda: batches() >= 5, 60, log)
            finally:
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=30)
            killed_at = batches()
            assert killed_at < ROWS // 250, "the pass must still be unfinished when its worker dies"

            second = _python("import backfill_app; backfill_app.work()", url, sink)
            try:
                def done() -> bool:
                    row = driver.introspect.get(job_id)
                    return row is not None and row.state in ("done", "dead", "cancelled")

                _wait_for("the second worker to finish the pass", done, 60, log)
            finally:
                _stop(second)

        job = driver.introspect.get(job_id)
        assert job is not None and job.state == "done", job and job.last_error
        assert job.attempt >= 2, "the second worker re-claimed the killed attempt's run"
        assert job.result["rows"] == ROWS and job.result["skipped"] is False

        engine = sa.create_engine(_sqlalchemy_url(url))
        try:
            with engine.connect() as conn:
                count, low, high = conn.execute(sa.text("SELECT count(*), min(n), max(n) FROM handled")).one()
        finally:
            engine.dispose()
        assert count == ROWS, "every row handled"
        assert low == 1 and high <= 2, "no batch handled more than twice"

        runs = driver.backfills.list("kill.sweep")
        assert len(runs) == 1, "one pass, one ledger row, across both workers"
        assert (runs[0].run_id, runs[0].status, runs[0].rows, runs[0].batches) == (run_id, "completed", ROWS, 40)
    finally:
        driver.close()


def _sqlalchemy_url(url: str) -> str:
    return url if url.startswith("sqlite") else url.replace("postgresql://", "postgresql+psycopg://", 1)
