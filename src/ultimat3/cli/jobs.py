"""``x jobs ls|show|cancel|retry|delete|stats``: one job by id, or many by filter."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ultimat3.cli.config import Config
from ultimat3.cli.filters import build_filter, filter_options, has_filter
from ultimat3.cli.main import cli
from ultimat3.cli.render import (
    attempt_json,
    attempts_table,
    console,
    emit_json,
    err_console,
    error_group_json,
    error_groups_table,
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
from ultimat3.drivers.protocol import DEFAULT_LIST_LIMIT, FINAL_STATES, BulkAction, JobFilter, JobRecord
from ultimat3.jobs.operator import BULK_CONFIRM_ABOVE, DEFAULT_BATCH, bulk, default_actor, error_groups, preview

F = TypeVar("F", bound=Callable[..., Any])


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
@filter_options
@click.option("--group-by", type=click.Choice(["error"]),
              help="error: group the matching jobs by error code and message (counts, first and last seen, a "
                   "sample id) instead of listing them.")
@click.option("--limit", default=DEFAULT_LIST_LIMIT, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of jobs (see docs/cli.md).")
@click.pass_obj
def ls(config: Config, /, group_by: str | None, limit: int, as_json: bool, **filters: Any) -> None:
    """List jobs, newest first; or, with --group-by error, see why they died."""
    flt = build_filter(filters, time.time(), limit=limit)
    driver = config.driver()
    if group_by == "error":
        groups = config.call(error_groups, driver, flt)
        if as_json:
            emit_json([error_group_json(group) for group in groups])
        elif not groups:
            say("no matching job carries an error")
        else:
            console.print(error_groups_table(groups))
        return
    jobs = config.call(driver.introspect.list, flt)
    if as_json:
        emit_json([job_json(job) for job in jobs])
        return
    if not jobs:
        say("no jobs match")
        return
    console.print(jobs_table(jobs))


@jobs_group.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help='Print {"job", "attempts", "steps", "backfill"} as JSON.')
@click.pass_obj
def show(config: Config, job_id: str, as_json: bool) -> None:
    """One job: its row, attempts, recorded steps, last error and (for a backfill) its ledger row."""
    driver = config.driver()
    job = _get(config, job_id)
    steps = sorted(config.call(driver.steps.load, job.run_id).values(), key=lambda s: (s.created_at, s.name))
    ledger = config.call(driver.backfills.get, job.run_id)
    attempts = config.call(driver.introspect.attempts, job.id)
    if as_json:
        emit_json({"job": job_json(job), "attempts": [attempt_json(a) for a in attempts],
                   "steps": [step_json(s) for s in steps], "backfill": run_json(ledger)})
        return
    console.print(job_table(job))
    if attempts:
        console.print(attempts_table(attempts))
    if steps:
        console.print(steps_table(steps))
    if ledger is not None:
        extra = "".join([f", paused by {ledger.paused_by}" if ledger.status == "paused" else "",
                         f", {ledger.failures} rows quarantined" if ledger.failures else "",
                         f", held: {ledger.throttle}" if ledger.throttle else ""])
        say(f"backfill pass: {ledger.status}, {ledger.batches} batches, {ledger.rows} rows{extra}")


@jobs_group.command("why")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help='Print {"id", "name", "queue", "state", "waiting", "reasons"}.')
@click.pass_obj
def why(config: Config, job_id: str, as_json: bool) -> None:
    """Why a job has not started: its run_at (later, a retry's backoff, a sleep, a paused backfill),
    its queue paused, no live worker for its queue, or nothing (it is due and next in line)."""
    from ultimat3.jobs.why import why_waiting

    explained = config.call(why_waiting, config.driver(), job_id)
    if as_json:
        emit_json(explained.to_json())
        return
    job = explained.job
    say(f"job {job.id} ({job.name}, queue {job.queue}) is {job.state}")
    for reason in explained.reasons:
        say(f"  {reason.code}: {reason.text}", style="yellow" if explained.waiting and reason.code != "due" else "")


def _audited(config: Config, action: BulkAction, job_id: str, actor: str | None,
             act: Callable[[], JobRecord | None]) -> JobRecord | None:
    """One single-job operator action, recorded in the audit log like a bulk one."""
    driver = config.driver()
    entry = config.call(driver.audit.open, actor or default_actor(), action, {"ids": 1, "ids_sample": [job_id]})
    try:
        after = act()
    except BaseException:
        config.call(driver.audit.close, entry.id, "failed", 0)
        raise
    config.call(driver.audit.close, entry.id, "completed", 1)
    return after


def _cancel_one(config: Config, job_id: str, reason: str, actor: str | None, as_json: bool) -> None:
    before = _get(config, job_id)
    if before.state in FINAL_STATES:
        raise _finished(job_id, before.state, "cancelled")
    after = _audited(config, "cancel", job_id, actor, lambda: config.call(config.driver().cancel, job_id, reason))
    if after is None or after.state != "cancelled":
        # It finished between our read and the cancel: say what it is now.
        raise _finished(job_id, after.state if after is not None else "gone", "cancelled")
    if as_json:
        emit_json({"job": job_json(after), "changed": True})
        return
    say(f"cancelled {job_id} (was {before.state})")


def _retry_one(config: Config, job_id: str, actor: str | None, as_json: bool) -> None:
    before = _get(config, job_id)
    if before.state == "done":
        raise XError(f"job {job_id} is done; a finished success cannot be retried",
                     "enqueue a new run of it (for a backfill: `x db backfill NAME --force`)",
                     code="X_JOB_NOT_RETRYABLE")
    if before.state not in ("dead", "cancelled"):
        raise XError(f"job {job_id} is {before.state}; only dead or cancelled jobs can be retried",
                     "it is still live: wait for it to finish, or cancel it first (`x jobs cancel ID`)",
                     code="X_JOB_NOT_RETRYABLE")
    after = _audited(config, "retry", job_id, actor, lambda: config.call(config.driver().retry, job_id))
    if after is None or after.state != "ready":
        raise XError(f"job {job_id} changed while it was being retried (now {after.state if after else 'gone'})",
                     "look at it with `x jobs show ID` and try again", code="X_JOB_NOT_RETRYABLE")
    if as_json:
        emit_json({"job": job_json(after), "changed": True})
        return
    say(f"{job_id} is {after.state} again (was {before.state})")


_VERB = {"retry": ("retry", "retried"), "cancel": ("cancel", "cancelled"), "delete": ("delete", "deleted")}
_DOING = {"retry": "retrying", "cancel": "cancelling", "delete": "deleting"}


def _bulk(config: Config, action: BulkAction, filters: dict[str, Any], *, dry_run: bool, yes: bool,
          everything: bool, batch_size: int, actor: str | None, reason: str | None, as_json: bool) -> None:
    """A bulk action from the CLI: preview, confirm above the threshold, then batches under a bar."""
    flt = build_filter(filters, time.time())
    if everything and has_filter(filters):
        raise XError("--all was given together with a filter", "drop --all, or drop the filters to act on every "
                     "job the action can touch", code="X_CLI_USAGE")
    driver = config.driver()
    plan = config.call(preview, driver, action, flt, everything=everything)
    verb, done = _VERB[action]
    if dry_run:
        if as_json:
            emit_json({"dry_run": True, "action": action, "count": plan.count, "states": list(plan.states),
                       "filter": plan.filter, "sample": [job_json(job) for job in plan.sample]})
            return
        say(f"would {verb} {plan.count:,} job(s) in state {', '.join(plan.states)} matching {_describe(plan.filter)}")
        if plan.sample:
            console.print(jobs_table(plan.sample))
        say("nothing was changed (dry run)")
        return
    if plan.count > BULK_CONFIRM_ABOVE and not yes:
        if filters.get("ids_from") == "-" or not _interactive():
            raise XError(f"{plan.count:,} jobs match; {_DOING[action]} more than {BULK_CONFIRM_ABOVE} needs a "
                         "confirmation",
                         "look first with --dry-run, then run again with --yes", code="X_BULK_CONFIRM")
        if not click.confirm(f"{verb} {plan.count:,} jobs matching {_describe(plan.filter)}?", err=True):
            raise XError("not confirmed; nothing was changed", "run again and answer y, or pass --yes",
                         code="X_BULK_DECLINED")
    bar = Progress(TextColumn(f"[bold]{verb}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs"),
                   TimeElapsedColumn(), console=err_console, disable=as_json or not err_console.is_terminal)
    task = bar.add_task(verb, total=plan.count)
    with bar:
        outcome = config.call(bulk, driver, action, flt, actor=actor, reason=reason, batch_size=batch_size,
                              everything=everything,
                              on_batch=lambda touched, total: bar.update(task, completed=touched, total=total))
    if as_json:
        emit_json(outcome.to_json())
        return
    tail = f"; {outcome.left:,} left as they were ({_why_left(action)})" if outcome.left else ""
    say(f"{done} {outcome.touched:,} of {outcome.matched:,} matching job(s) in {outcome.batches} batch(es){tail} "
        f"— audit {outcome.audit_id}")


def _interactive() -> bool:
    """Whether a person can answer a question on standard input."""
    return sys.stdin.isatty()


def _why_left(action: BulkAction) -> str:
    if action == "retry":
        return "a live job holds their idempotency key, or they were locked throughout; run again to retry"
    return "they were locked throughout or changed meanwhile; run again to finish"


def _describe(flt: dict[str, Any]) -> str:
    shown = {key: value for key, value in flt.items() if key != "ids_sample"}
    return " ".join(f"{key}={value}" for key, value in shown.items()) or "(every job)"


def _bulk_options(command: F) -> F:
    options = [
        click.option("--dry-run", is_flag=True, help="Print the count, a sample and the exact filter; change nothing."),
        click.option("--yes", "-y", is_flag=True, help=f"Do not ask before acting on more than {BULK_CONFIRM_ABOVE} "
                                                       "jobs."),
        click.option("--all", "everything", is_flag=True, help="Act on every job the action can touch (no filter)."),
        click.option("--batch-size", default=DEFAULT_BATCH, show_default=True, type=click.IntRange(1, 10_000),
                     help="Jobs per transaction."),
        click.option("--actor", help="Who acts, for the audit log (default: cli:<your login>)."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]
    for option in reversed(options):
        command = option(command)
    return filter_options(command)


def _single(job_id: str | None, filters: dict[str, Any], flags: dict[str, Any]) -> bool:
    """Whether this is the one-job form (``x jobs retry ID``); mixing it with filters is refused."""
    if job_id is None:
        return False
    if has_filter(filters) or any(flags.values()):
        raise XError("a JOB_ID was given together with filters or bulk options",
                     "give either one JOB_ID, or filters (put several ids in a file for --ids)", code="X_CLI_USAGE")
    return True


@jobs_group.command("cancel")
@click.argument("job_id", required=False)
@click.option("--reason", default="cancelled by operator", show_default=True)
@_bulk_options
@click.pass_obj
def cancel(config: Config, /, job_id: str | None, reason: str, dry_run: bool, yes: bool, everything: bool,
           batch_size: int, actor: str | None, as_json: bool, **filters: Any) -> None:
    """Cancel a job, or every job the filters select (ready, delayed, suspended or running; --state
    narrows). A running attempt is aborted at its next heartbeat; a backfill pass's ledger row is
    closed as cancelled with it. A finished job cannot be cancelled (exit 2)."""
    if _single(job_id, filters, {"dry_run": dry_run, "yes": yes, "all": everything}):
        assert job_id is not None
        _cancel_one(config, job_id, reason, actor, as_json)
        return
    _bulk(config, "cancel", filters, dry_run=dry_run, yes=yes, everything=everything, batch_size=batch_size,
          actor=actor, reason=reason, as_json=as_json)


@jobs_group.command("retry")
@click.argument("job_id", required=False)
@_bulk_options
@click.pass_obj
def retry(config: Config, /, job_id: str | None, dry_run: bool, yes: bool, everything: bool, batch_size: int,
          actor: str | None, as_json: bool, **filters: Any) -> None:
    """Run a dead job again, or every job the filters select (dead ones; --state cancelled for
    cancelled ones). Same run: its recorded steps replay. A job whose idempotency key a live job
    holds is left as it is."""
    if _single(job_id, filters, {"dry_run": dry_run, "yes": yes, "all": everything}):
        assert job_id is not None
        _retry_one(config, job_id, actor, as_json)
        return
    _bulk(config, "retry", filters, dry_run=dry_run, yes=yes, everything=everything, batch_size=batch_size,
          actor=actor, reason=None, as_json=as_json)


@jobs_group.command("delete")
@click.argument("job_id", required=False)
@_bulk_options
@click.pass_obj
def delete(config: Config, /, job_id: str | None, dry_run: bool, yes: bool, everything: bool, batch_size: int,
           actor: str | None, as_json: bool, **filters: Any) -> None:
    """Delete a job, or every job the filters select (finished ones; --state ready, delayed or
    suspended for waiting ones), with the steps of their runs. A running job cannot be deleted:
    cancel it first."""
    if job_id is not None:
        _single(job_id, filters, {"dry_run": dry_run, "yes": yes, "all": everything})
        job = _get(config, job_id)
        if job.state == "running":
            raise XError(f"job {job_id} is running; a running job cannot be deleted",
                         "cancel it first (`x jobs cancel ID`), then delete it", code="X_JOB_RUNNING")
        outcome = config.call(bulk, config.driver(), "delete", JobFilter(ids=(job_id,), state=job.state), actor=actor)
        if outcome.touched != 1:
            raise XError(f"job {job_id} changed while it was being deleted", "look at it with `x jobs show ID`",
                         code="X_JOB_CHANGED")
        if as_json:
            emit_json(outcome.to_json())
            return
        say(f"deleted {job_id} (was {job.state})")
        return
    _bulk(config, "delete", filters, dry_run=dry_run, yes=yes, everything=everything, batch_size=batch_size,
          actor=actor, reason=None, as_json=as_json)


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
