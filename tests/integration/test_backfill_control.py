"""Steering a pass on the SQL drivers, with real workers: quarantined rows and the retry pass that
re-runs exactly them, pause at a batch boundary and resume under the same ledger row, and the
sampled dry run whose batches are rolled back (SQLite and PostgreSQL, the job store's own database
as the swept one)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.postgres import postgres_database

from ultimat3.backfill import (
    BackfillProgress,
    Batch,
    add_progress_listener,
    backfill,
    dispose_engines,
    engine_for_url,
    pending_reason,
    run_backfill,
)
from ultimat3.backfill.control import pause_backfill, resume_backfill
from ultimat3.backfill.cursor import decode_failure_key
from ultimat3.backfill.sample import sample
from ultimat3.core import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers import create_driver
from ultimat3.jobs import JobDriver, JobHandle, RetryPolicy, Worker, isolated_registry

ROWS = 60
NOW = RetryPolicy(max_attempts=3, base=0, jitter=0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobDriver]:
    if request.param == "sqlite":
        url, context = f"sqlite:///{tmp_path / 'x.db'}", None
    else:
        context = postgres_database("x_bfcontrol")
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


metadata = sa.MetaData()
accounts = sa.Table(
    "ctl_accounts", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("email", sa.String(80), nullable=False),
    sa.Column("seen", sa.Integer, nullable=False, default=0),
)


@pytest.fixture
def engine(driver: JobDriver) -> sa.Engine:
    built = engine_for_url(driver.url)
    metadata.create_all(built)
    with built.begin() as conn:
        conn.execute(accounts.insert(), [{"id": i, "email": f"u{i}@example.com" if i % 7 else f"broken-{i}",
                                          "seen": 0} for i in range(1, ROWS + 1)])
    return built


def drain(driver: JobDriver) -> None:
    worker = Worker(driver, environment="test", concurrency=1)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()


def seen(engine: sa.Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {i: n for i, n in conn.execute(sa.select(accounts.c.id, accounts.c.seen))}


def _count_or_fail(batch: Batch) -> None:
    """Counts each row it handles (not idempotent) and quarantines the ones with a broken email."""
    assert batch.connection is not None
    good = []
    for row in batch.rows:
        if "@" not in row.email:
            batch.fail(row, f"email {row.email!r} has no @")
        else:
            good.append(row.id)
    batch.connection.execute(accounts.update().where(accounts.c.id.in_(good)).values(seen=accounts.c.seen + 1))


def declare_quarantining(**fields: Any) -> JobHandle[Any]:
    return backfill(name="ctl.emails", tenant="none", source=lambda ctx: sa.select(accounts), handle=_count_or_fail,
                    engine="job-store", batch=8, rate=1000, retry=NOW, **fields)


BROKEN = [i for i in range(1, ROWS + 1) if i % 7 == 0]


def test_quarantined_rows_are_kept_counted_gated_and_retried_exactly(driver: JobDriver, engine: sa.Engine) -> None:
    declared = declare_quarantining(count=lambda ctx: sa.select(accounts.c.id).where(accounts.c.seen == 0))
    report = run_backfill(declared, driver=driver, environment="test")
    assert (report.rows, report.failures, report.kind) == (ROWS, len(BROKEN), "pass")
    counts = seen(engine)
    assert [i for i, n in counts.items() if n == 0] == BROKEN and set(counts.values()) == {0, 1}
    [run] = driver.backfills.list("ctl.emails")
    # The count check knows quarantined rows may still match: the pass completed, it did not stall.
    assert (run.status, run.failures) == ("completed", len(BROKEN))
    failures = driver.backfills.failures("ctl.emails")
    assert sorted(decode_failure_key(f.key) for f in failures) == BROKEN
    assert {f.run_id for f in failures} == {run.run_id}
    assert failures[0].reason.startswith("email 'broken-")
    # A completed pass that left rows behind does not open the gate.
    assert pending_reason(driver, "ctl.emails", run.checksum)[0] == "failed-rows"

    # The data is fixed for all but one row; the retry pass handles exactly the quarantined rows.
    with engine.begin() as conn:
        conn.execute(accounts.update().where(accounts.c.id.in_(BROKEN[1:]))
                     .values(email=sa.literal("fixed") + sa.cast(accounts.c.id, sa.String) + "@example.com"))
    retry = run_backfill(declared, driver=driver, environment="test", retry_failed=True)
    assert (retry.kind, retry.rows, retry.failures) == ("retry", len(BROKEN), 1)
    counts = seen(engine)
    assert [i for i, n in counts.items() if n == 0] == BROKEN[:1] and set(counts.values()) == {0, 1}
    assert [decode_failure_key(f.key) for f in driver.backfills.failures("ctl.emails")] == BROKEN[:1]
    runs = driver.backfills.list("ctl.emails")
    assert [(r.kind, r.failures) for r in runs] == [("retry", 1), ("pass", len(BROKEN))]
    # A retry pass never decides the gate: the deciding pass is still the first one.
    last = driver.backfills.last_completed("ctl.emails")
    assert last is not None and last.run_id == run.run_id

    with engine.begin() as conn:
        conn.execute(accounts.update().where(accounts.c.id == BROKEN[0]).values(email="last@example.com"))
    run_backfill(declared, driver=driver, environment="test", retry_failed=True)
    assert set(seen(engine).values()) == {1}
    assert driver.backfills.outstanding("ctl.emails") == 0
    assert pending_reason(driver, "ctl.emails", run.checksum)[0] is None


def test_a_row_that_left_the_source_is_forgotten_by_the_retry_pass(driver: JobDriver, engine: sa.Engine) -> None:
    declared = declare_quarantining()
    run_backfill(declared, driver=driver, environment="test")
    with engine.begin() as conn:
        conn.execute(accounts.delete().where(accounts.c.id.in_(BROKEN)))
    retry = run_backfill(declared, driver=driver, environment="test", retry_failed=True)
    assert (retry.rows, retry.failures) == (0, 0)
    assert driver.backfills.outstanding("ctl.emails") == 0


def test_a_forced_pass_forgets_rows_it_now_handles(driver: JobDriver, engine: sa.Engine) -> None:
    declared = declare_quarantining()
    run_backfill(declared, driver=driver, environment="test")
    with engine.begin() as conn:
        conn.execute(accounts.update().where(accounts.c.id.in_(BROKEN[:2])).values(email="ok@example.com"))
    forced = run_backfill(declared, driver=driver, environment="test", force=True)
    assert forced.failures == len(BROKEN) - 2
    assert sorted(decode_failure_key(f.key) for f in driver.backfills.failures("ctl.emails")) == BROKEN[2:]


def test_failing_a_row_of_another_batch_or_without_a_reason_is_refused(driver: JobDriver, engine: sa.Engine) -> None:
    def handle(batch: Batch) -> None:
        batch.fail(10_000, "not in this batch")

    declared = backfill(name="ctl.bad_fail", tenant="none", source=lambda ctx: sa.select(accounts), handle=handle,
                        engine="job-store", batch=8, rate=1000, retry=NOW)
    with pytest.raises(XError) as caught:
        run_backfill(declared, driver=driver, environment="test")
    assert "X_BACKFILL_FAIL" in str(caught.value.details.get("traceback", "")) or "X_BACKFILL_FAIL" in str(caught.value)
    assert driver.backfills.outstanding("ctl.bad_fail") == 0


def test_uuid_keys_are_quarantined_and_retried_by_their_type(driver: JobDriver) -> None:
    tokens = sa.Table("ctl_tokens", sa.MetaData(), sa.Column("id", sa.Uuid, primary_key=True),
                      sa.Column("ok", sa.Boolean, nullable=False))
    engine = engine_for_url(driver.url)
    tokens.metadata.create_all(engine)
    ids = sorted(uuid.uuid4() for _ in range(12))
    with engine.begin() as conn:
        conn.execute(tokens.insert(), [{"id": i, "ok": n % 3 != 0} for n, i in enumerate(ids)])
    handled: list[uuid.UUID] = []

    def handle(batch: Batch) -> None:
        for row in batch.rows:
            if row.ok:
                handled.append(row.id)
            else:
                batch.fail(row.id, "not ok")

    declared = backfill(name="ctl.tokens", tenant="none", source=lambda ctx: sa.select(tokens), handle=handle,
                        engine="job-store", batch=5, rate=1000, retry=NOW)
    run_backfill(declared, driver=driver, environment="test")
    bad = [i for n, i in enumerate(ids) if n % 3 == 0]
    assert sorted(decode_failure_key(f.key) for f in driver.backfills.failures("ctl.tokens")) == bad
    with engine.begin() as conn:
        conn.execute(tokens.update().values(ok=True))
    handled.clear()
    run_backfill(declared, driver=driver, environment="test", retry_failed=True)
    assert sorted(handled) == bad


def test_pause_stops_at_a_batch_boundary_and_resume_goes_on_under_the_same_row(driver: JobDriver,
                                                                              engine: sa.Engine) -> None:
    clock = ManualClock()
    batches: list[int] = []

    def handle(batch: Batch) -> None:
        _count_or_fail(batch)
        batches.append(batch.index)
        clock.advance(2)  # each batch takes 2 s on the pacer's clock: every boundary reports

    def operator(event: BackfillProgress) -> None:
        # After batch 2 committed (an operator's own connection: SQLite has one writer at a time).
        if event.batches == 3 and not event.replayed:
            pause_backfill(driver, "ctl.emails", actor="ops@example.com")

    declared = backfill(name="ctl.emails", tenant="none", source=lambda ctx: sa.select(accounts), handle=handle,
                        engine="job-store", batch=8, rate=1000, retry=NOW, clock=clock,
                        sleep=lambda seconds, signal: clock.advance(seconds))
    queued = declared.enqueue(driver=driver)
    remove = add_progress_listener(operator)
    try:
        drain(driver)
    finally:
        remove()
    job = driver.introspect.get(queued.id)
    run = driver.backfills.get(queued.run_id)
    assert job is not None and run is not None
    # Paused after the batch during which it was asked (the next boundary), job parked, no attempt spent.
    assert batches == [0, 1, 2]
    assert (run.status, run.paused_by, run.batches, run.rows) == ("paused", "ops@example.com", 3, 24)
    assert (job.state, job.attempt) == ("suspended", 0)
    with pytest.raises(XError) as refused:
        pause_backfill(driver, "ctl.emails")
    assert refused.value.code == "X_BACKFILL_NOT_RUNNING"
    # A foreground run joins the paused pass and says so instead of waiting forever.
    with pytest.raises(XError) as paused:
        run_backfill(declared, driver=driver, environment="test")
    assert paused.value.code == "X_BACKFILL_PAUSED" and "ops@example.com" in str(paused.value)

    resumed = resume_backfill(driver, "ctl.emails", actor="ops@example.com")
    assert (resumed.run_id, resumed.status) == (queued.run_id, "running")
    drain(driver)
    job = driver.introspect.get(queued.id)
    [run] = driver.backfills.list("ctl.emails")
    assert job is not None and job.state == "done"
    assert (run.run_id, run.status, run.batches, run.rows) == (queued.run_id, "completed", 8, ROWS)
    assert batches == list(range(8))  # no batch handled twice, none skipped
    assert set(seen(engine).values()) <= {0, 1}
    with pytest.raises(XError) as nothing:
        resume_backfill(driver, "ctl.emails")
    assert nothing.value.code == "X_BACKFILL_NOT_PAUSED"
    actions = [(entry.action, entry.status, entry.target) for entry in driver.audit.list()]
    assert ("pause", "completed", {"backfill": "ctl.emails"}) in actions
    assert ("resume", "completed", {"backfill": "ctl.emails"}) in actions


def test_a_pause_lands_at_the_next_boundary_even_between_progress_writes(driver: JobDriver,
                                                                          engine: sa.Engine) -> None:
    clock = ManualClock()
    batches: list[int] = []

    def handle(batch: Batch) -> None:
        _count_or_fail(batch)
        batches.append(batch.index)
        clock.advance(0.2)  # a pass at 5 batches/s: the once-a-second progress write is not due yet

    def operator(event: BackfillProgress) -> None:
        if event.batches == 2 and not event.replayed:
            pause_backfill(driver, "ctl.emails", actor="ops")

    declared = backfill(name="ctl.emails", tenant="none", source=lambda ctx: sa.select(accounts), handle=handle,
                        engine="job-store", batch=8, rate=1000, retry=NOW, clock=clock,
                        sleep=lambda seconds, signal: None)
    queued = declared.enqueue(driver=driver)
    remove = add_progress_listener(operator)
    try:
        drain(driver)
    finally:
        remove()
    run = driver.backfills.get(queued.run_id)
    assert batches == [0, 1] and run is not None and (run.status, run.batches) == ("paused", 2)


def test_a_sample_runs_real_batches_and_rolls_them_back(driver: JobDriver, engine: sa.Engine) -> None:
    declared = declare_quarantining(transactional=True)
    measured = sample(declared, 3, driver=driver, environment="test")
    assert (measured.batches, measured.rows) == (3, 24)
    assert measured.failed == len([i for i in BROKEN if i <= 24])
    assert measured.touched == 24 - measured.failed  # one UPDATE per batch, each row it changed
    assert len(measured.seconds) == 3 and all(s >= 0 for s in measured.seconds)
    assert measured.total_rows == ROWS and measured.projected_batches == 8
    assert measured.projected_seconds is not None and measured.projected_seconds > 0
    assert measured.plan
    if driver.name == "sqlite":
        assert not measured.sequential_scan, measured.plan  # WHERE id > ? on the primary key
    # Nothing stayed: the data, the ledger, the steps, the failures.
    assert set(seen(engine).values()) == {0}
    assert driver.backfills.list("ctl.emails") == [] and driver.backfills.outstanding("ctl.emails") == 0


def test_a_sample_flags_a_page_query_that_scans_the_table(driver: JobDriver, engine: sa.Engine) -> None:
    declared = backfill(name="ctl.by_email", tenant="none", source=lambda ctx: sa.select(accounts.c.email),
                        key=accounts.c.email, handle=lambda batch: None, engine="job-store", batch=8, rate=1000,
                        transactional=True)
    measured = sample(declared, 2, driver=driver, environment="test")
    assert measured.sequential_scan, measured.plan


def test_a_sample_is_refused_unless_the_handler_only_writes_through_the_connection(driver: JobDriver,
                                                                                    engine: sa.Engine) -> None:
    with pytest.raises(XError) as refused:
        sample(declare_quarantining(), 2, driver=driver, environment="test")
    assert refused.value.code == "X_BACKFILL_SAMPLE" and "ctl.emails" in str(refused.value)
    assert "transactional=True" in (refused.value.hint or "")
    for bad in (0, -1, 101, True):
        with isolated_registry(), pytest.raises(XError) as caught:
            sample(declare_quarantining(transactional=True), bad, driver=driver, environment="test")
        assert caught.value.code == "X_BACKFILL_SAMPLE"
    assert set(seen(engine).values()) == {0}


def test_a_transactional_pass_over_another_engine_gets_a_connection(driver: JobDriver, tmp_path: Path) -> None:
    other = sa.create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    metadata.create_all(other)
    with other.begin() as conn:
        conn.execute(accounts.insert(), [{"id": i, "email": f"u{i}@x", "seen": 0} for i in range(1, 11)])
    fail_once = {"left": 1}

    def handle(batch: Batch) -> None:
        assert batch.connection is not None
        batch.connection.execute(accounts.update().where(accounts.c.id.in_([r.id for r in batch.rows]))
                                 .values(seen=accounts.c.seen + 1))
        if batch.index == 1 and fail_once["left"]:
            fail_once["left"] -= 1
            raise RuntimeError("after writing")

    declared = backfill(name="ctl.other", tenant="none", source=lambda ctx: sa.select(accounts), handle=handle,
                        engine=other, batch=4, rate=1000, retry=NOW, transactional=True)
    run_backfill(declared, driver=driver, environment="test")
    with other.connect() as conn:
        assert {n for (n,) in conn.execute(sa.select(accounts.c.seen))} == {1}  # the failed batch rolled back
    other.dispose()
