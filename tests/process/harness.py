"""What the process tests share: worker fleets, an isolated PostgreSQL schema, polling with deadlines.

Nothing here sleeps to make a test pass: :func:`wait_for` polls a condition until a deadline and
fails loudly (with the workers' logs) when it does not hold by then.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.postgres import postgres_schema, postgres_test_url, require_postgres, unavailable, with_params
from ultimat3.drivers.protocol import JOB_STATES, JobDriver

__all__ = ["Fleet", "job_counts", "postgres_schema", "postgres_test_url", "require_postgres", "unavailable",
           "wait_for", "with_params"]

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], T], *, timeout: float, interval: float = 0.05,
             message: str = "condition", on_fail: Callable[[], str] | None = None) -> T:
    """Poll ``condition`` until it returns something truthy (returned) or ``timeout`` passes (fail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = on_fail() if on_fail is not None else ""
            pytest.fail(f"timed out after {timeout:.1f}s waiting for {message}\n{detail}")
        time.sleep(interval)


def job_counts(driver: JobDriver) -> dict[str, int]:
    """Jobs per state over every queue."""
    totals = dict.fromkeys(JOB_STATES, 0)
    for queue in driver.introspect.stats():
        for state, count in queue.counts.items():
            totals[state] += count
    return totals


class Fleet:
    """Worker processes (``tests.process.chaos_worker``), each logging to files under ``root``.

    Use as a context manager: on exit every process still alive is killed and reaped, whatever
    happened in the test.
    """

    def __init__(self, root: Path, url: str, app_db: str, **options: Any) -> None:
        self.root = root
        self.url = url
        self.app_db = app_db
        self.options = options
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.expected_dead: set[str] = set()
        self._started = 0
        self._files: list[Any] = []
        root.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()

    def events_path(self, worker_id: str) -> Path:
        return self.root / f"{worker_id}.events.jsonl"

    def start(self, worker_id: str | None = None, **overrides: Any) -> str:
        """Start one worker process; returns its worker id."""
        self._started += 1
        worker_id = worker_id or f"w{self._started}"
        options = {**self.options, **overrides}
        argv = [sys.executable, "-m", "tests.process.chaos_worker", "--url", self.url, "--app-db", self.app_db,
                "--worker-id", worker_id, "--events", str(self.events_path(worker_id))]
        for key, value in options.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        log = open(self.root / f"{worker_id}.log", "ab")  # noqa: SIM115 - closed in kill_all
        self._files.append(log)
        self.procs[worker_id] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        return worker_id

    def alive(self) -> list[str]:
        """Worker ids whose process is still running."""
        return [wid for wid, proc in self.procs.items() if proc.poll() is None]

    def signal(self, worker_id: str, sig: int) -> None:
        """Send ``sig`` to one worker."""
        proc = self.procs[worker_id]
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def kill(self, worker_id: str) -> None:
        """SIGKILL one worker and reap it."""
        self.expected_dead.add(worker_id)
        self.signal(worker_id, signal.SIGKILL)
        self.procs[worker_id].wait(timeout=10)

    def check_healthy(self) -> None:
        """Fail when a worker exited without being told to."""
        for wid, proc in self.procs.items():
            if wid not in self.expected_dead and proc.poll() is not None:
                pytest.fail(f"worker {wid} exited on its own with {proc.returncode}\n{self.logs()}")

    def started(self, worker_id: str) -> bool:
        """Whether the worker got far enough to handle SIGTERM gracefully (it logged ``started``)."""
        return any(event["kind"] == "started" for event in self.events(worker_id))

    def wait_started(self, timeout: float = 20.0) -> None:
        """Wait until every live worker has started."""
        wait_for(lambda: all(self.started(wid) for wid in self.alive()), timeout=timeout,
                 message="every worker process to start", on_fail=self.logs)

    def stop_all(self, timeout: float = 15.0) -> dict[str, int]:
        """SIGTERM every live worker (once started) and wait for graceful exits; returns their exit codes."""
        self.wait_started()
        running = self.alive()
        for wid in running:
            self.expected_dead.add(wid)
            self.signal(wid, signal.SIGCONT)
            self.signal(wid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        for wid in running:
            proc = self.procs[wid]
            try:
                codes[wid] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[wid] = -999
        return codes

    def kill_all(self) -> None:
        """SIGKILL and reap everything still running; close the log files."""
        for wid, proc in self.procs.items():
            if proc.poll() is None:
                self.expected_dead.add(wid)
                proc.kill()
            proc.wait(timeout=10)
        for file in self._files:
            file.close()
        self._files.clear()

    def events(self, worker_id: str | None = None) -> list[dict[str, Any]]:
        """Every event the worker(s) logged so far."""
        paths = [self.events_path(worker_id)] if worker_id else sorted(self.root.glob("*.events.jsonl"))
        found: list[dict[str, Any]] = []
        for path in paths:
            if path.exists():
                for line in path.read_text(encoding="utf-8").splitlines():
                    if line.strip():
                        try:
                            found.append(json.loads(line))
                        except json.JSONDecodeError:
                            continue  # a line cut short by SIGKILL
        return found

    def logs(self, tail: int = 40) -> str:
        """The last lines of every worker's log, for failure messages."""
        parts = []
        for path in sorted(self.root.glob("*.log")):
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name} ---\n" + "\n".join(lines))
        return "\n".join(parts)
