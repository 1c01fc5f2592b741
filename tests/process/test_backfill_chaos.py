"""Chaos for a backfill: the worker running a 50,000-row pass is SIGKILLed again and again.

Each kill lands after the attempt has made some progress of its own; the run comes back when its
claim lapses, a live worker resumes it from the last recorded batch, and at the end: every row was
handled, the ledger holds ONE row for the pass (completed), and the batches handled in total are at
most the pass's batches plus one per kill (only the batch in flight when a worker died can run twice).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process import chaos_app
from tests.process.harness import Fleet, postgres_schema
from ultimat3.drivers import create_driver
from ultimat3.jobs import isolated_registry

pytestmark = pytest.mark.process

ROWS = 50_000
BATCHES = ROWS // chaos_app.BACKFILL_BATCH
KILLS = 5
CAP_SECONDS = 90.0


def run_backfill_chaos(backend: str, url: str, root: Path) -> None:
    app = chaos_app.AppDb(url)  # the backfill reads bf_items from the job database (its default engine)
    app.create_tables()
    with app.transaction() as cur:
        cur.executemany("INSERT INTO bf_items (id) VALUES (?)", [(i,) for i in range(1, ROWS + 1)])
    driver = create_driver(url)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    try:
        with isolated_registry():
            queued = chaos_app.declare()["chaos.sweep"].enqueue(driver=driver)
        started = time.monotonic()
        kills = 0
        watched: tuple[str | None, int] = (None, 0)
        base = due = 0
        with Fleet(root, url, url, names="chaos.sweep", concurrency=1, visibility=2.0, heartbeat=0.25, poll=0.1,
                   grace=2.0) as fleet:
            fleet.start()
            fleet.start()
            while True:
                row = driver.introspect.get(queued.id)
                assert row is not None
                if row.state in ("done", "dead", "cancelled"):
                    break
                if time.monotonic() - started > CAP_SECONDS:
                    pytest.fail(f"[backfill {backend}] not finished after {CAP_SECONDS}s (kills={kills}, "
                                f"seed={seed}): {row}\n{fleet.logs()}")
                fleet.check_healthy()
                # The recorded batch steps are the durable progress (the ledger's counters are
                # only refreshed about once a second).
                batches = len(driver.steps.load(queued.run_id))
                holder = row.claimed_by if row.state == "running" else None
                if kills < KILLS and holder in fleet.alive():
                    if (holder, row.attempt) != watched:
                        # A new attempt: let it make a few batches of progress of its own, then kill it.
                        watched, base, due = (holder, row.attempt), batches, rng.randint(2, 8)
                    elif batches >= base + due:
                        assert holder is not None
                        fleet.kill(holder)
                        fleet.start()
                        kills += 1
                time.sleep(0.02)  # the controller's tick
            elapsed = time.monotonic() - started
            codes = fleet.stop_all()
            assert all(code == 0 for code in codes.values()), f"{codes}\n{fleet.logs()}"
        job = driver.introspect.get(queued.id)
        runs = driver.backfills.list("chaos.sweep")
        steps = driver.steps.load(queued.run_id)
    finally:
        driver.close()
    handled, low, high = app.rows("SELECT count(*), min(n), max(n) FROM bf_handled")[0]
    handled_batches = app.scalar("SELECT count(*) FROM bf_batches")
    distinct_batches = app.scalar("SELECT count(DISTINCT idx) FROM bf_batches")
    app.close()
    assert job is not None
    print(f"[backfill {backend}] rows={ROWS} batches={BATCHES} kills={kills} attempts={job.attempt} "
          f"handled_batches={handled_batches} (bound {BATCHES + kills}) rows_handled_twice_max={high} "
          f"ledger_rows={len(runs)} elapsed={elapsed:.1f}s seed={seed}")

    assert job.state == "done", job.last_error
    assert job.result == {"name": "chaos.sweep", "batches": BATCHES, "rows": ROWS, "skipped": False,
                          "previous_run_id": None, "failures": 0, "kind": "pass"}
    assert kills == KILLS, f"only {kills} kills landed mid-pass"
    assert job.attempt >= kills + 1, "each kill's run was re-claimed"
    assert (handled, low) == (ROWS, 1), "every row handled"
    assert high <= 2
    assert len(runs) == 1, runs
    assert (runs[0].run_id, runs[0].status, runs[0].batches, runs[0].rows) == (queued.run_id, "completed", BATCHES,
                                                                             ROWS)
    assert sorted(steps) == sorted(f"batch:{i}" for i in range(BATCHES))
    assert distinct_batches == BATCHES
    assert BATCHES <= handled_batches <= BATCHES + kills, "resumed from the last checkpoint after each kill"


def test_backfill_sqlite_survives_kills(tmp_path: Path) -> None:
    run_backfill_chaos("sqlite", f"sqlite:///{tmp_path / 'x.db'}", tmp_path / "fleet")


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_schema("x_bfchaos") as url:
        yield url


@pytest.mark.postgres
def test_backfill_postgres_survives_kills(pg_url: str, tmp_path: Path) -> None:
    run_backfill_chaos("postgres", pg_url, tmp_path / "fleet")
