"""The database-health throttle against a real PostgreSQL: an idle-in-transaction session holds the
pass (the reason in the ledger and in progress), closing it lets the pass go on; a session waiting
for a lock on the swept table does the same; a role that cannot see other sessions refuses coded
instead of sweeping blind. Real time, short limits: each wait is a fraction of a second."""

from __future__ import annotations

import contextvars
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from tests.postgres import postgres_database

from ultimat3.backfill import BackfillProgress, Batch, add_progress_listener, backfill, dispose_engines, health
from ultimat3.backfill import run_backfill as run_pass_here
from ultimat3.core.errors import XError
from ultimat3.drivers import create_driver
from ultimat3.jobs import JobDriver, RetryPolicy, isolated_registry

pytestmark = pytest.mark.postgres

ROWS = 40
metadata = sa.MetaData()
ledger_rows = sa.Table("hl_rows", metadata, sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
                       sa.Column("n", sa.Integer, nullable=False))


@pytest.fixture
def url() -> Iterator[str]:
    with postgres_database("x_bfhealth") as database, isolated_registry():
        engine = sa.create_engine(database.replace("postgresql://", "postgresql+psycopg://", 1))
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(ledger_rows.insert(), [{"id": i, "n": 0} for i in range(1, ROWS + 1)])
        engine.dispose()
        try:
            yield database
        finally:
            dispose_engines()


@pytest.fixture
def driver(url: str) -> Iterator[JobDriver]:
    built = create_driver(url)
    try:
        yield built
    finally:
        built.close()


def _handle(batch: Batch) -> None:
    assert batch.connection is not None
    batch.connection.execute(ledger_rows.update().where(ledger_rows.c.id.in_([r.id for r in batch.rows]))
                             .values(n=ledger_rows.c.n + 1))


def _in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    context = contextvars.copy_context()  # the test's actor (an operator) goes with the pass

    def target() -> None:
        try:
            out["value"] = context.run(fn)
        except BaseException as error:
            out["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def _until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _throttle(driver: JobDriver) -> str | None:
    runs = driver.backfills.list("hl.sweep")
    return runs[0].throttle if runs else None


def test_an_idle_transaction_holds_the_pass_until_it_closes(driver: JobDriver, url: str) -> None:
    declared = backfill(name="hl.sweep", tenant="none", source=lambda ctx: sa.select(ledger_rows), handle=_handle,
                        engine="job-store", batch=10, rate=1000,
                        health=health(max_transaction_age="1s", every="100ms", max_backoff="200ms"))
    events: list[BackfillProgress] = []
    remove = add_progress_listener(events.append)
    idle = psycopg.connect(url)
    try:
        idle.execute("SELECT 1")  # BEGIN, then nothing: idle in transaction, holding the horizon
        time.sleep(1.2)
        thread, out = _in_background(lambda: run_pass_here(declared, driver=driver, environment="test"))
        reason = _until(lambda: _throttle(driver), "the pass to be held")
        assert "transaction has been open" in reason and "limit 1 s" in reason
        run = driver.backfills.list("hl.sweep")[0]
        assert (run.status, run.batches, run.rows) == ("running", 0, 0)  # held before its first batch
        assert any(e.throttle == reason for e in events)
        time.sleep(0.5)
        assert driver.backfills.list("hl.sweep")[0].batches == 0  # still held
        idle.rollback()
        thread.join(timeout=20)
        assert not thread.is_alive() and "error" not in out, out.get("error")
    finally:
        idle.close()
        remove()
    run = driver.backfills.list("hl.sweep")[0]
    assert (run.status, run.rows, run.throttle) == ("completed", ROWS, None)


def test_a_session_waiting_for_a_lock_on_the_table_holds_the_pass(driver: JobDriver, url: str) -> None:
    declared = backfill(name="hl.sweep", tenant="none", source=lambda ctx: sa.select(ledger_rows), handle=_handle,
                        engine="job-store", batch=10, rate=1000,
                        health=health(max_transaction_age="1m", every="100ms", max_backoff="200ms"))
    holder = psycopg.connect(url)
    waiter = psycopg.connect(url, autocommit=True)
    try:
        holder.execute("UPDATE hl_rows SET n = n WHERE id = 40")  # holds the row lock, in a transaction
        blocked, _ = _in_background(lambda: waiter.execute("UPDATE hl_rows SET n = n WHERE id = 40"))
        thread, out = _in_background(lambda: run_pass_here(declared, driver=driver, environment="test"))
        reason = _until(lambda: _throttle(driver), "the pass to be held")
        assert "1 session(s) wait for a lock on the swept table (limit 0)" in reason
        holder.rollback()
        blocked.join(timeout=10)
        thread.join(timeout=20)
        assert not thread.is_alive() and "error" not in out, out.get("error")
    finally:
        holder.close()
        waiter.close()
    run = driver.backfills.list("hl.sweep")[0]
    assert (run.status, run.rows, run.throttle) == ("completed", ROWS, None)


def test_health_none_sweeps_without_asking(driver: JobDriver, url: str) -> None:
    declared = backfill(name="hl.sweep", tenant="none", source=lambda ctx: sa.select(ledger_rows), handle=_handle,
                        engine="job-store", batch=10, rate=1000, health=None)
    idle = psycopg.connect(url)
    try:
        idle.execute("SELECT 1")
        report = run_pass_here(declared, driver=driver, environment="test")
    finally:
        idle.close()
    assert report.rows == ROWS


def test_a_role_that_cannot_see_every_session_refuses_instead_of_sweeping_blind(driver: JobDriver, url: str) -> None:
    role = f"x_blind_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT SELECT, UPDATE ON hl_rows TO {}").format(sql.Identifier(role)))
    blind = sa.create_engine(sa.make_url(url.replace("postgresql://", "postgresql+psycopg://", 1)).set(username=role))
    other = psycopg.connect(url)  # a session of another role, which the blind role cannot see into
    try:
        declared = backfill(name="hl.sweep", tenant="none", source=lambda ctx: sa.select(ledger_rows),
                            handle=lambda batch: None, engine=blind, batch=10, rate=1000,
                            retry=RetryPolicy(max_attempts=1))
        with pytest.raises(XError) as refused:
            run_pass_here(declared, driver=driver, environment="test")
        assert "X_BACKFILL_HEALTH_BLIND" in str(refused.value)
        run = driver.backfills.list("hl.sweep")[0]
        assert (run.status, run.batches) == ("failed", 0)
        # The ledger says why and what to do about it.
        assert run.error is not None and "X_BACKFILL_HEALTH_BLIND" in run.error and "GRANT pg_monitor" in run.error
    finally:
        other.close()
        blind.dispose()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
