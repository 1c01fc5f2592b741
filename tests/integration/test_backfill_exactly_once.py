"""A same-database pass (``engine="job-store"``) hands the handler ``batch.connection``: its writes
and the batch's checkpoint commit in one transaction. A batch that fails after writing leaves no
write behind, so a non-idempotent handler still counts each row exactly once (SQLite, PostgreSQL);
the process-level proof under SIGKILL is tests/process/test_backfill_exactly_once.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.postgres import postgres_database

from ultimat3.backfill import Batch, add_progress_listener, backfill, dispose_engines, engine_for_url
from ultimat3.core.errors import XError
from ultimat3.drivers import create_driver
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import JobDriver, RetryPolicy, Worker, isolated_registry

ROWS = 37


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobDriver]:
    if request.param == "sqlite":
        url, context = f"sqlite:///{tmp_path / 'x.db'}", None
    else:
        context = postgres_database("x_bfexact")
        url = context.__enter__()
    with isolated_registry():
        built = create_driver(url)
        try:
            yield built
        finally:
            built.close()
            dispose_engines()
            if context is not None:
                context.__exit__(None, None, None)


def test_a_failed_batch_leaves_none_of_its_writes_and_each_row_counts_once(driver: JobDriver) -> None:
    metadata = sa.MetaData()
    rows = sa.Table("ex_rows", metadata, sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
                    sa.Column("n", sa.Integer, nullable=False))
    engine = engine_for_url(driver.url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(rows.insert(), [{"id": i, "n": 0} for i in range(1, ROWS + 1)])
    failures = {"left": 1}
    seen: list[Any] = []

    def handle(batch: Batch) -> None:
        assert batch.connection is not None
        seen.append(batch.connection)
        batch.connection.execute(rows.update().where(rows.c.id.in_([r.id for r in batch.rows]))
                                 .values(n=rows.c.n + 1))  # not idempotent
        if batch.index == 2 and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("after writing, before the checkpoint")

    handle_ = backfill(name="exact.count", tenant="none", source=lambda ctx: sa.select(rows.c.id), handle=handle,
                       engine="job-store", batch=5, rate=1000, retry=RetryPolicy(max_attempts=3, base=0, jitter=0))
    queued = handle_.enqueue(driver=driver)
    worker = Worker(driver, environment="test", concurrency=1)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()
    job = driver.introspect.get(queued.id)
    assert job is not None and job.state == "done" and job.attempt == 2, job and job.last_error
    with engine.connect() as conn:
        counts = [n for (n,) in conn.execute(sa.select(rows.c.n))]
    assert counts == [1] * ROWS
    assert len(seen) == 9  # 8 batches, the failed one twice (its first transaction rolled back)


def test_a_pass_over_another_engine_has_no_connection_to_join(tmp_path: Path) -> None:
    other = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    metadata = sa.MetaData()
    items = sa.Table("items", metadata, sa.Column("id", sa.Integer, primary_key=True))
    metadata.create_all(other)
    with other.begin() as conn:
        conn.execute(items.insert(), [{"id": 1}, {"id": 2}])
    connections: list[Any] = []
    with isolated_registry():
        driver = create_driver(f"sqlite:///{tmp_path / 'x.db'}")
        try:
            handle_ = backfill(name="other.db", tenant="none", source=lambda ctx: sa.select(items), engine=other,
                               handle=lambda batch: connections.append(batch.connection), rate=1000)
            handle_.enqueue(driver=driver)
            worker = Worker(driver, environment="test", concurrency=1)
            try:
                asyncio.run(worker.drain())
            finally:
                worker.close()
        finally:
            driver.close()
            other.dispose()
    assert connections == [None]


def test_the_memory_driver_refuses_to_record_a_step_in_a_connection() -> None:
    driver = MemoryDriver()
    try:
        with pytest.raises(XError) as refused:
            driver.steps.record("j", "t", "s", 1, connection=object())
        assert refused.value.code == "X_DRIVER_CONNECTION"
    finally:
        driver.close()


@pytest.mark.postgres
def test_a_pass_whose_connection_died_between_batches_reads_again_on_a_new_one() -> None:
    """The pass holds one connection from batch to batch; a server that dropped it meanwhile (a
    restart, an idle-session kill) costs the next read one reconnect, not the attempt."""
    with postgres_database("x_bfheld") as url, isolated_registry():
        driver = create_driver(url)
        try:
            metadata = sa.MetaData()
            rows = sa.Table("held_rows", metadata,
                            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
                            sa.Column("n", sa.Integer, nullable=False))
            engine = engine_for_url(driver.url)
            metadata.create_all(engine)
            with engine.begin() as conn:
                conn.execute(rows.insert(), [{"id": i, "n": 0} for i in range(1, ROWS + 1)])
            pids: list[int] = []

            def handle(batch: Batch) -> None:
                assert batch.connection is not None
                pids.append(batch.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
                batch.connection.execute(rows.update().where(rows.c.id.in_([r.id for r in batch.rows]))
                                         .values(n=rows.c.n + 1))

            def kill_after_batch_two(progress: Any) -> None:
                if progress.batches == 2 and not progress.replayed:
                    with engine.connect() as other:
                        other.exec_driver_sql(f"SELECT pg_terminate_backend({pids[-1]})")

            remove = add_progress_listener(kill_after_batch_two)
            handle_ = backfill(name="held.count", tenant="none", source=lambda ctx: sa.select(rows.c.id),
                               handle=handle, engine="job-store", batch=5, rate=1000,
                               retry=RetryPolicy(max_attempts=1))
            queued = handle_.enqueue(driver=driver)
            worker = Worker(driver, environment="test", concurrency=1)
            try:
                asyncio.run(worker.drain())
            finally:
                worker.close()
                remove()
            job = driver.introspect.get(queued.id)
            assert job is not None and job.state == "done" and job.attempt == 1, job and job.last_error
            with engine.connect() as conn:
                assert [n for (n,) in conn.execute(sa.select(rows.c.n))] == [1] * ROWS
            # One connection for batches 1-2, another (the replacement) for the rest.
            assert len(set(pids[:2])) == 1 and len(set(pids[2:])) == 1 and pids[1] != pids[2]
        finally:
            driver.close()
            dispose_engines()
