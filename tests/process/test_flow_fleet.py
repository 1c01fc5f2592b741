"""Flow control across real worker processes, on SQLite and PostgreSQL.

- Four one-slot workers drain a backlog under a per-key limit of 2 (so a key at its limit is held
  by two processes at once): a sampler reading the job store every few milliseconds sees 2 and
  never more running under a key, and the handlers' own start/finish marks never overlap more
  than 2 deep per key.
- A SIGKILLed worker holding a key's only slot gives it back: the live worker starts that key's
  next job within the rescue bound, and the key still never runs two at once.
- A fleet-wide rate of 20 starts/s (burst 2): in every window the starts stay within the bucket.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from tests.process import chaos_app
from tests.process.backends import Backend
from tests.process.harness import Fleet, job_counts, wait_for
from ultimat3.jobs import isolated_registry

pytestmark = pytest.mark.process

#: A killed holder's slot is back (its job rescued, the next one started) within this many seconds.
RESCUE_BOUND = 3.0
#: Handler marks are taken after the claim, in different processes: allow this much jitter.
SLACK = 0.15


class Sampler:
    """Reads running counts per concurrency key from the job store until stopped; keeps the peak."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.peak: dict[str, int] = defaultdict(int)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, count in self._counts():
                self.peak[key] = max(self.peak[key], count)
            self.samples += 1
            self._stop.wait(0.005)

    def _counts(self) -> list[tuple[str, int]]:
        statement = ("SELECT flow_key, count(*) FROM x_jobs WHERE state = 'running' AND flow_key IS NOT NULL "
                     "GROUP BY flow_key")
        if self.backend.kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.backend.url.removeprefix("sqlite:///"), timeout=30)
            try:
                return [(k, n) for k, n in conn.execute(statement).fetchall()]
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.backend.url, autocommit=True) as conn:
            return [(k, n) for k, n in conn.execute(statement).fetchall()]


def intervals(backend: Backend, count: int) -> dict[int, list[tuple[float, float | None, str]]]:
    """Per job n: its attempts as (start, finish or None, worker)."""
    found: dict[int, list[tuple[float, float | None, str]]] = {}
    for n in range(count):
        marks = backend.marks(f"flow-{n}")
        runs: list[tuple[float, float | None, str]] = []
        for kind, worker, _attempt, at in marks:
            if kind == "start":
                runs.append((at, None, worker))
            elif kind == "finish" and runs:
                start, _, who = runs[-1]
                runs[-1] = (start, at, who)
        found[n] = runs
    return found


def deepest_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (a finish at t closes before a start at t opens)."""
    events = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans], key=lambda e: (e[0], e[1]))
    depth = peak = 0
    for _, delta in events:
        depth += delta
        peak = max(peak, depth)
    return peak


def test_four_workers_never_run_more_than_the_limit_per_key(backend: Backend) -> None:
    jobs = 48
    keys = ("acme", "globex")
    with isolated_registry():
        limited = chaos_app.declare()["chaos.limited"]
        limited.enqueue_many([{"n": n, "key": keys[n % 2], "work_ms": 60} for n in range(jobs)],
                             driver=backend.driver)
    with Sampler(backend) as sampler, Fleet(backend.root, backend.url, backend.app_url, names="chaos.limited",
                                            concurrency=1, poll=0.2, visibility=10.0, heartbeat=1.0) as fleet:
        for name in ("A", "B", "C", "D"):
            fleet.start(name)
        wait_for(lambda: job_counts(backend.driver)["done"] == jobs, timeout=90, message="every job done",
                 on_fail=fleet.logs)
        fleet.check_healthy()
        fleet.stop_all()
    assert sampler.samples > 20
    assert dict(sampler.peak) == {f"chaos.limited|{k}": chaos_app.LIMIT for k in keys}, dict(sampler.peak)
    runs = intervals(backend, jobs)
    assert all(len(r) == 1 and r[0][1] is not None for r in runs.values())  # each ran once, to the end
    for index, key in enumerate(keys):
        spans = [(r[0][0], r[0][1]) for n, r in runs.items() if n % 2 == index and r[0][1] is not None]
        assert deepest_overlap([(s + SLACK, f) for s, f in spans]) <= chaos_app.LIMIT, key
    workers = {r[0][2] for r in runs.values()}
    assert len(workers) >= 2, workers  # one-slot workers: a key at 2 was held by two processes
    print(f"[flow {backend.kind}] peak running per key {dict(sampler.peak)} over {sampler.samples} samples; "
          f"workers used: {sorted(workers)}")


def test_a_killed_holders_slot_comes_back(backend: Backend) -> None:
    with isolated_registry():
        limited = chaos_app.declare()["chaos.limited"]
        holder = limited.enqueue({"n": 0, "key": "solo", "block": True}, driver=backend.driver)
        # The same key's others, behind the holder; max is 2, so a second holder runs beside it.
        others = [limited.enqueue({"n": n, "key": "solo", "block": n == 1, "work_ms": 20}, driver=backend.driver)
                  for n in range(1, 6)]
    with Sampler(backend) as sampler, Fleet(backend.root, backend.url, backend.app_url, names="chaos.limited",
                                            concurrency=4, poll=0.2, visibility=30.0, heartbeat=1.0) as fleet:
        fleet.start("A")
        wait_for(lambda: len(backend.marks("flow-0")) == 1 and len(backend.marks("flow-1")) == 1, timeout=30,
                 message="A to hold both slots", on_fail=fleet.logs)
        fleet.start("B")
        wait_for(lambda: {w.id for w in backend.driver.workers.list()} == {"A", "B"}, timeout=30,
                 message="both workers to register", on_fail=fleet.logs)
        time.sleep(1.0)  # B polls a full key: it must start nothing while A holds both slots
        assert all(len(backend.marks(f"flow-{n}")) == 0 for n in range(2, 6))
        if backend.kind == "postgres":
            from tests.process.test_rescue import _session_age

            wait_for(lambda: _session_age(backend.url, "B") > 3.2, timeout=30, message="B's session to settle")
        killed_at = time.time()
        fleet.kill("A")
        wait_for(lambda: job_counts(backend.driver)["done"] == 6, timeout=60, message="every job done",
                 on_fail=fleet.logs)
        fleet.check_healthy()
        fleet.stop_all()
    runs = intervals(backend, 6)
    restarted = min(start for n in range(6) for start, _, who in runs[n] if who == "B")
    assert restarted - killed_at < RESCUE_BOUND, restarted - killed_at
    spans = [(s, f) for n in range(6) for s, f, _ in runs[n] if f is not None]
    assert deepest_overlap([(s + SLACK, f) for s, f in spans]) <= chaos_app.LIMIT
    assert sampler.peak["chaos.limited|solo"] == chaos_app.LIMIT
    for result in [holder, *others]:
        row = backend.driver.introspect.get(result.id)
        assert row is not None and row.state == "done"
    print(f"[flow {backend.kind}] slot back {restarted - killed_at:.3f}s after SIGKILL (bound {RESCUE_BOUND}s)")


def test_a_fleet_rate_keeps_every_window_within_the_bucket(backend: Backend) -> None:
    jobs = 40
    with isolated_registry():
        rated = chaos_app.declare()["chaos.rated"]
        rated.enqueue_many([{"n": n, "work_ms": 0} for n in range(jobs)], driver=backend.driver)
    with Fleet(backend.root, backend.url, backend.app_url, names="chaos.rated", concurrency=4, poll=1.0,
               visibility=10.0, heartbeat=1.0) as fleet:
        for name in ("A", "B", "C", "D"):
            fleet.start(name)
        wait_for(lambda: job_counts(backend.driver)["done"] == jobs, timeout=60, message="every job done",
                 on_fail=fleet.logs)
        fleet.check_healthy()
        fleet.stop_all()
    starts = sorted(start for r in intervals(backend, jobs).values() for start, _, _ in r)
    assert len(starts) == jobs
    worst: Any = 0.0
    for i in range(len(starts)):
        for j in range(i + 1, len(starts)):
            allowed = chaos_app.BURST + chaos_app.RATE * (starts[j] - starts[i] + SLACK)
            worst = max(worst, (j - i + 1) / allowed)
            assert j - i + 1 <= allowed, (i, j, starts[j] - starts[i])
    elapsed = starts[-1] - starts[0]
    # 40 starts at 20/s after a burst of 2 take about 1.9 s: the rate was used, not just respected.
    assert elapsed >= (jobs - chaos_app.BURST) / chaos_app.RATE - SLACK, elapsed
    assert elapsed < 6.0, elapsed  # the token hint wakes the workers: far faster than one start per poll
    print(f"[flow {backend.kind}] {jobs} starts in {elapsed:.2f}s at {chaos_app.RATE:g}/s, fullest window "
          f"{worst:.0%} of the bucket")
