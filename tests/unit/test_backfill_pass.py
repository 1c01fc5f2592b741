"""One backfill pass, run by the real Worker over the memory driver, reading an app table in a
SQLite file through SQLAlchemy. Pacing runs on the ManualClock: the injected sleep records what
was asked and moves the clock, so nothing here sleeps for real except the heartbeat-driven cancel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ultimat3.backfill import (
    BackfillInput,
    BackfillProgress,
    BackfillReport,
    Batch,
    add_progress_listener,
    alembic_revision,
    backfill,
    backfill_origin,
    dry_run,
    requirement_error,
    run_backfill,
    run_pass,
)
from ultimat3.backfill.requires import MigrationError
from ultimat3.core import ManualClock, XError, use_ctx
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import (
    AbortSignal,
    ClaimedJob,
    ClaimRequest,
    JobAbortedError,
    JobHandle,
    RetryPolicy,
    SyncStep,
    Worker,
)
from ultimat3.jobs.execute import run_ctx

ROWS = 25
RETRY_NOW = RetryPolicy(max_attempts=3, base=0, jitter=0)

metadata = sa.MetaData()
items = sa.Table(
    "items", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("org_id", sa.String, nullable=False),
    sa.Column("done", sa.Boolean, nullable=False, default=False),
)
tags = sa.Table(
    "tags", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("item_id", sa.Integer, nullable=False),
)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    built = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    metadata.create_all(built)
    with built.begin() as conn:
        conn.execute(items.insert(), [{"id": i, "org_id": "org-a", "done": False} for i in range(1, ROWS + 1)])
    yield built
    built.dispose()


class Sweep:
    """A backfill under test: counts page reads (the LIMITed selects the engine runs) and how often
    its source was built, records what each batch handled and what the pacer asked to sleep
    (moving the ManualClock instead of sleeping)."""

    def __init__(self, engine: Engine, clock: ManualClock) -> None:
        self.engine = engine
        self.clock = clock
        self.pages = 0
        self.built = 0
        sa.event.listen(engine, "before_cursor_execute", self._count_page)
        self.handled: list[tuple[int, list[int]]] = []
        self.asked: list[float] = []
        self.on_sleep: Callable[[AbortSignal], None] | None = None
        self.on_batch: Callable[[Batch], None] | None = None

    def _count_page(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM items" in statement and "LIMIT" in statement:
            self.pages += 1

    def source(self, ctx: Any) -> sa.Select[Any]:
        self.built += 1
        return sa.select(items).where(items.c.done.is_(False))

    def handle(self, batch: Batch) -> None:
        self.handled.append((batch.index, [row.id for row in batch.rows]))
        if self.on_batch is not None:
            self.on_batch(batch)

    def sleep(self, seconds: float, signal: AbortSignal) -> None:
        self.asked.append(seconds)
        if self.on_sleep is not None:
            self.on_sleep(signal)
        else:
            self.clock.advance(seconds)

    def declare(self, name: str = "items.sweep", **fields: Any) -> JobHandle[BackfillInput]:
        spec: dict[str, Any] = {
            "name": name, "tenant": "none", "source": self.source, "handle": self.handle,
            "batch": 10, "engine": self.engine, "clock": self.clock, "sleep": self.sleep,
            "retry": RETRY_NOW,
        }
        spec.update(fields)
        return backfill(**spec)

    def ids(self) -> list[int]:
        return [i for _, batch in self.handled for i in batch]


@pytest.fixture
def sweep(engine: Engine, clock: ManualClock) -> Sweep:
    return Sweep(engine, clock)


def drain(driver: MemoryDriver, environment: Any = "test", **options: Any) -> int:
    worker = Worker(driver, environment=environment, concurrency=1, **options)
    try:
        return asyncio.run(worker.drain())
    finally:
        worker.close()


def row(driver: MemoryDriver, job_id: str) -> Any:
    record = driver.introspect.get(job_id)
    assert record is not None
    return record


def mark_done(engine: Engine, batch: Batch) -> None:
    with engine.begin() as conn:
        conn.execute(items.update().where(items.c.id.in_([r.id for r in batch.rows])).values(done=True))


# -- the sweep --------------------------------------------------------------------------------------


def test_keyset_pages_each_recorded_as_its_own_step(memory: MemoryDriver, sweep: Sweep) -> None:
    events: list[BackfillProgress] = []
    remove = add_progress_listener(events.append)
    try:
        declared = sweep.declare()
        queued = declared.enqueue(driver=memory)
        drain(memory)
    finally:
        remove()
    job = row(memory, queued.id)
    assert job.state == "done", job.last_error
    assert job.result == {"name": "items.sweep", "batches": 3, "rows": 25, "skipped": False,
                          "previous_run_id": None, "failures": 0, "kind": "pass"}
    assert sweep.handled == [(0, list(range(1, 11))), (1, list(range(11, 21))), (2, list(range(21, 26)))]
    assert sweep.pages == 3, "a short page ends the pass without another read"
    assert sweep.built == 1, "the source is built once per attempt, not once per page"
    steps = memory.steps.load(queued.run_id)
    assert {name: s.result for name, s in steps.items()} == {
        "batch:0": {"cursor": 10, "rows": 10},
        "batch:1": {"cursor": 20, "rows": 10},
        "batch:2": {"cursor": 25, "rows": 5},
    }
    ledger = memory.backfills.get(queued.run_id)
    origin = backfill_origin(declared)
    assert ledger is not None and origin is not None
    assert (ledger.status, ledger.batches, ledger.rows, ledger.job_id) == ("completed", 3, 25, queued.id)
    assert ledger.checksum == origin.checksum and ledger.finished_at is not None
    assert [(e.batches, e.rows, e.replayed) for e in events] == [(1, 10, False), (2, 20, False), (3, 25, False)]
    # rate 5: the first batch never waits, the others wait out the interval (batches take no time here).
    assert sweep.asked == [pytest.approx(0.2), pytest.approx(0.2)]


def test_a_batch_lists_its_keys_wherever_the_key_column_sits(memory: MemoryDriver, sweep: Sweep) -> None:
    seen: list[tuple[list[int], list[int]]] = []

    def handle(batch: Batch) -> None:
        seen.append((batch.keys, [row.id for row in batch.rows]))

    # The key is the second column here: keys are read by the key's position, not the first column.
    declared = sweep.declare(source=lambda ctx: sa.select(items.c.done, items.c.id), handle=handle)
    queued = declared.enqueue(driver=memory)
    drain(memory)
    assert row(memory, queued.id).state == "done"
    assert [keys for keys, _ in seen] == [list(range(1, 11)), list(range(11, 21)), list(range(21, 26))]
    assert all(keys == ids for keys, ids in seen)


def test_an_exact_multiple_ends_on_an_empty_page(memory: MemoryDriver, sweep: Sweep) -> None:
    queued = sweep.declare(batch=5).enqueue(driver=memory)
    drain(memory)
    assert row(memory, queued.id).result["batches"] == 5
    assert sweep.pages == 6 and sweep.ids() == list(range(1, 26))


def test_a_retry_replays_recorded_batches_and_resumes_from_the_cursor(memory: MemoryDriver, sweep: Sweep) -> None:
    failures = {"left": 1}

    def fail_batch_3_once(batch: Batch) -> None:
        if batch.index == 2 and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("flaky downstream")

    sweep.on_batch = fail_batch_3_once
    events: list[BackfillProgress] = []
    remove = add_progress_listener(events.append)
    try:
        queued = sweep.declare().enqueue(driver=memory)
        drain(memory)
    finally:
        remove()
    job = row(memory, queued.id)
    assert job.state == "done" and job.attempt == 2
    handled = sweep.ids()
    assert sorted(set(handled)) == list(range(1, 26)), "no row skipped"
    counts = {i: handled.count(i) for i in set(handled)}
    assert all(counts[i] == 2 for i in range(21, 26)), "only the failed batch is handled twice"
    assert all(counts[i] == 1 for i in range(1, 21))
    # Attempt 2 read no page for batches 0 and 1: it resumed at the recorded cursor.
    assert sweep.pages == 3 + 1
    assert sweep.built == 2, "each attempt builds the source again"
    assert [(e.batches, e.replayed) for e in events] == [
        (1, False), (2, False), (1, True), (2, True), (3, False)]
    ledger = memory.backfills.list("items.sweep")
    assert len(ledger) == 1 and ledger[0].status == "completed" and ledger[0].rows == 25


def test_a_failing_attempt_marks_the_ledger_failed_until_the_retry(memory: MemoryDriver, sweep: Sweep) -> None:
    def always_fail(batch: Batch) -> None:
        raise RuntimeError("broken handler")

    sweep.on_batch = always_fail
    queued = sweep.declare(retry=RetryPolicy(max_attempts=1)).enqueue(driver=memory)
    drain(memory)
    assert row(memory, queued.id).state == "dead"
    ledger = memory.backfills.get(queued.run_id)
    assert ledger is not None and ledger.status == "failed"
    assert ledger.error is not None and "broken handler" in ledger.error


def test_async_handlers_are_awaited(memory: MemoryDriver, sweep: Sweep) -> None:
    seen: list[int] = []

    async def handle(batch: Batch) -> None:
        await asyncio.sleep(0)
        seen.extend(r.id for r in batch.rows)

    queued = sweep.declare(handle=handle).enqueue(driver=memory)
    drain(memory)
    assert row(memory, queued.id).state == "done"
    assert seen == list(range(1, 26))


def test_each_batch_gets_the_pass_context_and_the_attempt_signal(memory: MemoryDriver, sweep: Sweep) -> None:
    batches: list[Batch] = []
    sweep.on_batch = batches.append
    sweep.declare().enqueue(driver=memory)
    drain(memory)
    assert [b.index for b in batches] == [0, 1, 2]
    assert all(b.ctx.environment == "test" and not b.signal.aborted for b in batches)
    assert all(type(r).__name__ == "Row" for b in batches for r in b.rows)


# -- ledger: skip, force, dedupe ----------------------------------------------------------------------


def test_a_completed_name_is_skipped_unless_forced(memory: MemoryDriver, sweep: Sweep) -> None:
    declared = sweep.declare()
    first = declared.enqueue(driver=memory)
    drain(memory)
    second = declared.enqueue(driver=memory)
    assert not second.deduped
    drain(memory)
    assert row(memory, second.id).result == {"name": "items.sweep", "batches": 0, "rows": 0, "skipped": True,
                                            "previous_run_id": first.run_id, "failures": 0, "kind": "pass"}
    assert len(sweep.handled) == 3
    assert [r.run_id for r in memory.backfills.list("items.sweep")] == [first.run_id]

    memory.clock.advance(1)  # type: ignore[attr-defined]
    forced = declared.enqueue({"force": True}, driver=memory)
    drain(memory)
    report = BackfillReport.from_dict(row(memory, forced.id).result)
    assert (report.skipped, report.rows, report.previous_run_id) == (False, 25, first.run_id)
    runs = memory.backfills.list("items.sweep")
    assert [r.run_id for r in runs] == [forced.run_id, first.run_id], "a new row; history kept"
    assert all(r.status == "completed" for r in runs)
    assert memory.backfills.last_completed("items.sweep").run_id == forced.run_id  # type: ignore[union-attr]


def test_a_live_pass_is_the_same_pass(memory: MemoryDriver, sweep: Sweep) -> None:
    declared = sweep.declare()
    first = declared.enqueue(driver=memory)
    again = declared.enqueue(driver=memory)
    forced = declared.enqueue({"force": True}, driver=memory)
    assert again.deduped and forced.deduped and again.id == forced.id == first.id
    assert drain(memory) == 1
    assert len(memory.backfills.list()) == 1


def test_a_pass_finished_before_its_ack_is_reported_not_rerun(memory: MemoryDriver, sweep: Sweep,
                                                               clock: ManualClock) -> None:
    declared = sweep.declare()
    claimed = claim(memory, declared)
    first = direct(memory, declared, claimed)
    assert first.rows == 25
    # The worker died before acking: the claim lapses and the run is claimed again.
    clock.advance(31)
    again = direct(memory, declared, claim(memory, declared, enqueue=False))
    assert again == first
    assert len(sweep.handled) == 3 and len(memory.backfills.list()) == 1


# -- count --------------------------------------------------------------------------------------------


def test_count_disagreeing_with_source_is_stalled(memory: MemoryDriver, sweep: Sweep) -> None:
    queued = sweep.declare(count=lambda ctx: sa.select(items).where(items.c.done.is_(False))).enqueue(driver=memory)
    drain(memory)
    job = row(memory, queued.id)
    assert job.state == "dead" and job.attempt == 1, "stalled is not retried"
    assert "X_BACKFILL_STALLED" in job.last_error and "25 row(s) left" in job.last_error
    ledger = memory.backfills.get(queued.run_id)
    assert ledger is not None and ledger.status == "failed"
    assert ledger.error is not None and "X_BACKFILL_STALLED" in ledger.error


def test_a_converging_pass_with_a_count_completes(memory: MemoryDriver, sweep: Sweep, engine: Engine) -> None:
    sweep.on_batch = lambda batch: mark_done(engine, batch)
    queued = sweep.declare(count=lambda ctx: sa.select(items.c.id).where(items.c.done.is_(False))).enqueue(
        driver=memory)
    drain(memory)
    assert row(memory, queued.id).state == "done"
    assert sweep.ids() == list(range(1, 26))


@pytest.mark.parametrize("answer", [0, 3, -1, "2"])
def test_count_may_return_an_int_or_be_async(memory: MemoryDriver, sweep: Sweep, answer: Any) -> None:
    async def count(ctx: Any) -> Any:
        return answer

    queued = sweep.declare(count=count).enqueue(driver=memory)
    drain(memory)
    job = row(memory, queued.id)
    if answer == 0:
        assert job.state == "done"
    elif answer == 3:
        assert "X_BACKFILL_STALLED" in job.last_error
    else:
        assert job.state == "dead" and "X_BACKFILL_COUNT" in job.last_error


def test_dry_run_counts_and_writes_nothing(memory: MemoryDriver, sweep: Sweep) -> None:
    declared = sweep.declare(rate=2, count=lambda ctx: sa.select(items).where(items.c.done.is_(False)))
    plan = dry_run(declared, memory, "test")
    assert (plan.rows, plan.batches, plan.seconds) == (25, 3, 1.5)
    assert memory.introspect.list() == [] and memory.backfills.list() == []
    # The source is built once, to check its tables exist in the engine; no page is read or handled.
    assert sweep.built == 1 and sweep.pages == 0 and sweep.handled == []
    uncounted = sweep.declare(name="uncounted")
    assert dry_run(uncounted, memory, "test").rows is None


# -- environments and requires ------------------------------------------------------------------------


def test_a_pass_outside_its_environments_is_dead_lettered(memory: MemoryDriver, sweep: Sweep) -> None:
    queued = sweep.declare(environments=["staging", "production"]).enqueue(driver=memory)
    drain(memory, environment="test")
    job = row(memory, queued.id)
    assert job.state == "dead" and job.attempt == 1
    assert "X_BACKFILL_ENVIRONMENT" in job.last_error
    assert '"items.sweep"' in job.last_error and '"test"' in job.last_error
    assert "staging, production" in job.last_error
    assert memory.backfills.list() == [] and sweep.pages == sweep.built == 0


def test_requires_an_x_migration(memory: MemoryDriver, sweep: Sweep) -> None:
    queued = sweep.declare(requires="app:0002_add_done").enqueue(driver=memory)
    drain(memory)
    job = row(memory, queued.id)
    assert job.state == "dead" and job.attempt == 1
    assert "X_BACKFILL_REQUIRES" in job.last_error and "app:0002_add_done" in job.last_error
    assert memory.backfills.list() == [] and sweep.pages == sweep.built == 0
    memory.migrations.mark_applied("app:0002_add_done")
    memory.retry(queued.id)
    drain(memory)
    assert row(memory, queued.id).state == "done"


REVISION = '''
revision = "{rev}"
down_revision = {down}
branch_labels = None
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
'''


def alembic_dir(tmp_path: Path) -> Path:
    scripts = tmp_path / "alembic"
    (scripts / "versions").mkdir(parents=True)
    (scripts / "versions" / "aaa111_first.py").write_text(REVISION.format(rev="aaa111", down=None))
    (scripts / "versions" / "bbb222_second.py").write_text(REVISION.format(rev="bbb222", down='"aaa111"'))
    return scripts


def stamp(engine: Engine, revision: str) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.exec_driver_sql("DELETE FROM alembic_version")
        conn.exec_driver_sql("INSERT INTO alembic_version VALUES (?)", (revision,))


def test_requires_an_alembic_revision(memory: MemoryDriver, sweep: Sweep, engine: Engine, tmp_path: Path) -> None:
    scripts = alembic_dir(tmp_path)
    stamp(engine, "aaa111")
    first = sweep.declare(name="after.first", requires=alembic_revision("aaa111", script_location=scripts))
    second = sweep.declare(name="after.second", requires=alembic_revision("bbb222", script_location=scripts))
    a, b = first.enqueue(driver=memory), second.enqueue(driver=memory)
    drain(memory)
    assert row(memory, a.id).state == "done"
    job = row(memory, b.id)
    assert job.state == "dead" and "X_BACKFILL_REQUIRES" in job.last_error and "alembic:bbb222" in job.last_error

    stamp(engine, "bbb222")  # the head moved on: everything below it is applied
    assert requirement_error(memory, "after.first") is None
    assert requirement_error(memory, "after.second", "alembic:bbb222") is None
    memory.retry(b.id)
    drain(memory)
    assert row(memory, b.id).state == "done"


def test_an_unknown_alembic_revision_cannot_be_checked(memory: MemoryDriver, engine: Engine,
                                                        tmp_path: Path) -> None:
    scripts = alembic_dir(tmp_path)
    stamp(engine, "aaa111")
    unknown = alembic_revision("zzz999", script_location=scripts, engine=engine)
    error = requirement_error(memory, "whatever", unknown)
    assert isinstance(error, MigrationError) and "zzz999" in error.message
    empty = sa.create_engine("sqlite://")
    try:
        missing = alembic_revision("aaa111", script_location=scripts, engine=empty)
        assert requirement_error(memory, "whatever", missing) is not None
    finally:
        empty.dispose()  # 3.13 reports a pooled connection left to the garbage collector


# -- keys and engines ---------------------------------------------------------------------------------


def test_the_key_is_inferred_or_declared(memory: MemoryDriver, sweep: Sweep) -> None:
    joined = sweep.declare(name="joined", source=lambda ctx: sa.select(items, tags).join_from(
        items, tags, items.c.id == tags.c.item_id))
    named = sweep.declare(name="named", source=lambda ctx: sa.select(items.c.id, items.c.org_id), key="id")
    keyless = sweep.declare(name="keyless", source=lambda ctx: sa.select(items.c.org_id))
    results = {h.name: h.enqueue(driver=memory).id for h in (joined, named, keyless)}
    drain(memory)
    joined_job = row(memory, results["joined"])
    assert joined_job.state == "dead" and "X_BACKFILL_KEY" in joined_job.last_error
    assert '"joined"' in joined_job.last_error
    assert row(memory, results["named"]).result["rows"] == 25
    assert "X_BACKFILL_KEY" in row(memory, results["keyless"]).last_error


def test_the_memory_driver_has_no_database_to_default_to(memory: MemoryDriver, sweep: Sweep) -> None:
    queued = sweep.declare(engine="job-store").enqueue(driver=memory)
    drain(memory)
    job = row(memory, queued.id)
    assert job.state == "dead" and "X_BACKFILL_ENGINE" in job.last_error


def test_an_engine_factory_is_called_lazily(memory: MemoryDriver, sweep: Sweep, engine: Engine) -> None:
    calls: list[int] = []

    def factory() -> Engine:
        calls.append(1)
        return engine

    declared = sweep.declare(engine=factory)
    assert calls == []
    declared.enqueue(driver=memory)
    drain(memory)
    assert calls == [1]


# -- cancel and lost claims ---------------------------------------------------------------------------


def claim(driver: MemoryDriver, declared: JobHandle[BackfillInput], *, enqueue: bool = True) -> ClaimedJob:
    if enqueue:
        declared.enqueue(driver=driver)
    [claimed] = driver.claim(ClaimRequest(worker_id="test", names=(declared.name,)))
    return claimed


def direct(driver: MemoryDriver, declared: JobHandle[BackfillInput], claimed: ClaimedJob,
           signal: AbortSignal | None = None) -> BackfillReport:
    origin = backfill_origin(declared)
    assert origin is not None
    step = SyncStep(driver, claimed, signal or AbortSignal(declared.name), driver.clock)
    ctx = run_ctx(claimed, "test")
    with use_ctx(ctx):
        return run_pass(origin, BackfillInput.model_validate(claimed.job.payload), ctx, step)


def test_a_cancel_during_the_pacer_wait_stops_before_the_next_page(memory: MemoryDriver, sweep: Sweep) -> None:
    sweep.on_sleep = lambda signal: signal.abort("cancelled")
    declared = sweep.declare()
    claimed = claim(memory, declared)
    with pytest.raises(JobAbortedError) as caught:
        direct(memory, declared, claimed)
    assert caught.value.reason == "cancelled"
    assert sweep.pages == 1 and len(sweep.handled) == 1, "no page read after the abort"
    ledger = memory.backfills.get(claimed.job.run_id)
    assert ledger is not None and ledger.status == "cancelled" and ledger.batches == 1


def test_a_cancel_reaches_a_pass_waiting_in_the_worker(memory: MemoryDriver, sweep: Sweep) -> None:
    declared = sweep.declare()
    queued = declared.enqueue(driver=memory)

    def cancel_and_wait(signal: AbortSignal) -> None:
        memory.cancel(queued.id, "operator")
        signal.wait(10)  # the default sleeper's behaviour: return once the heartbeat aborts us

    sweep.on_sleep = cancel_and_wait
    drain(memory, heartbeat_interval=0.02, visibility_timeout=5)
    deadline = time.monotonic() + 10
    while memory.backfills.get(queued.run_id).status == "running":  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the pass never noticed the cancel"
        time.sleep(0.01)
    assert memory.backfills.get(queued.run_id).status == "cancelled"  # type: ignore[union-attr]
    assert row(memory, queued.id).state == "cancelled"
    assert sweep.pages == 1


def test_a_lost_claim_leaves_the_ledger_to_the_new_owner(memory: MemoryDriver, sweep: Sweep,
                                                         clock: ManualClock) -> None:
    declared = sweep.declare()

    def lose_claim(batch: Batch) -> None:
        if batch.index == 1:
            clock.advance(31)  # our visibility lapsed...
            memory.claim(ClaimRequest(worker_id="other", names=(declared.name,)))  # ...and was re-taken

    sweep.on_batch = lose_claim
    claimed = claim(memory, declared)
    with pytest.raises(JobAbortedError) as caught:
        direct(memory, declared, claimed)
    assert caught.value.reason == "claim lost"
    ledger = memory.backfills.get(claimed.job.run_id)
    assert ledger is not None and ledger.status == "running" and ledger.batches == 1
    assert "batch:1" not in memory.steps.load(claimed.job.run_id)


# -- foreground ---------------------------------------------------------------------------------------


def test_run_backfill_runs_in_process_and_respects_the_ledger(memory: MemoryDriver, sweep: Sweep) -> None:
    declared = sweep.declare()
    events: list[BackfillProgress] = []
    remove = add_progress_listener(events.append)
    try:
        report = run_backfill(declared, driver=memory, environment="test")
    finally:
        remove()
    assert (report.batches, report.rows, report.skipped) == (3, 25, False)
    assert [e.rows for e in events] == [10, 20, 25]
    skipped = run_backfill(declared, driver=memory, environment="test")
    assert skipped.skipped and skipped.previous_run_id is not None
    forced = run_backfill(declared, force=True, driver=memory, environment="test")
    assert forced.rows == 25 and len(memory.backfills.list()) == 2


def test_run_backfill_refuses_before_writing_and_reports_failures(memory: MemoryDriver, sweep: Sweep) -> None:
    with pytest.raises(XError) as caught:
        run_backfill(sweep.declare(environments=["production"]), driver=memory, environment="test")
    assert caught.value.code == "X_BACKFILL_ENVIRONMENT"
    with pytest.raises(XError) as caught:
        run_backfill(sweep.declare(name="needs", requires="app:9"), driver=memory, environment="test")
    assert caught.value.code == "X_BACKFILL_REQUIRES"
    assert memory.introspect.list() == []

    def explode(batch: Batch) -> None:
        raise RuntimeError("boom")

    sweep.on_batch = explode
    with pytest.raises(XError) as caught:
        run_backfill(sweep.declare(name="explodes", retry=RetryPolicy(max_attempts=1)), driver=memory,
                     environment="test")
    assert caught.value.code == "X_BACKFILL_FAILED" and "boom" in caught.value.message


def test_a_pass_killed_on_every_attempt_closes_its_ledger_row(memory: MemoryDriver, sweep: Sweep,
                                                              clock: ManualClock) -> None:
    """Lost workers can spend every attempt; the dead-lettered pass must not read `running` forever."""
    declared = sweep.declare(retry=RetryPolicy(max_attempts=2, base=0, jitter=0))
    queued = declared.enqueue(driver=memory)
    for _ in range(2):  # each attempt opens the ledger row, then its worker vanishes
        claimed = memory.claim(ClaimRequest(worker_id="doomed", visibility_timeout=1))
        assert [c.job.id for c in claimed] == [queued.id]
        memory.backfills.start(queued.run_id, "items.sweep", "checksum", queued.id)
        clock.advance(2)
    drain(memory)
    job = row(memory, queued.id)
    assert job.state == "dead" and "X_JOB_ATTEMPTS_EXHAUSTED" in (job.last_error or "")
    ledger = memory.backfills.get(queued.run_id)
    assert ledger is not None and ledger.status == "failed"
    assert "X_JOB_ATTEMPTS_EXHAUSTED" in (ledger.error or "")
    assert sweep.handled == []


# -- adaptive batch sizing ----------------------------------------------------------------------------


def test_an_adaptive_pass_sizes_its_pages_toward_the_time_target(memory: MemoryDriver, sweep: Sweep,
                                                                  clock: ManualClock, engine: Engine) -> None:
    from ultimat3.backfill import adaptive

    with engine.begin() as conn:  # 400 rows in all
        conn.execute(items.insert(), [{"id": i, "org_id": "org-a", "done": False} for i in range(ROWS + 1, 401)])
    # Each row costs 2 ms of the (manual) clock: a 50 ms target is 25 rows a batch.
    sweep.on_batch = lambda batch: clock.advance(0.002 * len(batch.rows))
    queued = sweep.declare(batch=adaptive(target="50ms", min=4, max=1000), rate=1000).enqueue(driver=memory)
    drain(memory)
    assert row(memory, queued.id).state == "done"
    sizes = [len(ids) for _, ids in sweep.handled]
    assert sizes[:4] == [4, 8, 16, 25]  # from min, at most doubling, then the target's size
    assert set(sizes[3:-1]) == {25} and sum(sizes) == 400


def test_an_adaptive_pass_shrinks_when_batches_get_slow_and_stays_in_its_bounds(
        memory: MemoryDriver, sweep: Sweep, clock: ManualClock, engine: Engine) -> None:
    from ultimat3.backfill import adaptive

    with engine.begin() as conn:  # 100 rows in all
        conn.execute(items.insert(), [{"id": i, "org_id": "org-a", "done": False} for i in range(ROWS + 1, 101)])
    costs = iter([0.001] * 3 + [0.5] * 10)  # seconds per row: cheap, then a slow patch of the table
    sweep.on_batch = lambda batch: clock.advance(next(costs, 0.5) * len(batch.rows))
    sweep.declare(batch=adaptive(target="100ms", min=2, max=8), rate=1000).enqueue(driver=memory)
    drain(memory)
    sizes = [len(ids) for _, ids in sweep.handled]
    assert sizes[:3] == [2, 4, 8]  # capped at max
    assert sizes[3:6] == [8, 4, 2]  # halved per slow batch, floored at min
    assert min(sizes[:-1]) == 2 and max(sizes) == 8


@pytest.mark.parametrize(("spec", "named"), [
    ({"target": "50ms", "min": 0, "max": 10}, "adaptive(min=0)"),
    ({"target": "50ms", "min": 10, "max": 5}, "min is above max"),
    ({"target": "50ms", "min": 1, "max": 2.5}, "adaptive(max=2.5)"),
    ({"target": 0, "min": 1, "max": 2}, "adaptive(target=0.0)"),
])
def test_bad_adaptive_declarations_are_refused_naming_the_backfill(sweep: Sweep, spec: dict[str, Any],
                                                                   named: str) -> None:
    from ultimat3.backfill import adaptive

    with pytest.raises(XError) as refused:
        sweep.declare(name="items.bad", batch=adaptive(spec["target"], min=spec["min"], max=spec["max"]))
    assert refused.value.code == "X_BACKFILL_BATCH"
    assert 'backfill "items.bad"' in refused.value.message and named in refused.value.message
