"""Incident tools through the CLI on SQLite and Postgres: bulk retry/cancel/delete by filter,
``--dry-run``, the confirmation threshold, ``--group-by error``, ``x queues`` and ``x audit``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import X
from ultimat3.cli import cli
from ultimat3.cli import jobs as jobs_cli
from ultimat3.drivers.protocol import ClaimRequest, EnqueueRequest, JobDriver, JobFilter, NackRequest
from ultimat3.jobs import create_driver


def as_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def driver(database: str) -> Iterator[JobDriver]:
    built = create_driver(database)
    try:
        yield built
    finally:
        built.close()


def kill(driver: JobDriver, count: int, *, name: str, queue: str, error: str) -> list[str]:
    """``count`` jobs of ``name`` in ``queue``, dead with ``error``."""
    ids = [r.id for r in driver.enqueue_many([EnqueueRequest(name=name, payload={"i": i}, queue=queue)
                                              for i in range(count)])]
    left = set(ids)
    while left:
        for claimed in driver.claim(ClaimRequest("w", limit=50, queues=(queue,))):
            assert driver.nack(claimed.job.id, claimed.claim_token, NackRequest(error=error, dead_letter=True))
            left.discard(claimed.job.id)
    return ids


def states(driver: JobDriver, queue: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for job in driver.introspect.list(JobFilter(queue=queue, limit=10_000)):
        found[job.state] = found.get(job.state, 0) + 1
    return found


def test_group_by_error_finds_the_cause_then_a_filtered_retry_fixes_it(x: X, driver: JobDriver) -> None:
    kill(driver, 8, name="billing.charge", queue="billing",
         error="ConfigError: X_PAYMENT_DOWN: provider answered 503\nTraceback (most recent call last): ...")
    kill(driver, 3, name="billing.refund", queue="billing", error="ValueError: bad amount")
    kill(driver, 2, name="mail.send", queue="mail", error="ConfigError: X_PAYMENT_DOWN: unrelated")

    groups = as_json(x("jobs", "ls", "--state", "dead", "--name", "billing.*", "--group-by", "error", "--json"))
    assert [(g["code"], g["count"]) for g in groups] == [("X_PAYMENT_DOWN", 8), ("ValueError", 3)]
    assert set(groups[0]) == {"code", "message", "count", "first_seen", "last_seen", "sample_id"}
    human = x("jobs", "ls", "--state", "dead", "--group-by", "error")
    assert human.exit_code == 0 and "X_PAYMENT_DOWN" in human.stdout and "bad amount" in human.stdout

    plan = as_json(x("jobs", "retry", "--name", "billing.*", "--error", "X_PAYMENT_DOWN", "--dry-run", "--json"))
    assert (plan["dry_run"], plan["count"], plan["states"]) == (True, 8, ["dead"])
    assert plan["filter"] == {"name": "billing.*", "error": "X_PAYMENT_DOWN"} and len(plan["sample"]) == 8
    assert states(driver, "billing") == {"dead": 11}  # a dry run changes nothing

    done = as_json(x("jobs", "retry", "--name", "billing.*", "--error", "X_PAYMENT_DOWN", "--batch-size", "3",
                     "--actor", "ops:ann", "--json"))
    assert (done["matched"], done["touched"], done["left"], done["batches"] >= 3) == (8, 8, 0, True)
    assert states(driver, "billing") == {"ready": 8, "dead": 3}
    assert states(driver, "mail") == {"dead": 2}
    [entry] = as_json(x("audit", "ls", "--json"))
    assert (entry["actor"], entry["action"], entry["touched"], entry["status"]) == ("ops:ann", "retry", 8, "completed")
    assert entry["id"] == done["audit_id"]


def test_more_than_the_threshold_needs_yes_and_a_pipe_cannot_confirm(
        x: X, driver: JobDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    driver.enqueue_many([EnqueueRequest(name="wrong.job", payload={}, queue="wrong") for _ in range(120)])
    refused = x("jobs", "cancel", "--queue", "wrong")
    assert refused.exit_code == 2 and "X_BULK_CONFIRM" in refused.stderr and "--yes" in refused.stderr
    assert states(driver, "wrong") == {"ready": 120}
    monkeypatch.setattr(jobs_cli, "_interactive", lambda: True)  # a person at a terminal
    declined = X().runner.invoke(cli, ["jobs", "cancel", "--queue", "wrong"], input="n\n")
    assert declined.exit_code == 2 and "X_BULK_DECLINED" in declined.stderr
    assert "cancel 120 jobs matching queue=wrong?" in declined.stderr
    assert states(driver, "wrong") == {"ready": 120}
    confirmed = X().runner.invoke(cli, ["jobs", "cancel", "--queue", "wrong", "--state", "ready"], input="y\n")
    assert confirmed.exit_code == 0 and "cancelled 120 of 120" in confirmed.stdout
    assert states(driver, "wrong") == {"cancelled": 120}
    assert as_json(x("jobs", "retry", "--queue", "wrong", "--state", "cancelled", "--yes", "--json"))["touched"] == 120
    done = as_json(x("jobs", "cancel", "--queue", "wrong", "--yes", "--reason", "X_BAD_DEPLOY", "--json"))
    assert done["touched"] == 120
    assert {job.last_error for job in driver.introspect.list(JobFilter(queue="wrong"))} == {"X_BAD_DEPLOY"}
    human = x("jobs", "delete", "--queue", "wrong", "--state", "cancelled", "--yes")
    assert human.exit_code == 0 and "deleted 120 of 120" in human.stdout
    assert states(driver, "wrong") == {}


def test_ids_from_a_file_and_from_stdin(x: X, driver: JobDriver, tmp_path: Path) -> None:
    ids = [r.id for r in driver.enqueue_many([EnqueueRequest(name="a", payload={}, queue="q") for _ in range(5)])]
    listed = tmp_path / "ids.txt"
    listed.write_text(f"# the two from the incident\n{ids[0]}\n\n{ids[1]}\n")
    done = as_json(x("jobs", "cancel", "--ids", str(listed), "--json"))
    assert done["touched"] == 2 and done["filter"]["ids"] == 2
    piped = X().runner.invoke(cli, ["jobs", "delete", "--ids", "-", "--json"], input=f"{ids[0]}\n{ids[1]}\n")
    assert piped.exit_code == 0, piped.output
    assert json.loads(piped.stdout)["touched"] == 2
    assert sorted(job.id for job in driver.introspect.list(JobFilter(queue="q"))) == sorted(ids[2:])


def test_since_and_until_read_ages_and_iso_times(x: X, driver: JobDriver) -> None:
    kill(driver, 2, name="a", queue="q", error="boom")
    assert len(as_json(x("jobs", "ls", "--since", "1h", "--json"))) == 2
    assert as_json(x("jobs", "ls", "--until", "1h", "--json")) == []
    assert len(as_json(x("jobs", "ls", "--since", "2000-01-01T00:00Z", "--until", "2999-01-01", "--json"))) == 2


def test_single_job_delete_and_a_running_job_cannot_be_deleted(x: X, driver: JobDriver) -> None:
    job_id = driver.enqueue(EnqueueRequest(name="a", payload={})).id
    driver.claim(ClaimRequest("w"))
    refused = x("jobs", "delete", job_id)
    assert refused.exit_code == 2 and "X_JOB_RUNNING" in refused.stderr
    assert as_json(x("jobs", "cancel", job_id, "--json"))["job"]["state"] == "cancelled"
    assert "deleted" in x("jobs", "delete", job_id).stdout
    assert driver.introspect.get(job_id) is None
    actions = [e["action"] for e in as_json(x("audit", "ls", "--json"))]
    assert actions == ["delete", "cancel"]  # single-job actions are audited too


def test_queues_pause_ls_resume(x: X, driver: JobDriver) -> None:
    driver.enqueue_many([EnqueueRequest(name="a", payload={}, queue="billing") for _ in range(3)])
    kill(driver, 1, name="a", queue="mail", error="X_DOWN")
    paused = as_json(x("queues", "pause", "billing", "--actor", "ops:ann", "--json"))
    assert paused == {"queue": "billing", "state": "paused", "changed": True}
    assert "already paused" in x("queues", "pause", "billing").stdout
    assert driver.claim(ClaimRequest("w", limit=10)) == []
    listed = {q["queue"]: q for q in as_json(x("queues", "ls", "--json"))}
    billing = listed["billing"]
    assert (billing["state"], billing["depth"], billing["due"], billing["changed_by"]) == ("paused", 3, 3, "ops:ann")
    assert billing["oldest_due_seconds"] is not None and billing["oldest_due_seconds"] >= 0
    assert listed["mail"]["state"] == "active" and listed["mail"]["last_hour"]["dead"] == 1
    human = x("queues", "ls")
    assert human.exit_code == 0 and "paused" in human.stdout and "ops:ann" in human.stdout
    assert as_json(x("queues", "resume", "billing", "--json"))["changed"] is True
    assert len(driver.claim(ClaimRequest("w", limit=10))) == 3
    assert [e["action"] for e in as_json(x("audit", "ls", "--json"))] == ["resume", "pause", "pause"]


@pytest.mark.parametrize(("args", "code"), [
    (("jobs", "retry"), "X_BULK_NO_FILTER"),
    (("jobs", "delete", "--all", "--queue", "q"), "X_CLI_USAGE"),
    (("jobs", "retry", "--state", "running", "--queue", "q"), "X_BULK_STATE"),
    (("jobs", "cancel", "--state", "done"), "X_BULK_STATE"),
    (("jobs", "delete", "--state", "running"), "X_BULK_STATE"),
    (("jobs", "cancel", "--since", "last tuesday"), "X_FILTER_TIME"),
    (("jobs", "ls", "--since", "1h", "--until", "2h"), "X_FILTER_TIME"),
    (("jobs", "cancel", "--ids", "/no/such/file"), "X_FILTER_IDS"),
    (("jobs", "cancel", "--queue", ""), "X_FILTER_VALUE"),
    (("jobs", "retry", "some-id", "--queue", "q"), "X_CLI_USAGE"),
    (("jobs", "retry", "some-id", "--dry-run"), "X_CLI_USAGE"),
    (("jobs", "ls", "--group-by", "name"), "X_CLI_VALUE"),
    (("queues", "pause", ""), "X_FILTER_VALUE"),
    (("audit", "ls", "--action", "explode"), "X_CLI_VALUE"),
])
def test_bad_operator_input_is_one_coded_line_and_changes_nothing(
        x: X, driver: JobDriver, args: tuple[str, ...], code: str) -> None:
    driver.enqueue(EnqueueRequest(name="a", payload={}, queue="q"))
    result = x(*args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith(f"error {code}: ") and lines[1].startswith("  hint: ")
    assert "Traceback" not in result.output
    assert states(driver, "q") == {"ready": 1}
    assert driver.audit.list() == []
