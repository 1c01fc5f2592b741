"""Chaos: worker processes SIGKILLed mid-drain lose nothing, and replay no more than the kills explain.

Four worker processes drain 5,000 jobs while a controller SIGKILLs a random one every ~0.5 s and
starts a replacement. Each execution writes its effect (UNIQUE) and an attempt row in one app
transaction. At the end every job is ``done``, every effect is there exactly once, nothing is
``dead``, and the executions replayed after their effect had committed (attempt rows minus jobs)
number at most ``kills x concurrency``: only the attempts in flight in a killed worker can run twice.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.process import chaos_app
from tests.process.harness import Fleet, job_counts, postgres_schema
from ultimat3.drivers import create_driver
from ultimat3.jobs import isolated_registry

pytestmark = pytest.mark.process

JOBS = 5_000
WORKERS = 4
CONCURRENCY = 4
VISIBILITY = 3.0  # a killed worker's jobs come back this soon
HEARTBEAT = 0.3
KILL_EVERY = 0.5  # mean seconds between kills (uniform 0.3..0.7)
MAX_KILLS = 60  # bounded: after this many the fleet is left to finish
CAP_SECONDS = 90.0  # the whole drain stops by itself


@dataclass
class Figures:
    backend: str
    jobs: int
    kills: int
    executions: int
    replays: int
    fenced: int
    elapsed: float
    seed: int

    def __str__(self) -> str:
        return (f"[chaos {self.backend}] jobs={self.jobs} kills={self.kills} executions={self.executions} "
                f"replays={self.replays} (bound {self.kills * CONCURRENCY}) fenced_acks={self.fenced} "
                f"elapsed={self.elapsed:.1f}s seed={self.seed}")


def enqueue_jobs(url: str) -> None:
    driver = create_driver(url)
    try:
        with isolated_registry():
            effect = chaos_app.declare()["chaos.effect"]
            for start in range(0, JOBS, 1_000):
                effect.enqueue_many([{"n": n, "work_ms": 5} for n in range(start, start + 1_000)], driver=driver)
    finally:
        driver.close()


def run_chaos(backend: str, url: str, app_url: str, root: Path) -> Figures:
    app = chaos_app.AppDb(app_url)
    app.create_tables()
    enqueue_jobs(url)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    driver = create_driver(url, migrate=False)
    kills = 0
    started = time.monotonic()
    try:
        with Fleet(root, url, app_url, concurrency=CONCURRENCY, visibility=VISIBILITY, heartbeat=HEARTBEAT,
                   poll=0.2, grace=2.0) as fleet:
            for _ in range(WORKERS):
                fleet.start()
            next_kill = time.monotonic() + KILL_EVERY
            while True:
                counts = job_counts(driver)
                if counts["done"] + counts["dead"] + counts["cancelled"] >= JOBS:
                    break
                elapsed = time.monotonic() - started
                if elapsed > CAP_SECONDS:
                    pytest.fail(f"[chaos {backend}] not drained after {elapsed:.0f}s (kills={kills}, seed={seed}): "
                                f"{counts}\n{fleet.logs()}")
                fleet.check_healthy()
                now = time.monotonic()
                if now >= next_kill and kills < MAX_KILLS:
                    fleet.kill(rng.choice(fleet.alive()))
                    fleet.start()
                    kills += 1
                    next_kill = now + rng.uniform(0.6, 1.4) * KILL_EVERY
                time.sleep(0.05)  # the controller's tick, not a wait for a result
            elapsed = time.monotonic() - started
            codes = fleet.stop_all()
            fenced = sum(1 for event in fleet.events() if event["kind"] == "fenced")
            assert all(code == 0 for code in codes.values()), f"graceful stop failed: {codes}\n{fleet.logs()}"
        counts = job_counts(driver)
    finally:
        driver.close()

    effects = app.scalar("SELECT count(*) FROM chaos_effects")
    distinct = app.scalar("SELECT count(DISTINCT n) FROM chaos_effects")
    low, high = app.rows("SELECT min(n), max(n) FROM chaos_effects")[0]
    executions = app.scalar("SELECT count(*) FROM chaos_attempts")
    executed = app.scalar("SELECT count(DISTINCT n) FROM chaos_attempts")
    app.close()
    figures = Figures(backend, JOBS, kills, executions, executions - JOBS, fenced, elapsed, seed)
    print(figures)

    assert counts["done"] == JOBS, f"{figures}: {counts}"
    assert counts["dead"] == 0 and counts["cancelled"] == 0, f"{figures}: {counts}"
    assert (effects, distinct, low, high) == (JOBS, JOBS, 0, JOBS - 1), f"{figures}: effects lost or doubled"
    assert executed == JOBS
    assert kills >= 5, f"{figures}: too few kills to prove anything"
    assert 0 <= figures.replays <= kills * CONCURRENCY, f"{figures}: more replays than the kills explain"
    return figures


@pytest.fixture
def sqlite_urls(tmp_path: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / 'x.db'}", f"sqlite:///{tmp_path / 'app.db'}"


def test_chaos_sqlite_kills_lose_nothing(sqlite_urls: tuple[str, str], tmp_path: Path) -> None:
    url, app_url = sqlite_urls
    run_chaos("sqlite", url, app_url, tmp_path / "fleet")


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_schema("x_chaos") as url:
        yield url


@pytest.mark.postgres
def test_chaos_postgres_kills_lose_nothing(pg_url: str, tmp_path: Path) -> None:
    run_chaos("postgres", pg_url, pg_url, tmp_path / "fleet")
