"""Backfills over 10,000+ row app tables on the real drivers: a SQLite file (the app table in the
driver's own file, through the default engine) and PostgreSQL (a database created per test from
``X_TEST_DATABASE_URL``). PostgreSQL unreachable, or a driver not built yet: skipped locally,
failed when ``CI=true``."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from tests.postgres import postgres_database

from ultimat3.backfill import BackfillInput, Batch, backfill, dispose_engines, engine_for_url
from ultimat3.core import Ctx
from ultimat3.drivers import create_driver
from ultimat3.jobs import JobDriver, JobHandle, RetryPolicy, SyncStep, Worker, isolated_registry, job
from ultimat3.tenancy import scoped, tenanted

ROWS = 10_500
RETRY_NOW = RetryPolicy(max_attempts=3, base=0, jitter=0)

metadata = sa.MetaData()
items = tenanted(sa.Table(
    "bf_items", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("org_id", sa.String(20), nullable=False),
    sa.Column("done", sa.Boolean, nullable=False),
))


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh database on the test server, dropped afterwards (no clash with other suites)."""
    with postgres_database("x_backfill") as url:
        try:
            yield url
        finally:
            dispose_engines()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobDriver]:
    sqlite = request.param == "sqlite"
    url = f"sqlite:///{tmp_path / 'x.db'}" if sqlite else str(request.getfixturevalue("postgres_url"))
    with isolated_registry():
        built = create_driver(url)
        try:
            yield built
        finally:
            built.close()
            dispose_engines()


@pytest.fixture
def engine(driver: JobDriver) -> Engine:
    """The app engine the backfills default to: the driver's own database."""
    built = engine_for_url(driver.url)
    metadata.create_all(built)
    with built.begin() as conn:
        conn.execute(items.insert(), [
            {"id": i, "org_id": "org-a" if i % 2 else "org-b", "done": False} for i in range(1, ROWS + 1)
        ])
    return built


class Sweep:
    """Marks each handled row done (an idempotent write) and counts how often each was handled."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: Counter[int] = Counter()
        self.orgs: set[str] = set()
        self.fail_at: int | None = None

    def handle(self, batch: Batch) -> None:
        ids = [row.id for row in batch.rows]
        self.seen.update(ids)
        self.orgs.update(row.org_id for row in batch.rows)
        if batch.index == self.fail_at:
            self.fail_at = None
            raise RuntimeError(f"batch {batch.index} failed once")
        with self.engine.begin() as conn:
            conn.execute(items.update().where(items.c.id.in_(ids)).values(done=True))

    def declare(self, name: str = "items.sweep", **fields: Any) -> JobHandle[BackfillInput]:
        spec: dict[str, Any] = {
            "name": name,
            "tenant": "none",
            "source": lambda ctx: sa.select(items).where(items.c.done.is_(False)),
            "handle": self.handle,
            "count": lambda ctx: sa.select(items.c.id).where(items.c.done.is_(False)),
            "rate": 500,
            "retry": RETRY_NOW,
            "engine": "job-store",
        }
        spec.update(fields)
        return backfill(**spec)


def drain(driver: JobDriver) -> None:
    worker = Worker(driver, environment="test", concurrency=1)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()


def remaining(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).where(items.c.done.is_(False))).scalar_one())


def test_a_large_table_is_swept_once_in_key_order(driver: JobDriver, engine: Engine) -> None:
    sweep = Sweep(engine)
    queued = sweep.declare().enqueue(driver=driver)
    drain(driver)
    job_row = driver.introspect.get(queued.id)
    assert job_row is not None and job_row.state == "done", job_row and job_row.last_error
    assert job_row.result == {"name": "items.sweep", "batches": 11, "rows": ROWS, "skipped": False,
                              "previous_run_id": None, "failures": 0, "kind": "pass"}
    assert remaining(engine) == 0
    assert set(sweep.seen) == set(range(1, ROWS + 1)) and max(sweep.seen.values()) == 1
    steps = driver.steps.load(queued.run_id)
    assert sorted(steps, key=lambda s: int(s.split(":")[1])) == [f"batch:{i}" for i in range(11)]
    assert steps["batch:10"].result == {"cursor": ROWS, "rows": 500}
    runs = driver.backfills.list("items.sweep")
    assert len(runs) == 1
    assert (runs[0].status, runs[0].batches, runs[0].rows, runs[0].job_id) == ("completed", 11, ROWS, queued.id)


def test_a_failed_batch_resumes_from_the_recorded_cursor(driver: JobDriver, engine: Engine) -> None:
    sweep = Sweep(engine)
    sweep.fail_at = 4
    queued = sweep.declare().enqueue(driver=driver)
    drain(driver)
    job_row = driver.introspect.get(queued.id)
    assert job_row is not None and job_row.state == "done" and job_row.attempt == 2
    assert remaining(engine) == 0, "no row skipped"
    twice = sorted(i for i, n in sweep.seen.items() if n == 2)
    assert twice == list(range(4001, 5001)), "only the failed batch was handled twice"
    assert max(sweep.seen.values()) == 2
    runs = driver.backfills.list("items.sweep")
    assert len(runs) == 1 and runs[0].status == "completed" and runs[0].rows == ROWS


def test_skip_then_force_writes_a_second_ledger_row(driver: JobDriver, engine: Engine) -> None:
    sweep = Sweep(engine)
    declared = sweep.declare(count=None, source=lambda ctx: sa.select(items).where(items.c.id <= 2000))
    first = declared.enqueue(driver=driver)
    drain(driver)
    second = declared.enqueue(driver=driver)
    drain(driver)
    second_row = driver.introspect.get(second.id)
    assert second_row is not None and second_row.result["skipped"] is True
    assert second_row.result["previous_run_id"] == first.run_id
    forced = declared.enqueue({"force": True}, driver=driver)
    drain(driver)
    runs = driver.backfills.list("items.sweep")
    assert {r.run_id for r in runs} == {first.run_id, forced.run_id}
    assert all(r.status == "completed" and r.rows == 2000 for r in runs)
    assert max(sweep.seen.values()) == 2 and len(sweep.seen) == 2000


def test_tenancy_on_a_real_database(driver: JobDriver, engine: Engine) -> None:
    one_org = Sweep(engine)
    every_org = Sweep(engine)
    source = lambda ctx: sa.select(items)  # noqa: E731 - the same source for both sweeps
    a = one_org.declare(name="items.org_a", tenant=lambda _input: "org-a", source=source, count=None)
    b = every_org.declare(name="items.all", source=source, count=None)

    @job(name="items.plain", tenant="none")
    def plain(input: Any, ctx: Ctx, step: SyncStep) -> int:
        with engine.connect() as conn:
            return len(conn.execute(scoped(sa.select(items))).all())

    results = [h.enqueue(driver=driver) for h in (a, b, plain)]
    drain(driver)
    rows = [driver.introspect.get(r.id) for r in results]
    assert rows[0] is not None and rows[0].result["rows"] == ROWS // 2
    assert one_org.orgs == {"org-a"}
    assert rows[1] is not None and rows[1].result["rows"] == ROWS
    assert every_org.orgs == {"org-a", "org-b"}
    assert rows[2] is not None and rows[2].state == "dead"
    assert "X_TENANCY_CROSS_DENIED" in (rows[2].last_error or "")


def test_requires_reads_the_drivers_migration_ledger(driver: JobDriver, engine: Engine) -> None:
    sweep = Sweep(engine)
    queued = sweep.declare(requires="app:0007_done_flag").enqueue(driver=driver)
    drain(driver)
    job_row = driver.introspect.get(queued.id)
    assert job_row is not None and job_row.state == "dead" and "X_BACKFILL_REQUIRES" in (job_row.last_error or "")
    assert driver.backfills.list() == []
    driver.migrations.mark_applied("app:0007_done_flag")
    driver.retry(queued.id)
    drain(driver)
    job_row = driver.introspect.get(queued.id)
    assert job_row is not None and job_row.state == "done"
    assert remaining(engine) == 0
