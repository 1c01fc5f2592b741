"""The README's backfill and schedule examples declare what they say, and the README's first command works."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ultimat3.backfill.registry import get_backfill, registered_backfills
from ultimat3.jobs import isolated_registry

ROOT = Path(__file__).resolve().parents[2]


def readme_block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    matching = [block for block in blocks if marker in block]
    assert len(matching) == 1, f"one README python block containing {marker!r}"
    return matching[0]


def test_readme_backfill_example_declares_a_backfill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with isolated_registry():
        # Compiled from a file of its own: inspect.getsource (the declaration's checksum reads the
        # handler's source) must find these lines, not README.md's first ones.
        source = tmp_path / "readme_backfills.py"
        source.write_text(readme_block("myapp/backfills.py"), encoding="utf-8")
        exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), {"__name__": "readme_example"})
        [declared] = [d.to_json() for d in registered_backfills()]
        assert declared["name"] == "shop.normalize_emails"
        assert declared["requires"] == "20261201_add_email_index"
        assert declared["environments"] == ["staging", "production"]
        assert declared["counts"] is True
        assert get_backfill("shop.normalize_emails") is not None


def test_readme_schedule_example_declares_two_schedules_that_fire(tmp_path: Path) -> None:
    from ultimat3.core.clock import ManualClock
    from ultimat3.drivers.memory.driver import MemoryDriver
    from ultimat3.jobs.scheduler import Scheduler, declared_schedules

    with isolated_registry():
        source = tmp_path / "readme_schedules.py"
        source.write_text(readme_block("reports.daily"), encoding="utf-8")
        exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), {"__name__": "readme_schedules"})
        declared = declared_schedules()
        assert [d.key for d in declared] == ["reports.daily:nightly", "reports.daily:refresh"]
        clock = ManualClock(1_800_000_000.0)
        driver = MemoryDriver(clock)
        scheduler = Scheduler(driver, declared)
        scheduler.run_once(clock.now())
        clock.advance(86_400)
        assert {key for key, _ in scheduler.run_once(clock.now())} == {"reports.daily:nightly",
                                                                      "reports.daily:refresh"}


def test_readme_async_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from ultimat3.drivers import create_driver

    monkeypatch.chdir(tmp_path)
    with isolated_registry():
        source = tmp_path / "readme_async.py"
        source.write_text(readme_block("users.welcome"), encoding="utf-8")
        exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), {"__name__": "readme_async"})
    driver = create_driver("sqlite:///app.db")
    try:
        jobs = driver.introspect.list()
        assert sorted(job.payload["email"] for job in jobs) == ["ann@example.com", "bob@example.com"]
        assert {job.enqueued_by for job in jobs} == {"ops:readme"}
    finally:
        driver.close()
    conn = sqlite3.connect("app.db")
    try:
        assert conn.execute("SELECT email FROM users").fetchall() == [("ann@example.com",)]
    finally:
        conn.close()


@pytest.mark.process
def test_readme_first_command_runs_the_demo(tmp_path: Path) -> None:
    """`python examples/demo.py` (the part after the install) on a copy of examples/."""
    copy = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", copy, ignore=shutil.ignore_patterns("*.db*", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("X_DATABASE_URL", "X_APP", "X_ENV")}
    result = subprocess.run([sys.executable, str(copy / "demo.py")], capture_output=True, text=True, timeout=180,
                            env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "seeded 20,000 customers" in out
    assert "shop.normalize_emails would visit" in out
    assert re.search(r"shop\.normalize_emails: \d+ rows in \d+ batches", out)
    assert "ledger x_backfills: run" in out and "completed" in out
    assert out.rstrip().count("no pending backfills") == 1
    assert "shop.normalize_emails" in out.split("$ x --app shop.jobs jobs ls")[1]


def test_readme_testing_example_runs_as_written(tmp_path: Path) -> None:
    namespace: dict[str, object] = {"__name__": "readme_testing_example"}
    source = tmp_path / "readme_test_invoices.py"
    source.write_text(readme_block("tests/test_invoices.py"), encoding="utf-8")
    exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), namespace)
    test = namespace["test_a_reminder_is_sent_once_then_followed_up"]
    assert callable(test)
    test()


def test_readme_flow_control_example_enforces_what_it_says(tmp_path: Path) -> None:
    from ultimat3.core.clock import ManualClock
    from ultimat3.drivers.memory.driver import MemoryDriver
    from ultimat3.drivers.protocol import ClaimRequest
    from ultimat3.jobs import get_job
    from ultimat3.tenancy import operator_context

    with isolated_registry():
        source = tmp_path / "readme_flow.py"
        source.write_text(readme_block("crm.sync"), encoding="utf-8")
        exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), {"__name__": "readme_flow"})
        sync, send, reindex = (get_job(name) for name in ("crm.sync", "mail.send", "search.reindex"))
        assert sync is not None and send is not None and reindex is not None
        clock = ManualClock(1_800_000_000.0)
        driver = MemoryDriver(clock)
        with operator_context("ops:readme", "the README's flow example"):
            for _ in range(3):
                sync.enqueue({"org_id": "acme"}, driver=driver)
            for n in range(20):
                send.enqueue({"org_id": f"o{n}", "to": "a@example.com"}, driver=driver)
            first = reindex.enqueue(driver=driver)
            second = reindex.enqueue(driver=driver)
        clock.advance(1)
        claimed = driver.claim(ClaimRequest(worker_id="w", limit=100, flow=True))
        by_name = [c.job.name for c in claimed]
        assert by_name.count("crm.sync") == 2  # 2 per org
        assert by_name.count("mail.send") == 14  # the burst, shared across orgs by group="smtp"
        assert by_name.count("search.reindex") == 1
        old = driver.introspect.get(first.id)
        assert old is not None and old.state == "cancelled" and second.id != first.id
