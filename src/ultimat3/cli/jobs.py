"""``x jobs ls|show|cancel|retry|stats``."""

from __future__ import annotations

from typing import cast

import click

from ultimat3.cli.config import Config
from ultimat3.cli.main import cli
from ultimat3.cli.render import (
    console,
    emit_json,
    job_json,
    job_table,
    jobs_table,
    run_json,
    say,
    stats_json,
    stats_table,
    step_json,
    steps_table,
)
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import DEFAULT_LIST_LIMIT, FINAL_STATES, JOB_STATES, JobFilter, JobRecord, JobState


def _get(config: Config, job_id: str) -> JobRecord:
    job = config.call(config.driver().introspect.get, job_id)
    if job is None:
        raise XError(f"no job has id {job_id!r}", "copy an id from `x jobs ls`", code="X_JOB_NOT_FOUND")
    return job


def _finished(job_id: str, state: str, verb: str) -> XError:
    return XError(f"job {job_id} is {state}; a finished job cannot be {verb}",
                  "nothing to do: it already ended (`x jobs show ID` says how); `x jobs retry ID` reruns a dead or "
                  "cancelled one", code="X_JOB_NOT_CANCELLABLE")


@cli.group("jobs")
def jobs_group() -> None:
    """Inspect and steer jobs."""


@jobs_group.command("ls")
@click.option("--queue")
@click.option("--name")
@click.option("--state", type=click.Choice(JOB_STATES))
@click.option("--tenant", "tenant_id")
@click.option("--limit", default=DEFAULT_LIST_LIMIT, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of jobs (see docs/cli.md).")
@click.pass_obj
def ls(config: Config, queue: str | None, name: str | None, state: str | None, tenant_id: str | None,
       limit: int, as_json: bool) -> None:
    """List jobs, newest first."""
    flt = JobFilter(queue=queue, name=name, state=cast(JobState | None, state), tenant_id=tenant_id, limit=limit)
    jobs = config.call(config.driver().introspect.list, flt)
    if as_json:
        emit_json([job_json(job) for job in jobs])
        return
    if not jobs:
        say("no jobs match")
        return
    console.print(jobs_table(jobs))


@jobs_group.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help='Print {"job", "steps", "backfill"} as JSON.')
@click.pass_obj
def show(config: Config, job_id: str, as_json: bool) -> None:
    """One job: its row, attempts, recorded steps, last error and (for a backfill) its ledger row."""
    driver = config.driver()
    job = _get(config, job_id)
    steps = sorted(config.call(driver.steps.load, job.run_id).values(), key=lambda s: (s.created_at, s.name))
    ledger = config.call(driver.backfills.get, job.run_id)
    if as_json:
        emit_json({"job": job_json(job), "steps": [step_json(s) for s in steps], "backfill": run_json(ledger)})
        return
    console.print(job_table(job))
    if steps:
        console.print(steps_table(steps))
    if ledger is not None:
        say(f"backfill pass: {ledger.status}, {ledger.batches} batches, {ledger.rows} rows")


@jobs_group.command("cancel")
@click.argument("job_id")
@click.option("--reason", default="cancelled by operator", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def cancel(config: Config, job_id: str, reason: str, as_json: bool) -> None:
    """Cancel a job; a running attempt is aborted at its next heartbeat. A finished job cannot be
    cancelled (exit 2); a backfill pass's ledger row is closed as cancelled with it."""
    before = _get(config, job_id)
    if before.state in FINAL_STATES:
        raise _finished(job_id, before.state, "cancelled")
    after = config.call(config.driver().cancel, job_id, reason)
    if after is None or after.state != "cancelled":
        # It finished between our read and the cancel: say what it is now.
        raise _finished(job_id, after.state if after is not None else "gone", "cancelled")
    if as_json:
        emit_json({"job": job_json(after), "changed": True})
        return
    say(f"cancelled {job_id} (was {before.state})")


@jobs_group.command("retry")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def retry(config: Config, job_id: str, as_json: bool) -> None:
    """Run a dead or cancelled job again (same run: its recorded steps replay)."""
    before = _get(config, job_id)
    if before.state == "done":
        raise XError(f"job {job_id} is done; a finished success cannot be retried",
                     "enqueue a new run of it (for a backfill: `x db backfill NAME --force`)",
                     code="X_JOB_NOT_RETRYABLE")
    if before.state not in ("dead", "cancelled"):
        raise XError(f"job {job_id} is {before.state}; only dead or cancelled jobs can be retried",
                     "it is still live: wait for it to finish, or cancel it first (`x jobs cancel ID`)",
                     code="X_JOB_NOT_RETRYABLE")
    after = config.call(config.driver().retry, job_id)
    if after is None or after.state != "ready":
        raise XError(f"job {job_id} changed while it was being retried (now {after.state if after else 'gone'})",
                     "look at it with `x jobs show ID` and try again", code="X_JOB_NOT_RETRYABLE")
    if as_json:
        emit_json({"job": job_json(after), "changed": True})
        return
    say(f"{job_id} is {after.state} again (was {before.state})")


@jobs_group.command("stats")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def stats(config: Config, as_json: bool) -> None:
    """Jobs per queue and state."""
    result = config.call(config.driver().introspect.stats)
    if as_json:
        emit_json(stats_json(result))
        return
    console.print(stats_table(result))
