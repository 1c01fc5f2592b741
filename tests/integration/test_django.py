"""ultimat3.contrib.django against a real Django project (tests/integration/django_project), on
SQLite and PostgreSQL, through its own manage.py: the deploy gate inside `migrate`, `manage.py x`,
enqueue in Django's transaction and on commit, the request's actor, and the settings refused
coded. Each step is a manage.py process, as an operator or a deploy runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from tests.postgres import postgres_database

PROJECT = Path(__file__).parent / "django_project"


class Site:
    """The project on one database."""

    def __init__(self, url: str, settings_env: dict[str, str] | None = None) -> None:
        self.url = url
        self.extra = settings_env or {}

    def env(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("X_")}
        env.update(SHOP_DATABASE_URL=self.url, PYTHONPATH=str(PROJECT), **self.extra, **extra)
        return env

    def manage(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=self.env(**env),
                              capture_output=True, text=True, timeout=60)

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        if self.url.startswith("sqlite:///"):
            import sqlite3

            conn = sqlite3.connect(self.url[len("sqlite:///"):])
            try:
                rows = conn.execute(statement).fetchall()
                conn.commit()
                return rows
            finally:
                conn.close()
        with psycopg.connect(self.url, autocommit=True) as pg:
            cursor = pg.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def applied(self) -> list[str]:
        return [str(row[0]) for row in self.sql("SELECT name FROM django_migrations WHERE app = 'shop' ORDER BY id")]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    if request.param == "sqlite":
        yield Site(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
    else:
        with postgres_database("x_django") as url:
            yield Site(url)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_migrate_waits_at_the_gate_until_the_backfill_completes(site: Site) -> None:
    ok(site.manage("migrate", "shop", "0002"))
    site.sql("INSERT INTO shop_order (email, shipped) VALUES ('a@x', false), ('b@x', false), ('c@x', false)")

    refused = site.manage("migrate")
    assert refused.returncode == 2
    assert "CommandError: X_BACKFILL_PENDING: backfill \"shop.fill_codes\" has never completed" in refused.stderr
    assert "hint: " in refused.stderr and "Traceback" not in refused.stderr
    assert site.applied() == ["0001_initial", "0002_order_code"]  # stopped AT the gate, nothing past it

    gate = site.manage("x", "db", "backfill", "--check")  # the CLI sees the project's backfills and store
    assert gate.returncode == 1 and "shop.fill_codes" in gate.stdout

    ok(site.manage("x", "db", "backfill", "shop.fill_codes", "--wait"))
    ok(site.manage("migrate"))
    assert site.applied()[-2:] == ["0003_require_shop_fill_codes", "0004_code_not_null"]
    assert sorted(row[0] for row in site.sql("SELECT code FROM shop_order")) == ["C-1", "C-2", "C-3"]


def test_quarantined_rows_hold_the_gate_until_a_retry_pass_clears_them(site: Site) -> None:
    ok(site.manage("migrate", "shop", "0002"))
    site.sql("INSERT INTO shop_order (email, shipped) VALUES ('a@x', false)")
    ok(site.manage("x", "db", "backfill", "shop.fill_codes", "--wait"))
    [(run_id,)] = site.sql("SELECT run_id FROM x_backfills WHERE name = 'shop.fill_codes'")
    failed_at = "1767225600.0" if site.url.startswith("sqlite") else "now()"
    site.sql("INSERT INTO x_backfill_failures (name, key, reason, run_id, batch, failed_at) VALUES "
             f"('shop.fill_codes', '{{\"cursor\":1}}', 'bad email', '{run_id}', 0, {failed_at})")

    refused = site.manage("migrate")
    assert refused.returncode == 2 and "X_BACKFILL_PENDING" in refused.stderr
    assert "1 row(s) quarantined" in refused.stderr and "--retry-failed" in refused.stderr
    assert site.applied() == ["0001_initial", "0002_order_code"]
    # The row has its code by now, so the retry pass finds it gone from the source and forgets it.
    ok(site.manage("x", "db", "backfill", "shop.fill_codes", "--retry-failed", "--wait"))
    ok(site.manage("migrate"))
    assert site.applied()[-1] == "0004_code_not_null"


def test_in_development_migrate_runs_the_pending_backfill_inline(site: Site) -> None:
    ok(site.manage("migrate", "shop", "0002"))
    site.sql("INSERT INTO shop_order (email, shipped) VALUES ('a@x', false), ('b@x', false)")
    ok(site.manage("migrate", SHOP_ENV="development"))
    assert site.applied()[-1] == "0004_code_not_null"
    assert sorted(row[0] for row in site.sql("SELECT code FROM shop_order")) == ["C-1", "C-2"]
    ledger = site.sql("SELECT status, rows FROM x_backfills WHERE name = 'shop.fill_codes'")
    assert ledger == [("completed", 2)]
    assert site.manage("migrate", "shop", "0002", SHOP_ENV="development").returncode == 0  # and back


def test_jobs_commit_with_the_request_transaction_or_after_it(site: Site) -> None:
    ok(site.manage("migrate", SHOP_ENV="development"))
    placed = json.loads(ok(site.manage("place_orders")))
    assert [placed[key]["status"] for key in placed] == [201, 500, 201, 500, 201]

    jobs = json.loads(ok(site.manage("x", "jobs", "ls", "--name", "shop.ship", "--json")))
    by_order = {row["payload"]["order_id"]: row for row in jobs}
    # Committed with the order: its job is there under the id enqueue returned, for the org.
    assert by_order[placed["atomic"]["order"]]["id"] == placed["atomic"]["job"]
    assert {(row["tenant_id"], row["enqueued_by"]) for row in jobs} == {("acme", "web:acme")}  # the middleware
    # Rolled back with the order: neither exists, though enqueue had returned an id.
    assert placed["atomic_failed"]["job"] not in {row["id"] for row in jobs}
    emails = {row[0] for row in site.sql("SELECT email FROM shop_order")}
    assert emails == {"ann@example.com", "cy@example.com", "ed@example.com"}
    # On commit: enqueued after the commit; never for the rolled-back one.
    assert placed["on_commit"]["order"] in by_order
    assert set(by_order) == {placed[key]["order"] for key in ("atomic", "on_commit", "autocommit")}


@pytest.mark.process
def test_a_worker_from_manage_py_runs_the_projects_jobs(site: Site) -> None:
    ok(site.manage("migrate", SHOP_ENV="development"))
    ok(site.manage("place_orders"))
    worker = subprocess.Popen([sys.executable, "manage.py", "x", "worker", "--poll-interval", "0.1"], cwd=PROJECT,
                              env=site.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if site.sql("SELECT count(*) FROM shop_order WHERE shipped")[0][0] == 3:
                break
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, output
    assert site.sql("SELECT count(*) FROM shop_order WHERE shipped")[0][0] == 3, output
    assert site.sql("SELECT count(*) FROM x_jobs WHERE name = 'shop.ship' AND state = 'done'")[0][0] == 3


def test_manage_py_x_reports_like_x(site: Site) -> None:
    bad = site.manage("x", "jobs", "ls", "--bogus")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error X_CLI_USAGE: No such option '--bogus'")
    assert "Traceback" not in bad.stderr
    assert "Usage: manage.py x" in ok(site.manage("x", "--help"))
    # call_command: the same CLI; a failure is a CommandError carrying its exit code.
    script = ("from django.core.management import call_command\n"
              "call_command('x', 'db', 'migrate')\n"
              "try:\n    call_command('x', 'jobs', 'show', 'nope')\n"
              "except Exception as error:\n    print(type(error).__name__, error.returncode)")
    assert ok(site.manage("shell", "-c", script)).strip().endswith("CommandError 2")
    # The gate in the plan and in sqlmigrate, which read no ledger.
    assert "Require backfill shop.fill_codes to have completed" in ok(site.manage("migrate", "--plan"))
    assert "Require backfill shop.fill_codes" in ok(site.manage("sqlmigrate", "shop", "0003"))


@pytest.mark.parametrize(("settings", "code", "named"), [
    ('{"DATABSE": "default"}', "X_DJANGO_SETTINGS", "'DATABSE'"),
    ('{"DATABASE": "replica"}', "X_DJANGO_SETTINGS", "'replica'"),
    ('{"ENV": "prod"}', "X_DJANGO_SETTINGS", "ENV"),
    ('{"ACTOR": "shop.tenancy.nobody"}', "X_DJANGO_SETTINGS", "shop.tenancy.nobody"),
])
def test_bad_settings_are_one_coded_line(tmp_path: Path, settings: str, code: str, named: str) -> None:
    site = Site(f"sqlite:///{tmp_path / 'shop.sqlite3'}", {"SHOP_ULTIMAT3": settings})
    command = ("place_orders",) if "ACTOR" in settings else ("x", "jobs", "ls")
    result = site.manage(*command)
    assert result.returncode != 0
    assert code in result.stderr and named in result.stderr, result.stderr


def test_an_in_memory_sqlite_database_cannot_be_the_job_store(tmp_path: Path) -> None:
    site = Site("sqlite:///:memory:")
    result = site.manage("x", "jobs", "ls")
    assert result.returncode == 2
    assert result.stderr.startswith("error X_DJANGO_SETTINGS: the Django database 'default' is an in-memory SQLite")


def test_enqueue_in_a_transaction_of_another_database_than_the_store_is_refused(tmp_path: Path) -> None:
    site = Site(f"sqlite:///{tmp_path / 'shop.sqlite3'}",
                {"SHOP_ULTIMAT3": json.dumps({"DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.sqlite3'}"})})
    # (Short of the gate: its backfill reads the job store's database, which here holds no orders.)
    ok(site.manage("migrate", "shop", "0002"))
    result = site.manage("place_orders")
    assert result.returncode != 0
    assert "X_DJANGO_TRANSACTION" in result.stderr and "enqueue_on_commit" in result.stderr
