"""One clock for the fleet: a PostgreSQL worker whose host clock is 45 s off (libfaketime) keeps the
database's time for everything that coordinates workers.

- A skewed worker never takes a job a healthy worker is running, whichever of the two is off (the
  skewed one ahead and arriving second, or behind and enqueuing and claiming first).
- A delayed job starts at its ``run_at`` by the database's clock, within a second, whichever
  process's clock is off.
- A lease (limit 1) is never held by two processes at once.
- The skewed process says so: one ``X_CLOCK_SKEW`` line.

libfaketime comes from Debian's ``faketime`` package, installed here when missing (CI runs as root).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.process import skew_app
from tests.process.harness import REPO, postgres_schema, unavailable, wait_for
from tests.system_packages import ensure_debian_package
from ultimat3.drivers import create_driver

pytestmark = [pytest.mark.process, pytest.mark.postgres]

SKEW = 45


def _find_libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def libfaketime() -> str:
    """The libfaketime shared object, installed from Debian's packages when it is missing."""
    path = ensure_debian_package("faketime", _find_libfaketime)
    if path is None:
        unavailable("libfaketime is not installed and could not be (apt-get install faketime)")
    return path


class Skewed:
    """Processes of :mod:`tests.process.skew_app` on one schema, some with their clocks set off."""

    def __init__(self, url: str, root: Path, lib: str) -> None:
        self.url, self.root, self.lib = url, root, lib
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[Any] = []

    def spawn(self, mode: str, name: str, offset: int, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        if offset:
            env.update(LD_PRELOAD=self.lib, FAKETIME=f"{offset:+d}s")
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        argv = [sys.executable, "-m", "tests.process.skew_app", mode, "--url", self.url, "--name", name, *args]
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def marks(self, kind: str) -> list[tuple[str | None, str, datetime, datetime | None]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute("SELECT job_id, worker, at, until FROM skew_marks WHERE kind = %s ORDER BY at",
                                (kind,)).fetchall()
        return [(row[0], row[1], row[2], row[3]) for row in rows]

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)[-3000:]}" for name in self.procs)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for log in self._logs:
            log.close()


@pytest.fixture
def skewed(tmp_path: Path, libfaketime: str) -> Iterator[Skewed]:
    with postgres_schema("x_skew") as url:
        driver = create_driver(url)  # migrates
        driver.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(skew_app.MARKS)
        fleet = Skewed(url, tmp_path, libfaketime)
        try:
            yield fleet
        finally:
            fleet.close()


@pytest.mark.parametrize(("first", "second"), [(0, SKEW), (-SKEW, 0)], ids=["second-ahead", "first-behind"])
def test_a_skewed_worker_never_takes_a_running_job(skewed: Skewed, first: int, second: int) -> None:
    # The first worker enqueues four jobs under its own clock and runs them (6 s each, longer than
    # the 4 s visibility timeout, so only its heartbeats keep them); then the second one arrives.
    skewed.spawn("worker", "first", first, "--enqueue", "4", "--hold", "6")
    wait_for(lambda: len(skewed.marks("start")) >= 4, timeout=20, message="the first worker to start 4 jobs",
             on_fail=skewed.logs)
    skewed.spawn("worker", "second", second)
    wait_for(lambda: any(w == "second" for _, w, _, _ in skewed.marks("ready")), timeout=20,
             message="the second worker to start", on_fail=skewed.logs)
    wait_for(lambda: len(skewed.marks("end")) >= 4, timeout=20, message="the 4 jobs to end", on_fail=skewed.logs)
    starts = skewed.marks("start")
    assert [w for _, w, _, _ in starts] == ["first"] * 4, skewed.logs()
    assert len({job_id for job_id, _, _, _ in starts}) == 4
    skewed_name = "second" if second else "first"
    assert "X_CLOCK_SKEW" in skewed.log(skewed_name)
    assert f"{SKEW:.1f}s {'ahead of' if second else 'behind'}" in skewed.log(skewed_name)


@pytest.mark.parametrize(("enqueuer", "worker"), [(SKEW, -SKEW), (-SKEW, SKEW)],
                         ids=["enqueuer-ahead", "enqueuer-behind"])
def test_a_delayed_job_starts_at_its_run_at_by_the_database_clock(skewed: Skewed, enqueuer: int,
                                                                   worker: int) -> None:
    skewed.spawn("worker", "worker", worker)
    wait_for(lambda: skewed.marks("ready"), timeout=20, message="the worker to start", on_fail=skewed.logs)
    delay = 3.0
    assert skewed.spawn("enqueue", "enqueuer", enqueuer, "--delay", str(delay)).wait(timeout=30) == 0, skewed.logs()
    start = wait_for(lambda: skewed.marks("start"), timeout=15, message="the delayed job to start",
                     on_fail=skewed.logs)
    enqueued = skewed.marks("enqueued")
    waited = (start[0][2] - enqueued[0][2]).total_seconds()
    # The enqueue mark follows the enqueue by a round trip, so the job was due at most `delay`
    # after it; it must not start early, and must start within a second of being due.
    assert delay - 0.25 <= waited <= delay + 1.0, (waited, skewed.logs())


@pytest.mark.parametrize("offset", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_lease_is_never_held_twice(skewed: Skewed, offset: int) -> None:
    healthy = skewed.spawn("lease", "healthy", 0, "--seconds", "5")
    off = skewed.spawn("lease", "skewed", offset, "--seconds", "5")
    assert healthy.wait(timeout=30) == 0 and off.wait(timeout=30) == 0, skewed.logs()
    holds = skewed.marks("lease")
    assert {w for _, w, _, _ in holds} == {"healthy", "skewed"}, skewed.logs()
    for (_, w1, _, until), (_, w2, at, _) in pairwise(holds):
        assert until is not None and until <= at, f"{w1} still held the lease when {w2} took it\n{skewed.logs()}"
