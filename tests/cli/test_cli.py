"""Every `x` command on SQLite and Postgres: human output, `--json` shapes, and every error path
(one coded line with a hint, exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.cli.conftest import X
from ultimat3.jobs import create_driver

JOB_KEYS = {
    "id", "run_id", "name", "queue", "payload", "state", "priority", "attempt", "max_attempts", "run_at",
    "created_at", "updated_at", "idempotency_key", "tenant_id", "traceparent", "enqueued_by", "claimed_by",
    "visible_at", "finished_at", "last_error", "result", "flow_key", "flow_max", "rate_key", "rate_per_second",
    "rate_burst", "started_at",
}
LEDGER_KEYS = {"run_id", "name", "checksum", "status", "batches", "rows", "started_at", "job_id", "finished_at",
               "error", "kind", "failures", "throttle", "paused_by"}


def as_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def enqueue_ping(database: str, n: int = 1) -> str:
    from tests.cli.cli_app import ping

    driver = create_driver(database)
    try:
        return ping.enqueue({"org_id": "org1", "n": n}, driver=driver).id
    finally:
        driver.close()


def drain(database: str) -> None:
    import asyncio

    from ultimat3.jobs import Worker

    driver = create_driver(database)
    worker = Worker(driver, names=["cli.ping"], environment="test")
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()
        driver.close()


def test_migrate_is_idempotent(x: X) -> None:
    first = as_json(x("db", "migrate", "--json"))
    assert "x:0001_init" in first["all"]
    again = as_json(x("db", "migrate", "--json"))
    assert again["applied"] == []
    assert x("db", "migrate").stdout.startswith("up to date")


def test_jobs_ls_show_and_stats(x: X, database: str) -> None:
    first = enqueue_ping(database, 1)
    second = enqueue_ping(database, 2)
    listed = as_json(x("jobs", "ls", "--json"))
    assert [job["id"] for job in listed] == [second, first]  # newest first
    assert set(listed[0]) == JOB_KEYS
    assert as_json(x("jobs", "ls", "--json", "--limit", "1"))[0]["id"] == second
    assert as_json(x("jobs", "ls", "--json", "--state", "done")) == []
    drain(database)
    shown = as_json(x("jobs", "show", first, "--json"))
    assert shown["job"]["state"] == "done" and shown["job"]["result"] == 1
    assert [s["name"] for s in shown["steps"]] == ["echo"]
    [attempt] = shown["attempts"]
    assert attempt["attempt"] == 1 and attempt["outcome"] == "done" and attempt["worker_id"]
    assert attempt["started_at"] <= attempt["ended_at"] == shown["job"]["finished_at"]
    assert shown["backfill"] is None
    stats = as_json(x("jobs", "stats", "--json"))
    assert stats == [{"queue": "default", "counts": {"ready": 0, "delayed": 0, "running": 0, "suspended": 0,
                                                     "done": 2, "dead": 0, "cancelled": 0}}]
    human = x("jobs", "ls")
    assert human.exit_code == 0 and "cli.ping" in human.stdout and "done" in human.stdout
    human_show = x("jobs", "show", first).stdout
    assert "echo" in human_show and "attempts" in human_show and attempt["worker_id"][:12] in human_show


def test_cancel_then_retry(x: X, database: str) -> None:
    job_id = enqueue_ping(database)
    cancelled = as_json(x("jobs", "cancel", job_id, "--json", "--reason", "ops"))
    assert cancelled["changed"] and cancelled["job"]["state"] == "cancelled"
    assert cancelled["job"]["last_error"] == "ops"
    # A finished job cannot be cancelled: exit 2, coded, like retry of a live job.
    again = x("jobs", "cancel", job_id, "--json")
    assert again.exit_code == 2 and "X_JOB_NOT_CANCELLABLE" in again.stderr and again.stdout == ""
    retried = as_json(x("jobs", "retry", job_id, "--json"))
    assert retried["changed"] and retried["job"]["state"] == "ready"
    refused = x("jobs", "retry", job_id)
    assert refused.exit_code == 2 and "X_JOB_NOT_RETRYABLE" in refused.stderr


def test_backfill_listing_pending_and_check(x: X) -> None:
    declared = as_json(x("db", "backfill", "--json"))
    assert {d["name"] for d in declared} == {"cli.shout", "cli.staging_only", "cli.needs_migration", "cli.boom",
                                                  "cli.careful"}
    assert all(d["kind"] == "backfill" and d["runs"] == [] for d in declared)
    pending = as_json(x("db", "backfill", "--pending", "--json"))
    assert {p["reason"] for p in pending} == {"never-run"}
    shout = next(p for p in pending if p["name"] == "cli.shout")
    assert shout["counts"] is True and shout["last_completed"] is None
    gate = x("db", "backfill", "--check")
    assert gate.exit_code == 1 and "cli.shout" in gate.stdout


def test_dry_run_writes_nothing(x: X, database: str) -> None:
    plan = as_json(x("db", "backfill", "cli.shout", "--dry-run", "--json"))
    assert plan == {"name": "cli.shout", "rows": 1000, "batches": 10, "seconds": pytest.approx(0.01)}
    assert "would visit 1000 rows in ~10 batches" in x("db", "backfill", "cli.shout", "--dry-run").stdout
    assert as_json(x("jobs", "ls", "--json")) == []
    assert as_json(x("db", "backfill", "--json"))[0]["runs"] == []


def test_foreground_run_then_skip_then_force(x: X) -> None:
    report = as_json(x("db", "backfill", "cli.shout", "--wait", "--json"))
    assert report == {"name": "cli.shout", "batches": 10, "rows": 1000, "skipped": False, "previous_run_id": None,
                      "failures": 0, "kind": "pass"}
    pending = {p["name"] for p in as_json(x("db", "backfill", "--pending", "--json"))}
    assert "cli.shout" not in pending
    skipped = as_json(x("db", "backfill", "cli.shout", "--wait", "--json"))
    assert skipped["skipped"] and skipped["previous_run_id"]
    # Every label is upper-case now, so a forced pass finds nothing to visit but still writes a new row.
    forced = as_json(x("db", "backfill", "cli.shout", "--wait", "--force", "--json"))
    assert not forced["skipped"] and forced["rows"] == 0
    runs = next(d for d in as_json(x("db", "backfill", "--json")) if d["name"] == "cli.shout")["runs"]
    assert len(runs) == 2 and {r["status"] for r in runs} == {"completed"}
    assert set(runs[0]) == LEDGER_KEYS
    job = as_json(x("jobs", "ls", "--json", "--name", "cli.shout"))[0]
    shown = as_json(x("jobs", "show", job["id"], "--json"))
    assert shown["backfill"]["status"] == "completed"


def test_foreground_run_shows_progress_and_ledger(x: X) -> None:
    result = x("db", "backfill", "cli.shout", "--wait")
    assert result.exit_code == 0, result.output
    assert "cli.shout: 1000 rows in 10 batches" in result.stdout
    assert "ledger x_backfills" in result.stdout and "completed" in result.stdout


def test_enqueue_pending_honours_environment_and_requires(x: X, database: str) -> None:
    outcome = as_json(x("db", "backfill", "--enqueue-pending", "--json"))
    assert [e["name"] for e in outcome["enqueued"]] == ["cli.shout", "cli.careful"]
    held = {h["name"]: h["code"] for h in outcome["held"]}
    assert held == {"cli.staging_only": "X_BACKFILL_ENVIRONMENT", "cli.needs_migration": "X_BACKFILL_REQUIRES",
                    "cli.boom": "X_BACKFILL_ENVIRONMENT"}
    # Enqueued twice while live: the same pass.
    again = as_json(x("db", "backfill", "--enqueue-pending", "--json"))
    assert again["enqueued"][0]["deduped"] is True
    driver = create_driver(database)
    try:
        driver.migrations.mark_applied("20261201_widgets_labels")
    finally:
        driver.close()
    staged = as_json(x("--env", "staging", "db", "backfill", "--enqueue-pending", "--json"))
    assert {e["name"] for e in staged["enqueued"]} == {"cli.shout", "cli.staging_only", "cli.needs_migration",
                                                       "cli.careful"}
    assert [h["name"] for h in staged["held"]] == ["cli.boom"]


def test_enqueue_one_backfill(x: X) -> None:
    queued = as_json(x("db", "backfill", "cli.shout", "--json"))
    assert queued["name"] == "cli.shout" and not queued["deduped"]
    assert as_json(x("db", "backfill", "cli.shout", "--json"))["job_id"] == queued["job_id"]
    refused = x("db", "backfill", "cli.staging_only")
    assert refused.exit_code == 2 and "X_BACKFILL_ENVIRONMENT" in refused.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("jobs", "show", "no-such-id"), "X_JOB_NOT_FOUND"),
        (("jobs", "cancel", "no-such-id"), "X_JOB_NOT_FOUND"),
        (("jobs", "retry", "no-such-id"), "X_JOB_NOT_FOUND"),
        (("db", "backfill", "no.such.backfill"), "X_BACKFILL_UNKNOWN"),
        (("db", "backfill", "--pending", "--check", "cli.shout"), "X_CLI_USAGE"),
        (("db", "backfill", "--wait"), "X_CLI_USAGE"),
        (("db", "prune", "--older-than", "forever"), "X_DURATION"),
        (("--env", "prod", "jobs", "ls"), "X_ENVIRONMENT"),
    ],
)
def test_errors_are_one_coded_line(x: X, args: tuple[str, ...], code: str) -> None:
    result = x(*args)
    assert result.exit_code == 2
    assert code in result.stderr
    assert "hint:" in result.stderr
    assert "Traceback" not in result.output


def test_prune(x: X, database: str) -> None:
    enqueue_ping(database)
    drain(database)
    assert as_json(x("db", "prune", "--older-than", "1h", "--json")) == {"deleted": 0}
    assert as_json(x("db", "prune", "--older-than", "0s", "--json")) == {"deleted": 1}


def run_x(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "ultimat3", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    ("args", "env", "code"),
    [
        (("--app", "no.such.module", "worker"), {}, "X_APP_IMPORT"),
        (("jobs", "ls"), {"X_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none"}, "X_DATABASE_UNREACHABLE"),
        (("jobs", "ls"), {"X_DATABASE_URL": "mysql://x"}, "X_DATABASE_URL"),
        (("worker",), {"X_DATABASE_URL": "memory://"}, "X_WORKER_NO_JOBS"),
        (("worker", "--weight", "acme"), {"X_DATABASE_URL": "memory://"}, "X_FAIR_WEIGHT"),
        (("worker", "--weight", "acme=0"), {"X_DATABASE_URL": "memory://"}, "X_FAIR_WEIGHT"),
        (("worker", "--weight", "acme=x3"), {"X_DATABASE_URL": "memory://"}, "X_FAIR_WEIGHT"),
        (("jobs", "ls"), {"X_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none",
                          "X_DATABASE_DIRECT_URL": "mysql://app:s3cret@db/app"}, "X_DATABASE_URL"),
        (("--database-direct-url", "sqlite:///x.db", "jobs", "ls"),
         {"X_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none"}, "X_DATABASE_URL"),
    ],
)
def test_real_process_errors(args: tuple[str, ...], env: dict[str, str], code: str) -> None:
    result = run_x(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert code in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.stderr and "s3cret" not in result.stderr
    assert result.stdout == ""


WORKER_KEYS = {"id", "host", "pid", "concurrency", "queues", "started_at", "last_seen_at", "last_seen_seconds_ago",
               "alive", "why", "running", "clock_offset", "wakeups"}


def test_workers_ls_shows_the_registry_and_who_is_dead(x: X, database: str) -> None:
    from ultimat3.drivers.protocol import ClaimRequest, WorkerInfo

    assert as_json(x("workers", "ls", "--json")) == []
    assert "no workers registered" in x("workers", "ls").stdout
    job_id = enqueue_ping(database)
    driver = create_driver(database)
    try:
        driver.workers.register(WorkerInfo(id="live-1", host="web-7", pid=4242, concurrency=5, queues=("default",)))
        driver.workers.beat("live-1", clock_offset=0.25, wakeups="notify")
        driver.workers.register(WorkerInfo(id="gone-2", host="web-8", pid=4343, concurrency=2))
        driver.claim(ClaimRequest(worker_id="live-1"))
        driver.workers.abandon("gone-2")  # its process "died"
        listed = as_json(x("workers", "ls", "--json"))
        assert [w["id"] for w in listed] == ["gone-2", "live-1"]
        assert all(set(w) == WORKER_KEYS for w in listed)
        gone, live = listed
        assert live["alive"] is True and live["running"] == [job_id] and live["queues"] == ["default"]
        assert live["clock_offset"] == 0.25 and live["host"] == "web-7" and live["pid"] == 4242
        assert live["wakeups"] == "notify"
        assert gone["alive"] is False and gone["why"] and gone["queues"] is None
        table = x("workers", "ls").stdout
        assert "live-1" in table and "alive" in table and "presumed dead" in table and "+0.250s" in table
    finally:
        driver.workers.unregister("live-1")
        driver.close()


def test_db_health_names_the_oldest_open_snapshot(x: X, database: str) -> None:
    report = as_json(x("db", "health", "--json"))
    if database.startswith("sqlite"):
        # SQLite's pinned horizon is a reader holding the WAL (tests/integration/test_sqlite_driver.py).
        assert report == {"database": "sqlite", "measured": True, "oldest_snapshot": None}
        assert "oldest open snapshot: none" in x("db", "health").stdout
        return
    import psycopg

    with psycopg.connect(database, application_name="x-cli-reader") as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT 1").fetchone()
        report = as_json(x("db", "health", "--json"))
        assert report["database"] == "postgres" and report["measured"] is True
        holder = report["oldest_snapshot"]
        assert holder is not None and set(holder) == {"kind", "pid", "application_name", "state", "backend_type",
                                                      "age_seconds", "query"}
        human = x("db", "health").stdout
        assert "oldest open snapshot:" in human and "idle_in_transaction_session_timeout" in human
        reader.rollback()
