"""What an operator meets on a bad day: a gate that fails closed, a failed pass in one line, a
cancelled pass's ledger, the pass that decides the gate, secrets kept out of messages, a read-only
store, and a job store only its owner can read."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import X
from tests.postgres import postgres_test_url, require_postgres
from ultimat3.core import XError
from ultimat3.drivers.sqlite.driver import SqliteDriver
from ultimat3.jobs import create_driver


def as_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_coded_line(stderr: str, code: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 2, stderr
    assert lines[0].startswith(f"error {code}: "), stderr
    assert lines[1].startswith("  hint: "), stderr


def run_x(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ultimat3", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_the_gate_fails_closed_when_nothing_is_declared(tmp_path: Path) -> None:
    env = {"X_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}", "X_APP": ""}
    for args in (("db", "backfill", "--check"), ("db", "backfill", "--pending"),
                 ("db", "backfill", "--enqueue-pending")):
        result = run_x(*args, env=env, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        one_coded_line(result.stderr, "X_BACKFILL_NONE_DECLARED")
        assert "--app" in result.stderr and "--allow-none" in result.stderr
    allowed = run_x("db", "backfill", "--check", "--allow-none", env=env, cwd=tmp_path)
    assert allowed.returncode == 0 and "no pending backfills" in allowed.stdout


def test_a_failed_pass_is_one_line_and_the_traceback_waits_for_verbose(x: X) -> None:
    failed = x("--env", "test", "db", "backfill", "cli.boom", "--wait")
    assert failed.exit_code == 2
    one_coded_line(failed.stderr, "X_BACKFILL_FAILED")
    assert "RuntimeError: the widget service said no" in failed.stderr
    assert "second line" not in failed.stderr and "Traceback" not in failed.stderr
    verbose = x("--verbose", "--env", "test", "db", "backfill", "cli.boom", "--wait", "--force")
    assert verbose.exit_code == 2 and "Traceback" in verbose.stderr and "second line" in verbose.stderr


def test_a_cancelled_pass_closes_its_ledger_row_and_the_listing_tells_the_truth(x: X, database: str) -> None:
    queued = as_json(x("db", "backfill", "cli.shout", "--json"))
    cancelled = as_json(x("jobs", "cancel", queued["job_id"], "--json"))
    assert cancelled["job"]["state"] == "cancelled"
    driver = create_driver(database)
    try:
        # The pass had started (a worker opened its row) when the operator cancelled it.
        driver.backfills.start(queued["run_id"], "cli.shout", "c", queued["job_id"])
        driver.retry(queued["job_id"])
        driver.cancel(queued["job_id"], "operator stopped it")
        run = driver.backfills.get(queued["run_id"])
        assert run is not None and run.status == "cancelled" and run.finished_at is not None
    finally:
        driver.close()
    # A completed pass, then a forced one that fails: the gate is decided by the completed one.
    as_json(x("db", "backfill", "cli.shout", "--wait", "--json", "--force"))
    listed = {row["name"]: row for row in as_json(x("db", "backfill", "--json"))}
    shout = listed["cli.shout"]
    assert shout["pending"] is None and shout["deciding_run"]["status"] == "completed"
    assert shout["latest_run"]["run_id"] == shout["deciding_run"]["run_id"]
    table = x("db", "backfill")
    assert table.exit_code == 0 and "deciding pass" in table.stdout


def test_click_errors_are_coded_too(x: X) -> None:
    for args, code in ((("jobs", "ls", "--limit", "20000"), "X_CLI_VALUE"),
                       (("jobs", "ls", "--state", "bogus"), "X_CLI_VALUE"),
                       (("worker", "--log-level", "loud"), "X_CLI_VALUE"),
                       (("worker", "--prune-after", "soon"), "X_DURATION"),
                       (("worker", "--prefetch", "lots"), "X_WORKER_CONFIG"),
                       (("worker", "--prefetch", "-1"), "X_WORKER_CONFIG"),
                       (("worker", "--prefetch", "2.5"), "X_WORKER_CONFIG"),
                       (("jobs", "ls", "--no-such-flag"), "X_CLI_USAGE"),
                       (("no-such-command",), "X_CLI_USAGE")):
        result = x(*args)
        assert result.exit_code == 2, (args, result.output)
        one_coded_line(result.stderr, code)


def test_worker_prefetch_reaches_the_worker(x: X, monkeypatch: pytest.MonkeyPatch) -> None:
    from ultimat3.jobs.worker import Worker

    seen: list[tuple[int | None, int]] = []
    # The worker parses its options and is built for real; only its loop is replaced.
    monkeypatch.setattr(Worker, "run_forever", lambda self: seen.append((self.prefetch, self._prefetch.depth(0.0))))
    for value, expected in (("auto", (None, 3)), ("AUTO", (None, 3)), ("0", (0, 0)), ("25", (25, 25))):
        result = x("worker", "--concurrency", "3", "--prefetch", value)
        assert result.exit_code == 0, result.output
        assert seen.pop() == expected
        assert f"prefetch {value.lower() if value.isalpha() else value}" in result.stderr


def test_x_worker_freezes_the_gc_unless_told_not_to(x: X, monkeypatch: pytest.MonkeyPatch) -> None:
    from ultimat3.jobs.worker import Worker

    seen: list[bool] = []
    monkeypatch.setattr(Worker, "run_forever", lambda self: seen.append(self.freeze_gc))
    assert x("worker").exit_code == 0
    assert x("worker", "--no-gc-freeze").exit_code == 0
    assert seen == [True, False]


def test_a_url_never_shows_its_password(tmp_path: Path) -> None:
    result = run_x("--database-url", "postgresql+asyncpg://app:S3cret@127.0.0.1:1/db", "jobs", "ls", cwd=tmp_path)
    assert result.returncode == 2
    one_coded_line(result.stderr, "X_DATABASE_URL")
    assert "S3cret" not in result.stderr and "app:***@" in result.stderr
    unreachable = run_x("--database-url", "postgresql://app:S3cret@127.0.0.1:1/db", "jobs", "ls", cwd=tmp_path)
    assert unreachable.returncode == 2 and "S3cret" not in unreachable.stderr


@pytest.mark.postgres
def test_sqlalchemy_spellings_of_postgresql_are_accepted() -> None:
    require_postgres()
    base = postgres_test_url()
    for scheme in ("postgresql+psycopg", "postgresql+psycopg2"):
        driver = create_driver(scheme + base[base.index("://"):], migrate=False)
        try:
            assert driver.name == "postgres"
        finally:
            driver.close()


def test_a_read_only_job_store_is_one_coded_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.db"
    SqliteDriver(str(path)).close()
    opened = SqliteDriver._open

    def read_only(self: SqliteDriver) -> sqlite3.Connection:
        conn = opened(self)
        conn.execute("PRAGMA query_only = ON")  # SQLite answers writes as it does for a read-only file
        return conn

    monkeypatch.setattr(SqliteDriver, "_open", read_only)
    driver = SqliteDriver(str(path))
    try:
        with pytest.raises(XError) as caught:
            driver.migrate()
        assert caught.value.code == "X_DATABASE_READONLY" and str(path) in caught.value.message
    finally:
        driver.close()


def test_the_sqlite_job_store_is_created_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = create_driver(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        driver.enqueue_many([])
        for suffix in ("", "-wal", "-shm"):
            mode = stat.S_IMODE(os.stat(tmp_path / f"x.db{suffix}").st_mode)
            assert mode == 0o600, (suffix, oct(mode))
    finally:
        driver.close()
    monkeypatch.setenv("X_SQLITE_FILE_MODE", "640")
    shared = create_driver(f"sqlite:///{tmp_path / 'group.db'}")
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "group.db").st_mode) == 0o640
    finally:
        shared.close()
    monkeypatch.setenv("X_SQLITE_FILE_MODE", "rw-r--r--")
    with pytest.raises(XError) as caught:
        create_driver(f"sqlite:///{tmp_path / 'bad.db'}")
    assert caught.value.code == "X_DATABASE_FILE_MODE"
