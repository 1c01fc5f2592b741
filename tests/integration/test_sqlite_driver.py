"""What only the SQLite driver has: URLs, its file, several processes, joining the app's transaction.

The behaviour every driver shares is proved by ``tests/contract``; these tests cover the rest.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import ClaimRequest, EnqueueRequest, JobDriver
from ultimat3.drivers.sql import load_migrations, parse_queries
from ultimat3.drivers.sqlite.driver import SqliteDriver, sqlite_path
from ultimat3.drivers.sqlite.statements import split_statements
from ultimat3.jobs.errors import DriverError, JobDuplicateError

SRC = Path(__file__).resolve().parents[2] / "src" / "ultimat3" / "drivers"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "x.db"


@pytest.fixture
def driver(db: Path, clock: ManualClock) -> Iterator[SqliteDriver]:
    built = SqliteDriver(str(db), clock=clock)
    built.migrate()
    yield built
    built.close()


def job(name: str = "task", **fields: Any) -> EnqueueRequest:
    return EnqueueRequest(name=name, payload={}, **fields)


def ids_in(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM x_jobs")}
    finally:
        conn.close()


# -- URLs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///x.db", "x.db"),
        ("sqlite:///data/jobs.db", "data/jobs.db"),
        ("sqlite:////var/lib/app/x.db", "/var/lib/app/x.db"),
        ("SQLITE:///x.db", "x.db"),
    ],
)
def test_sqlite_path_reads_relative_and_absolute_urls(url: str, path: str) -> None:
    assert sqlite_path(url) == path


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///:memory:",
        "sqlite://",
        "sqlite:///",
        "sqlite:///file::memory:?cache=shared",
        "sqlite://host/x.db",
        "sqlite:///x.db?timeout=5",
        "postgresql://localhost/x",
    ],
)
def test_sqlite_path_refuses_memory_and_malformed_urls(url: str) -> None:
    with pytest.raises(XError) as caught:
        sqlite_path(url)
    assert caught.value.code == "X_DATABASE_URL"
    assert caught.value.hint


def test_memory_database_is_refused_with_a_hint() -> None:
    with pytest.raises(XError) as caught:
        SqliteDriver(":memory:")
    assert caught.value.code == "X_DATABASE_URL"
    assert "file" in caught.value.hint


def test_create_driver_builds_a_migrated_sqlite_driver(db: Path) -> None:
    built = create_driver(f"sqlite:///{db}")
    try:
        assert isinstance(built, SqliteDriver)
        assert isinstance(built, JobDriver)
        assert built.url == f"sqlite:///{db}"
        assert built.name == "sqlite"
        assert built.supports_transactional_enqueue and not built.supports_listen_notify
        assert built.migrations.is_applied("x:0001_init")
    finally:
        built.close()


def test_missing_directory_is_a_coded_error(tmp_path: Path) -> None:
    built = SqliteDriver(str(tmp_path / "missing" / "x.db"))
    with pytest.raises(DriverError) as caught:
        built.migrate()
    assert caught.value.code == "X_DRIVER_OPEN"


# -- schema ----------------------------------------------------------------------------------------

LIBRARY = [migration.id for migration in load_migrations("ultimat3.drivers.sqlite")]


def test_migrate_is_idempotent_across_instances(db: Path, clock: ManualClock) -> None:
    first = SqliteDriver(str(db), clock=clock)
    assert first.migrations.applied() == []
    assert first.migrate() == LIBRARY
    assert first.migrate() == []
    second = SqliteDriver(str(db), clock=clock)
    assert second.migrate() == []
    assert [record.id for record in second.migrations.applied()] == LIBRARY
    first.close()
    second.close()


def test_concurrent_migrates_apply_the_schema_once(db: Path) -> None:
    drivers = [SqliteDriver(str(db)) for _ in range(4)]
    applied: list[list[str]] = []
    barrier = threading.Barrier(len(drivers))

    def migrate(driver: SqliteDriver) -> None:
        barrier.wait(10)
        applied.append(driver.migrate())

    threads = [threading.Thread(target=migrate, args=(driver,)) for driver in drivers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(applied) == 4
    # Each file applied by exactly one of them (not necessarily all by the same one).
    assert sorted(mid for ids in applied for mid in ids) == LIBRARY
    for driver in drivers:
        driver.close()


def test_migrations_ledger_keeps_application_order(driver: SqliteDriver) -> None:
    # Same clock reading for all three: the order must still be the order they were applied.
    for migration_id in ("app:0002_b", "app:0001_a", "app:0003_c"):
        driver.migrations.mark_applied(migration_id)
    driver.migrations.mark_applied("app:0002_b")
    assert [record.id for record in driver.migrations.applied()] == [
        *LIBRARY,
        "app:0002_b",
        "app:0001_a",
        "app:0003_c",
    ]


def test_file_is_in_wal_mode(driver: SqliteDriver, db: Path) -> None:
    driver.enqueue(job())
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


#: Columns only PostgreSQL has, and why: its workers' liveness is their backend's advisory lock;
#: SQLite orders audit entries by the table's own rowid.
POSTGRES_ONLY = {("x_workers", "backend_pid"), ("x_audit", "seq")}


def _postgres_schema() -> tuple[dict[str, set[str]], set[str]]:
    # Every migration, in order: tables created later and columns added later count too.
    text = "\n".join(path.read_text() for path in sorted((SRC / "postgres" / "migrations").glob("*.sql")))
    tables: dict[str, set[str]] = {}
    for match in re.finditer(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\)", text, re.S):
        columns = set()
        for line in match.group(2).splitlines():
            line = line.strip()
            if line and not line.startswith(("--", "PRIMARY KEY")):
                columns.add(line.split()[0])
        tables[match.group(1)] = columns
    for table, column in re.findall(r"ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+)", text):
        tables[table].add(column)
    for table, column in POSTGRES_ONLY:
        tables[table].discard(column)
    indexes: set[str] = set()
    # In migration order: an index a later migration drops (and does not create again) is gone.
    for verb, name in re.findall(r"(CREATE (?:UNIQUE )?INDEX IF NOT EXISTS|DROP INDEX IF EXISTS) (\w+)", text):
        if verb.startswith("DROP"):
            indexes.discard(name)
        else:
            indexes.add(name)
    return tables, indexes


def test_schema_has_the_postgres_tables_columns_and_indexes(driver: SqliteDriver, db: Path) -> None:
    pg_tables, pg_indexes = _postgres_schema()
    conn = sqlite3.connect(db)
    try:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert set(pg_tables) <= names
        for table, columns in pg_tables.items():
            ours = {row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", (table,))}
            assert ours == columns, table
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert pg_indexes <= indexes
    finally:
        conn.close()


#: Every parameter the statements below take (a superset: sqlite3 ignores the ones a statement lacks).
_PLAN_PARAMS = {"worker_id": "w", "limit": 10, "now": 0.0, "visible_at": 30.0, "queues": None, "names": None,
                "start": "", "tenant": "", "n": 10, "scan": 10, "cutoff": 0.0, "name": "task",
                "idempotency_key": "k"}


@pytest.mark.parametrize(("query", "index"), [
    ("fair_tenants", "x_jobs_fair_idx"),
    ("fair_jobs", "x_jobs_fair_idx"),
    ("flow_candidates", "x_jobs_flow_claim_idx"),
    ("prune_delete_jobs", "x_jobs_finished_idx"),
    ("job_live_by_key", "x_jobs_name_idempotency_live_idx"),
])
def test_statements_walk_their_partial_index(driver: SqliteDriver, query: str, index: str) -> None:
    # SQLite uses a partial index only when the query's WHERE repeats the index's predicate term for
    # term (0009_lean_indexes writes them as ORs of equalities): a drift shows as a scan here.
    from ultimat3.drivers.sqlite.driver import QUERIES

    plan = [row[3] for row in driver._connection().execute("EXPLAIN QUERY PLAN " + QUERIES[query], _PLAN_PARAMS)]
    assert any(f"USING INDEX {index}" in step or f"USING COVERING INDEX {index}" in step for step in plan), plan


def test_a_batch_of_acks_finds_each_job_by_its_primary_key(driver: SqliteDriver) -> None:
    # One statement per batch (ack_many): it must walk the batch and look each job up, never scan x_jobs.
    from ultimat3.drivers.sqlite.driver import QUERIES

    plan = [row[3] for row in driver._connection().execute("EXPLAIN QUERY PLAN " + QUERIES["ack_many"],
                                                             {"acks": "[]", "now": 0.0})]
    assert "SCAN x_jobs" not in plan, plan
    assert any(step.startswith("SEARCH x_jobs USING INDEX sqlite_autoindex_x_jobs_1 (id=?)") for step in plan), plan


def test_claim_reads_the_claim_indexes_instead_of_sorting(driver: SqliteDriver) -> None:
    conn = driver._connection()
    from ultimat3.drivers.sqlite.driver import QUERIES

    for name, queues in (("claim", None), ("claim_queues", '["default"]')):
        params = {"worker_id": "w", "limit": 10, "now": 0.0, "visible_at": 30.0, "queues": queues, "names": None}
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + QUERIES[name], params)]
        # An ordered walk of a claim index, never a full scan of the table.
        assert any(
            step.startswith(("SCAN x_jobs USING INDEX x_jobs_claim", "SEARCH x_jobs USING INDEX x_jobs_claim"))
            for step in plan
        ), plan
        assert "SCAN x_jobs" not in plan, plan


def test_times_are_the_clock_epoch_seconds(driver: SqliteDriver, db: Path, clock: ManualClock) -> None:
    result = driver.enqueue(job())
    conn = sqlite3.connect(db)
    try:
        created, run_at = conn.execute("SELECT created_at, run_at FROM x_jobs WHERE id = ?", (result.id,)).fetchone()
    finally:
        conn.close()
    assert created == run_at == clock.now()


def test_query_file_parses_into_named_statements() -> None:
    queries = parse_queries("-- intro\n-- name: a\nSELECT 1;\n\n-- name: b_c\n-- why\nSELECT 2;\n")
    assert queries == {"a": "SELECT 1;", "b_c": "SELECT 2;"}  # one parser for every dialect: comments dropped
    with pytest.raises(ValueError):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    assert split_statements("-- c\nCREATE TABLE t (x TEXT DEFAULT ';');\n-- end\nSELECT 1;\n") == [
        "-- c\nCREATE TABLE t (x TEXT DEFAULT ';');",
        "-- end\nSELECT 1;",
    ]


# -- several processes and threads on one file -----------------------------------------------------


def _claim_until_empty(path: str, worker: str, start: Any) -> list[str]:
    """A worker process: claim batches from the shared file until nothing is left, acking each."""
    driver = SqliteDriver(path)
    start.wait(60)  # a barrier: nobody claims before all four are up
    seen: list[str] = []
    try:
        while True:
            claimed = driver.claim(ClaimRequest(worker_id=worker, limit=7, visibility_timeout=600))
            if not claimed:
                return seen
            for item in claimed:
                seen.append(item.job.id)
                assert driver.ack(item.job.id, item.claim_token, {"by": worker})
    finally:
        driver.close()


def test_four_processes_claim_every_job_exactly_once(db: Path) -> None:
    driver = SqliteDriver(str(db))
    driver.migrate()
    enqueued = driver.enqueue_many([EnqueueRequest(name="task", payload={"i": i}) for i in range(1000)])
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(4)
        with context.Pool(4) as pool:
            pending = [pool.apply_async(_claim_until_empty, (str(db), f"w{index}", start)) for index in range(4)]
            per_worker = [item.get(timeout=120) for item in pending]
    claimed = [job_id for ids in per_worker for job_id in ids]
    assert len(claimed) == 1000
    assert set(claimed) == {result.id for result in enqueued}
    # SQLite's lock is not fair (a busy process sleeps while others commit), so shares are uneven;
    # at least two processes must have claimed for the test to prove anything.
    assert sum(1 for ids in per_worker if ids) >= 2, "the processes did not contend"
    stats = driver.introspect.stats()
    assert stats[0].counts["done"] == 1000
    assert {record.attempt for record in driver.introspect.list()} == {1}
    driver.close()


def test_threads_claim_every_job_exactly_once(driver: SqliteDriver) -> None:
    driver.enqueue_many([job() for _ in range(300)])
    claimed: list[str] = []
    lock = threading.Lock()

    def work(worker: str) -> None:
        while batch := driver.claim(ClaimRequest(worker_id=worker, limit=3)):
            for item in batch:
                assert driver.ack(item.job.id, item.claim_token)
            with lock:
                claimed.extend(item.job.id for item in batch)

    threads = [threading.Thread(target=work, args=(f"t{index}",)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(claimed) == len(set(claimed)) == 300


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_opens_its_own_connection(driver: SqliteDriver, db: Path) -> None:
    before = driver.enqueue(job())  # this thread's connection now exists, and fork copies it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() with threads around
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            driver.enqueue(job("from-child"))
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert {record.name for record in driver.introspect.list()} == {"task", "from-child"}
    assert driver.introspect.get(before.id) is not None  # the parent's connection still works


def test_a_held_write_lock_is_waited_out(db: Path, clock: ManualClock) -> None:
    driver = SqliteDriver(str(db), clock=clock, busy_timeout=5)
    driver.migrate()
    blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(0.3, lambda: blocker.execute("ROLLBACK"))
    releaser.start()
    try:
        result = driver.enqueue(job())
        assert driver.introspect.get(result.id) is not None
    finally:
        releaser.join()
        blocker.close()
        driver.close()


def test_a_lock_held_too_long_is_a_coded_error(db: Path, clock: ManualClock) -> None:
    driver = SqliteDriver(str(db), clock=clock, busy_timeout=0.2)
    driver.migrate()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(DriverError) as caught:
            driver.enqueue(job())
        assert caught.value.code == "X_DRIVER_BUSY"
        assert 0.15 < time.monotonic() - started < 5
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        driver.close()


def test_close_then_use_reopens(driver: SqliteDriver) -> None:
    first = driver.enqueue(job())
    driver.close()
    driver.close()
    assert driver.introspect.get(first.id) is not None


# -- the app's own transaction ---------------------------------------------------------------------


@pytest.mark.parametrize("isolation_level", ["", "DEFERRED", "immediate", None])
def test_enqueue_in_a_sqlite3_transaction_follows_its_rollback_and_commit(
    driver: SqliteDriver, db: Path, isolation_level: str | None
) -> None:
    conn = sqlite3.connect(db, isolation_level=isolation_level)
    try:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        if isolation_level is None:
            conn.execute("BEGIN")
        conn.execute("INSERT INTO orders (id) VALUES (1)")
        rolled_back = driver.enqueue(job(), connection=conn)
        assert rolled_back.id in ids_in_connection(conn)  # the caller sees its own write
        conn.rollback()
        assert driver.introspect.get(rolled_back.id) is None

        if isolation_level is None:
            conn.execute("BEGIN")
        committed = driver.enqueue(job(), connection=conn)
        assert driver.introspect.get(committed.id) is None  # not visible before the commit
        conn.commit()
        assert driver.introspect.get(committed.id) is not None
    finally:
        conn.close()


def ids_in_connection(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT id FROM x_jobs")}


def test_enqueue_first_in_a_fresh_implicit_transaction_still_rolls_back(driver: SqliteDriver, db: Path) -> None:
    # No statement of the caller's opened the transaction: the driver must not autocommit.
    conn = sqlite3.connect(db)
    try:
        result = driver.enqueue(job(), connection=conn)
        conn.rollback()
    finally:
        conn.close()
    assert driver.introspect.get(result.id) is None


def test_enqueue_in_a_sqlalchemy_transaction_follows_its_rollback_and_commit(driver: SqliteDriver, db: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
            conn.commit()
            conn.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
            rolled_back = driver.enqueue(job(), connection=conn)
            conn.rollback()
            # Nothing ran through SQLAlchemy first: the driver begins the transaction it joins.
            committed = driver.enqueue(job(), connection=conn)
            conn.commit()
        with pytest.raises(RuntimeError), engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO orders (id) VALUES (2)"))
            failed = driver.enqueue(job(), connection=conn)
            raise RuntimeError("the app's transaction fails")
        with engine.begin() as conn:
            kept = driver.enqueue(job(), connection=conn)
            count = conn.execute(sa.text("SELECT count(*) FROM orders")).scalar_one()
    finally:
        engine.dispose()
    assert count == 0
    assert driver.introspect.get(rolled_back.id) is None
    assert driver.introspect.get(failed.id) is None
    assert driver.introspect.get(committed.id) is not None
    assert driver.introspect.get(kept.id) is not None


def test_enqueue_many_in_a_caller_transaction_is_all_or_nothing(driver: SqliteDriver, db: Path) -> None:
    driver.enqueue(job(idempotency_key="k"))
    conn = sqlite3.connect(db)
    try:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO orders (id) VALUES (1)")
        with pytest.raises(JobDuplicateError):
            driver.enqueue_many([job("other"), job(idempotency_key="k", on_conflict="error")], connection=conn)
        # The batch is gone, the caller's own write and transaction are intact.
        assert conn.in_transaction
        assert conn.execute("SELECT count(*) FROM x_jobs").fetchone()[0] == 1
        results = driver.enqueue_many([job("other"), job(idempotency_key="k")], connection=conn)
        conn.commit()
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    finally:
        conn.close()
    assert [result.deduped for result in results] == [False, True]
    assert len(ids_in(db)) == 2


def test_a_stale_caller_transaction_is_a_coded_busy_error(driver: SqliteDriver, db: Path) -> None:
    conn = sqlite3.connect(db, timeout=0.1)
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM x_jobs").fetchone()  # the transaction's snapshot starts here
        driver.enqueue(job())  # another connection commits after it
        with pytest.raises(DriverError) as caught:
            driver.enqueue(job(), connection=conn)
        assert caught.value.code == "X_DRIVER_BUSY"
        assert "IMMEDIATE" in caught.value.hint
    finally:
        conn.close()


def test_enqueue_refuses_a_foreign_connection(driver: SqliteDriver, tmp_path: Path) -> None:
    with pytest.raises(DriverError) as caught:
        driver.enqueue(job(), connection=object())
    assert caught.value.code == "X_DRIVER_CONNECTION"
    assert caught.value.hint

    other = sqlite3.connect(tmp_path / "other.db")
    memory = sqlite3.connect(":memory:")
    try:
        for conn in (other, memory):
            with pytest.raises(DriverError) as caught:
                driver.enqueue(job(), connection=conn)
            assert caught.value.code == "X_DRIVER_CONNECTION"
    finally:
        other.close()
        memory.close()


def test_non_json_values_are_refused_before_anything_is_written(driver: SqliteDriver, db: Path) -> None:
    with pytest.raises(XError) as caught:
        driver.enqueue(EnqueueRequest(name="task", payload={"when": object()}))
    assert caught.value.code == "X_JOB_PAYLOAD"
    with pytest.raises(XError) as caught:
        driver.enqueue_many([job(), EnqueueRequest(name="task", payload={"x": float("nan")})])
    assert ids_in(db) == set()
    claimed = (driver.enqueue(job()), driver.claim(ClaimRequest(worker_id="w"))[0])[1]
    with pytest.raises(XError) as caught:
        driver.steps.record(claimed.job.id, claimed.claim_token, "s", {1, 2})
    assert caught.value.code == "X_STEP_RESULT"
    assert driver.steps.load(claimed.job.run_id) == {}


def test_async_enqueue_works_again_after_close_as_the_sync_path_does(tmp_path: Path) -> None:
    import asyncio

    driver = SqliteDriver(str(tmp_path / "x.db"))
    driver.migrate()
    try:
        asyncio.run(driver.aenqueue_many([EnqueueRequest(name="a", payload={})]))
        driver.close()  # stops the writer thread and closes every connection
        asyncio.run(driver.aenqueue_many([EnqueueRequest(name="b", payload={})]))
        driver.enqueue(EnqueueRequest(name="c", payload={}))
        assert sorted(job.name for job in driver.introspect.list()) == ["a", "b", "c"]
    finally:
        driver.close()


def test_a_reader_holding_the_wal_is_reported_and_the_wal_shrinks_back_after_it(
    db: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite's pinned horizon: a read transaction keeps the WAL from being checkpointed, and it
    # grows with every write; the worker warns (the same X_DB_HORIZON_PINNED as PostgreSQL's).
    import ultimat3.drivers.sqlite.driver as sqlite_driver
    from ultimat3.drivers.protocol import Ack

    monkeypatch.setattr(sqlite_driver, "WAL_SIZE_LIMIT", 256 * 1024)
    driver = SqliteDriver(str(db), clock=clock)
    driver.migrate()
    reader = sqlite3.connect(db)
    try:
        assert driver.oldest_snapshot() is None
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM x_jobs").fetchone()
        for _ in range(5):
            driver.enqueue_many([EnqueueRequest(name="task", payload={"pad": "x" * 500}) for _ in range(200)])
            while batch := driver.claim(ClaimRequest("w", limit=50)):
                driver.ack_many([Ack(c.job.id, c.claim_token, None) for c in batch])
        holder = driver.oldest_snapshot()
        assert holder is not None and holder.kind == "wal-reader"
        assert "WAL frames" in (holder.state or "") and str(db) in holder.describe()
        grown = os.path.getsize(f"{db}-wal")
        assert grown > 1024 * 1024
    finally:
        reader.rollback()
        reader.close()
    assert driver.oldest_snapshot() is None  # the checkpoint now copies every frame ...
    driver.enqueue(job())  # ... the next write starts the WAL over, and it is truncated back
    assert os.path.getsize(f"{db}-wal") <= 256 * 1024 < grown
    driver.close()
