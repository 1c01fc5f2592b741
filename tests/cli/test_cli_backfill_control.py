"""`x db backfill` steering a pass: failures and --retry-failed, pause/resume, --dry-run --sample,
and the one coded line each bad input gets (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli import cli_app
from tests.cli.conftest import X
from ultimat3.drivers import create_driver
from ultimat3.jobs import ClaimRequest, NackRequest

REFUSED = list(range(97, 1001, 97))


def as_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refused(result: Any, code: str) -> str:
    assert result.exit_code == 2, result.output
    assert code in result.stderr and "hint:" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    return str(result.stderr)


def test_failures_gate_and_retry_failed(x: X) -> None:
    report = as_json(x("db", "backfill", "cli.careful", "--wait", "--json"))
    assert (report["rows"], report["failures"], report["kind"]) == (1000, len(REFUSED), "pass")
    listed = as_json(x("db", "backfill", "failures", "cli.careful", "--json"))
    assert listed["outstanding"] == len(REFUSED)
    assert sorted(int(f["value"]) for f in listed["failures"]) == REFUSED
    assert listed["failures"][0]["reason"].startswith("widget ")
    page = as_json(x("db", "backfill", "failures", "cli.careful", "--limit", "3", "--json"))
    after = as_json(x("db", "backfill", "failures", "cli.careful", "--after", page["failures"][-1]["key"], "--json"))
    assert len(page["failures"]) == 3 and len(after["failures"]) == len(REFUSED) - 3
    table = x("db", "backfill", "failures", "cli.careful")
    assert table.exit_code == 0 and "quarantined row(s)" in table.stdout and "--retry-failed" in table.stdout

    # The gate holds it, and --enqueue-pending will not sweep it again for nothing.
    pending = {p["name"]: p["reason"] for p in as_json(x("db", "backfill", "--pending", "--json"))}
    assert pending["cli.careful"] == "failed-rows"
    enqueued = as_json(x("db", "backfill", "--enqueue-pending", "--json"))
    held = {h["name"]: h["code"] for h in enqueued["held"]}
    assert held["cli.careful"] == "X_BACKFILL_FAILED_ROWS"
    assert "cli.careful" not in {e["name"] for e in enqueued["enqueued"]}
    listing = x("db", "backfill")
    assert "pending: failed-rows" in listing.stdout

    cli_app.refused.clear()  # the data is fixed
    retry = as_json(x("db", "backfill", "cli.careful", "--retry-failed", "--wait", "--json"))
    assert (retry["kind"], retry["rows"], retry["failures"]) == ("retry", len(REFUSED), 0)
    assert as_json(x("db", "backfill", "failures", "cli.careful", "--json"))["outstanding"] == 0
    pending = {p["name"] for p in as_json(x("db", "backfill", "--pending", "--json"))}
    assert "cli.careful" not in pending
    refused(x("db", "backfill", "cli.careful", "--retry-failed"), "X_BACKFILL_NO_FAILURES")


def test_a_sample_runs_batches_and_leaves_nothing(x: X) -> None:
    measured = as_json(x("db", "backfill", "cli.careful", "--dry-run", "--sample", "2", "--json"))
    assert (measured["batches"], measured["rows"], measured["failed"]) == (2, 200, 2)
    assert measured["touched"] == 198 and measured["total_rows"] == 1000 and measured["projected_batches"] == 10
    assert measured["plan"]
    human = x("db", "backfill", "cli.careful", "--dry-run", "--sample", "1")
    assert human.exit_code == 0 and "rolled back" in human.stdout and "page query plan" in human.stdout
    # Nothing was written: the widgets are as seeded, no ledger row, no quarantine.
    again = as_json(x("db", "backfill", "cli.careful", "--dry-run", "--json"))
    assert again["name"] == "cli.careful"
    declared = next(d for d in as_json(x("db", "backfill", "--json")) if d["name"] == "cli.careful")
    assert declared["runs"] == []
    assert as_json(x("db", "backfill", "failures", "cli.careful", "--json"))["outstanding"] == 0


@pytest.mark.parametrize(("args", "code"), [
    (("db", "backfill", "cli.shout", "--dry-run", "--sample", "2"), "X_BACKFILL_SAMPLE"),
    (("db", "backfill", "cli.careful", "--dry-run", "--sample", "0"), "X_BACKFILL_SAMPLE"),
    (("db", "backfill", "cli.careful", "--sample", "2"), "X_CLI_USAGE"),
    (("db", "backfill", "--sample", "2"), "X_CLI_USAGE"),
    (("db", "backfill", "cli.careful", "--force", "--retry-failed"), "X_CLI_USAGE"),
    (("db", "backfill", "pause", "cli.careful"), "X_BACKFILL_NOT_RUNNING"),
    (("db", "backfill", "resume", "cli.careful"), "X_BACKFILL_NOT_PAUSED"),
    (("db", "backfill", "pause", "cli.nope"), "X_BACKFILL_UNKNOWN"),
    (("db", "backfill", "failures", "cli.nope"), "X_BACKFILL_UNKNOWN"),
])
def test_bad_steering_gets_one_coded_line(x: X, args: tuple[str, ...], code: str) -> None:
    message = refused(x(*args), code)
    assert message.count("\n") <= 2


def test_pause_and_resume_through_the_ledger(x: X, database: str) -> None:
    driver = create_driver(database)
    try:
        queued = cli_app.careful.enqueue(driver=driver)
        [claimed] = driver.claim(ClaimRequest("w1", names=("cli.careful",)))
        driver.backfills.start(queued.run_id, "cli.careful", "c", queued.id)
        asked = as_json(x("db", "backfill", "pause", "cli.careful", "--actor", "ops@example.com", "--json"))
        assert (asked["run_id"], asked["status"], asked["paused_by"]) == (queued.run_id, "running", "ops@example.com")
        latest = next(d for d in as_json(x("db", "backfill", "--json")) if d["name"] == "cli.careful")["latest_run"]
        assert (latest["status"], latest["paused_by"]) == ("running", "ops@example.com")
        # The pass reaches a batch boundary and parks (what the sweep does).
        assert driver.backfills.progress(queued.run_id, 3, 300)
        assert driver.backfills.pause(queued.run_id)
        assert driver.nack(queued.id, claimed.claim_token, NackRequest(delay=60, counts_as_attempt=False))
        latest = next(d for d in as_json(x("db", "backfill", "--json")) if d["name"] == "cli.careful")["latest_run"]
        assert (latest["status"], latest["paused_by"], latest["rows"]) == ("paused", "ops@example.com", 300)
        shown = x("jobs", "show", queued.id)
        assert shown.exit_code == 0 and "backfill pass: paused, 3 batches, 300 rows, paused by ops@example.com" in (
            " ".join(shown.stdout.split()))
        said = x("db", "backfill", "resume", "cli.careful")
        assert said.exit_code == 0 and f"resumed pass {queued.run_id}" in said.stdout and "300 rows" in said.stdout
        run = driver.backfills.get(queued.run_id)
        job = driver.introspect.get(queued.id)
        assert run is not None and (run.status, run.paused_by) == ("running", None)
        assert job is not None and job.state == "suspended" and job.run_at <= job.updated_at
        actions = [(e["action"], e["actor"], e["target"]) for e in as_json(x("audit", "ls", "--json"))]
        assert ("pause", "ops@example.com", {"backfill": "cli.careful"}) in actions
        assert any(a == "resume" and t == {"backfill": "cli.careful"} for a, _, t in actions)
    finally:
        driver.close()
