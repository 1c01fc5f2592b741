"""Exactly-once same-database sweeps: a backfill whose handler increments a counter per row (not
idempotent) through ``batch.connection`` and quarantines every 97th row is SIGKILLed again and again
mid-pass, on SQLite and PostgreSQL; every counter ends at exactly 1, no batch's writes were ever
committed twice, and each quarantined row is stored and counted exactly once."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process import chaos_app
from tests.process.harness import Fleet, postgres_schema
from ultimat3.backfill.cursor import decode_failure_key
from ultimat3.drivers import create_driver
from ultimat3.jobs import isolated_registry

pytestmark = pytest.mark.process

ROWS = 20_000
BATCHES = ROWS // chaos_app.BACKFILL_BATCH
KILLS = 4
CAP_SECONDS = 90.0


def run_exactly_once(backend: str, url: str, root: Path) -> None:
    app = chaos_app.AppDb(url)
    app.create_tables()
    with app.transaction() as cur:
        cur.executemany("INSERT INTO bf_items (id) VALUES (?)", [(i,) for i in range(1, ROWS + 1)])
    driver = create_driver(url)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    try:
        with isolated_registry():
            queued = chaos_app.declare()["chaos.exact"].enqueue(driver=driver)
        started = time.monotonic()
        kills = 0
        watched: tuple[str | None, int] = (None, 0)
        base = due = 0
        with Fleet(root, url, url, names="chaos.exact", concurrency=1, visibility=2.0, heartbeat=0.25, poll=0.1,
                   grace=2.0) as fleet:
            fleet.start()
            fleet.start()
            while True:
                row = driver.introspect.get(queued.id)
                assert row is not None
                if row.state in ("done", "dead", "cancelled"):
                    break
                if time.monotonic() - started > CAP_SECONDS:
                    pytest.fail(f"[exact {backend}] not finished after {CAP_SECONDS}s (kills={kills}, seed={seed}): "
                                f"{row}\n{fleet.logs()}")
                fleet.check_healthy()
                batches = len(driver.steps.load(queued.run_id))
                holder = row.claimed_by if row.state == "running" else None
                if kills < KILLS and holder in fleet.alive():
                    if (holder, row.attempt) != watched:
                        watched, base, due = (holder, row.attempt), batches, rng.randint(2, 6)
                    elif batches >= base + due:
                        assert holder is not None
                        fleet.kill(holder)
                        fleet.start()
                        kills += 1
                time.sleep(0.02)
            codes = fleet.stop_all()
            assert all(code == 0 for code in codes.values()), f"{codes}\n{fleet.logs()}"
        job = driver.introspect.get(queued.id)
        runs = driver.backfills.list("chaos.exact")
        quarantined = driver.backfills.failures("chaos.exact", limit=ROWS)
    finally:
        driver.close()
    counted, low, high = app.rows("SELECT count(*), min(n), max(n) FROM bf_exact")[0]
    committed_batches = app.scalar("SELECT count(*) FROM bf_exact_batches")
    app.close()
    print(f"[exact {backend}] rows={ROWS} batches={BATCHES} kills={kills} committed_batches={committed_batches} "
          f"max_n={high} seed={seed}")
    assert job is not None and job.state == "done", job and job.last_error
    assert kills == KILLS, f"only {kills} kills landed mid-pass"
    refused = ROWS // chaos_app.QUARANTINE_EVERY
    assert (counted, low, high) == (ROWS - refused, 1, 1), "every handled row's counter is exactly 1"
    assert committed_batches == BATCHES, "no batch's writes committed twice: zero replays after the kills"
    assert len(runs) == 1 and runs[0].status == "completed" and runs[0].rows == ROWS
    # The quarantine commits with the batch: every refused row stored once, counted once.
    assert sorted(decode_failure_key(f.key) for f in quarantined) == [
        i for i in range(1, ROWS + 1) if i % chaos_app.QUARANTINE_EVERY == 0]
    assert runs[0].failures == refused


def test_exactly_once_on_sqlite_under_kills(tmp_path: Path) -> None:
    run_exactly_once("sqlite", f"sqlite:///{tmp_path / 'x.db'}", tmp_path / "fleet")


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_schema("x_bfexact") as url:
        yield url


@pytest.mark.postgres
def test_exactly_once_on_postgres_under_kills(pg_url: str, tmp_path: Path) -> None:
    run_exactly_once("postgres", pg_url, tmp_path / "fleet")
