"""The plain URL through a transaction-mode PgBouncer 1.18 (no direct URL, no option set).

The contract suite's ``pgbouncer`` leg runs every statement through the pooler with a direct URL
for the session-scoped parts; this module covers what the plain URL alone must do: work, say once
that a pooler is there (``X_DB_POOLER``), never call a worker dead on a lock the pooler may have
moved (``X_DB_SESSION_POOLED``, liveness unknown, no rescue), and migrate from two processes at
once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from tests.pgbouncer import pgbouncer, pgbouncer_database

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.postgres.driver import PostgresDriver
from ultimat3.drivers.protocol import Ack, ClaimRequest, EnqueueRequest, NackRequest, WorkerInfo

pytestmark = [pytest.mark.postgres, pytest.mark.pgbouncer]


@pytest.fixture(scope="module")
def bouncer() -> Iterator[str]:
    with pgbouncer() as url:
        yield url


@pytest.fixture
def urls(bouncer: str) -> Iterator[tuple[str, str]]:
    with pgbouncer_database(bouncer, "x_bouncer_plain") as pair:
        yield pair


def test_the_plain_url_works_and_prepares_nothing(urls: tuple[str, str],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    pooled, _direct = urls
    driver = PostgresDriver(pooled, clock=ManualClock(), max_size=4)
    try:
        assert driver.migrate()
        with caplog.at_level(logging.WARNING):
            # Enough executions of each statement for psycopg to prepare it; every other round another
            # client holds a server connection, so ours run on a different one than they were
            # prepared on (what a busy pooler does all day).
            for round_ in range(12):
                busy = psycopg.connect(pooled)
                if round_ % 2:
                    busy.execute("SELECT pg_backend_pid()")  # opens a transaction: pins a server connection
                driver.enqueue(EnqueueRequest(name="t", payload={"n": round_}))
                driver.enqueue_many([EnqueueRequest(name="t", payload={"n": round_, "i": i}) for i in range(3)])
                with psycopg.connect(pooled) as caller:  # the app's own transaction, through the pooler
                    driver.enqueue(EnqueueRequest(name="t", payload={"tx": round_}), connection=caller)
                claimed = driver.claim(ClaimRequest(worker_id="w", limit=5))
                assert driver.heartbeat(claimed[0].job.id, claimed[0].claim_token, 30)
                assert driver.steps.record(claimed[0].job.id, claimed[0].claim_token, "s", {"ok": 1})
                assert driver.nack(claimed[1].job.id, claimed[1].claim_token, NackRequest(error="e"))
                assert all(driver.ack_many([Ack(c.job.id, c.claim_token) for c in claimed[2:]]))
                lease = driver.leases.acquire(f"k{round_}", "me", 1, 30)
                assert lease is not None and driver.leases.release(lease)
                assert driver.introspect.stats() and driver.introspect.waiting_names() is not None
                # Operator actions, the ledger, steps and the registry, on the same footing.
                record = driver.cancel(claimed[1].job.id, "cancelled through the pooler")
                assert record is not None and record.state == "cancelled"
                assert driver.retry(claimed[1].job.id) is not None
                assert driver.steps.load(claimed[0].job.run_id)
                run = driver.backfills.start(f"run-{round_}", "bf", "sum", None)
                driver.backfills.progress(run.run_id, 1, 10)
                driver.backfills.finish(run.run_id, "completed")
                assert driver.backfills.get(run.run_id) is not None and driver.backfills.list("bf")
                assert driver.backfills.last_completed("bf") is not None
                assert driver.introspect.get(claimed[0].job.id) is not None
                assert driver.migrations.is_applied("x:0001_init") and driver.migrations.applied()
                driver.workers.list()
                driver.workers.rescue("nobody")
                busy.close()
        assert sum(job.state == "done" for job in driver.introspect.list()) >= 12 * 3
        assert driver.prune(0) >= 12 * 3
        # Nothing was ever prepared on the server (nothing proved these sessions real), so no
        # statement could run as another client's prepared statement, and no pooler error showed.
        assert not driver._db.prepared
        assert [r.getMessage() for r in caplog.records if "X_DB_POOLER" in r.getMessage()] == []
        assert "Traceback" not in caplog.text
    finally:
        driver.close()


def test_through_the_plain_url_a_worker_is_never_called_dead(urls: tuple[str, str],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    pooled, _direct = urls
    driver = PostgresDriver(pooled, clock=ManualClock())
    other = PostgresDriver(pooled, clock=ManualClock())
    try:
        driver.migrate()
        with caplog.at_level(logging.WARNING):
            driver.workers.register(WorkerInfo(id="pooled", host="h", pid=1, concurrency=1))
            driver.enqueue(EnqueueRequest(name="t", payload={}))
            [held] = driver.claim(ClaimRequest(worker_id="pooled"))
            # Another client holds the server connection the lock was taken on: the next beat
            # runs elsewhere, which is how a pooler shows itself.
            with psycopg.connect(pooled) as busy:
                busy.execute("SELECT pg_backend_pid()")
                for _ in range(3):
                    driver.workers.beat("pooled")
            [record] = other.workers.list()
            assert record.alive and "pooler" in record.why
            driver.workers.abandon("pooled")  # closing the client does not free the pooled session's lock
            assert other.workers.rescue("someone") == []
            [record] = other.workers.list()
            assert record.alive and "X_DATABASE_DIRECT_URL" in record.why
        assert any("X_DB_SESSION_POOLED" in r.getMessage() for r in caplog.records)
        job = driver.introspect.get(held.job.id)
        assert job is not None and job.state == "running"  # left to its visibility timeout
    finally:
        other.close()
        driver.close()


def test_a_listener_behind_the_pooler_says_it_hears_nothing_and_nothing_gets_prepared(
        urls: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    pooled, direct = urls
    plain = PostgresDriver(pooled)
    with_direct = PostgresDriver(pooled, direct_url=direct)
    try:
        plain.migrate()
        with caplog.at_level(logging.WARNING):
            plain.subscribe(lambda queue: None)
            with_direct.subscribe(lambda queue: None)
            assert plain.listener is not None and plain.listener.wait_probed(5.0) is False
            assert with_direct.listener is not None and with_direct.listener.wait_probed(5.0) is True
        assert plain.wakeups().startswith("polling") and with_direct.wakeups() == "notify"
        assert not plain._db.prepared and not with_direct._db.prepared  # the main URL is pooled in both
        assert sum("X_DB_NOTIFY_LOST" in r.getMessage() for r in caplog.records) == 1
    finally:
        with_direct.close()
        plain.close()


def test_two_processes_migrate_through_the_pooler_at_once(urls: tuple[str, str]) -> None:
    pooled, _direct = urls
    env = {**os.environ, "X_DATABASE_URL": pooled}
    env.pop("X_DATABASE_DIRECT_URL", None)
    procs = [subprocess.Popen([sys.executable, "-m", "ultimat3", "db", "migrate", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        assert b"Traceback" not in err
    with psycopg.connect(pooled) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM x_migrations ORDER BY seq").fetchall()]
    assert ids == ["x:0001_init", "x:0002_workers", "x:0003_operations", "x:0004_schedules",
                   "x:0005_claim_any_index", "x:0006_backfill_control", "x:0007_flow_control", "x:0008_attempts",
                   "x:0009_lean_indexes"]
