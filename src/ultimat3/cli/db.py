"""``x db migrate|prune|backfill``: the library's schema, retention, and the backfill deploy gate."""

from __future__ import annotations

from typing import Any

import click

from ultimat3.backfill.gate import PendingBackfill, backfill_status, hold_reason, pending_backfills
from ultimat3.cli.config import Config
from ultimat3.cli.main import cli
from ultimat3.cli.render import cell, console, emit_json, run_json, say, short_time
from ultimat3.core.errors import XError
from ultimat3.jobs.duration import parse_duration


@cli.group("db")
def db_group() -> None:
    """The library's tables and the backfills that run over yours."""


@db_group.command("migrate")
@click.option("--json", "as_json", is_flag=True, help='Print {"applied": [...], "all": [...]}.')
@click.pass_obj
def migrate(config: Config, as_json: bool) -> None:
    """Create or upgrade the library's tables (idempotent)."""
    driver = config.driver(migrate=False)
    applied = config.call(driver.migrate)
    every = [m.id for m in config.call(driver.migrations.applied)]
    if as_json:
        emit_json({"applied": applied, "all": every})
        return
    if applied:
        for migration_id in applied:
            say(f"applied {migration_id}")
    else:
        say(f"up to date ({len(every)} migrations applied)")


@db_group.command("health")
@click.option("--json", "as_json", is_flag=True, help='Print {"database", "measured", "oldest_snapshot"}.')
@click.pass_obj
def health(config: Config, as_json: bool) -> None:
    """What slows a queue down from outside: the transaction holding the database's oldest open
    snapshot (PostgreSQL; VACUUM keeps every row version newer than it), who it is and for how long;
    on SQLite, a reader that keeps the WAL from being checkpointed (it grows with every write)."""
    driver = config.driver()
    measure = getattr(driver, "oldest_snapshot", None)
    holder = config.call(measure) if callable(measure) else None
    if as_json:
        emit_json({"database": driver.name, "measured": callable(measure),
                   "oldest_snapshot": None if holder is None else {
                       "kind": holder.kind, "pid": holder.pid, "application_name": holder.application_name,
                       "state": holder.state, "backend_type": holder.backend_type, "age_seconds": round(holder.age, 3),
                       "query": holder.query}})
        return
    if not callable(measure):
        say(f"oldest open snapshot: not measured on {driver.name} (PostgreSQL and SQLite only)")
    elif holder is None:
        say("oldest open snapshot: none (no transaction is open)")
    else:
        say(f"oldest open snapshot: {holder.describe()}" + (f"\n  query: {holder.query}" if holder.query else ""))


@db_group.command("prune")
@click.option("--older-than", default="7d", show_default=True, help='Finished jobs older than this ("7d", "12h").')
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def prune(config: Config, older_than: str, as_json: bool) -> None:
    """Delete finished jobs (done, dead, cancelled) and their steps after a retention period."""
    seconds = parse_duration(older_than, what="--older-than")
    deleted = config.call(config.driver().prune, seconds)
    if as_json:
        emit_json({"deleted": deleted})
        return
    say(f"deleted {deleted} finished job(s) older than {older_than}")


# -- backfills ------------------------------------------------------------------------------------


def _pending_json(item: PendingBackfill) -> dict[str, Any]:
    return {**item.declaration.to_json(), "reason": item.reason, "last_completed": run_json(item.last)}


def _pending_table(pending: list[PendingBackfill]) -> None:
    from rich.table import Table

    table = Table(header_style="bold", title="pending backfills")
    for column in ("name", "reason", "checksum", "last completed", "requires", "environments"):
        table.add_column(column)
    for item in pending:
        d = item.declaration
        last = "" if item.last is None else f"{short_time(item.last.finished_at)} ({item.last.checksum})"
        table.add_row(cell(d.name), item.reason, cell(d.checksum), cell(last), cell(d.requires or ""),
                      cell(", ".join(d.environments or []) or "every"))
    console.print(table)


class _BackfillGroup(click.Group):
    """``x db backfill`` is both a command (``x db backfill [NAME] [--flags]``) and a group
    (``pause``/``resume``/``failures NAME``): anything that is not a subcommand's name goes to
    ``run``, so the deploy-gate spellings stay as they were."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


@db_group.group("backfill", cls=_BackfillGroup)
def backfill_group() -> None:
    """Run, gate, steer and inspect backfills (`x db backfill --help` shows the run options)."""


@backfill_group.command("run")
@click.argument("name", required=False)
@click.option("--pending", "show_pending", is_flag=True,
              help="List declared backfills not completed under their current checksum.")
@click.option("--check", is_flag=True, help="Exit 1 when any backfill is pending (a deploy gate).")
@click.option("--allow-none", is_flag=True,
              help="With --pending/--check/--enqueue-pending: the app declares no backfill, and that is fine.")
@click.option("--enqueue-pending", is_flag=True,
              help="Enqueue every pending backfill whose requires is applied and whose environments include X_ENV.")
@click.option("--dry-run", is_flag=True, help="With NAME: say how many rows, batches and seconds; write nothing.")
@click.option("--sample", type=int, default=None, metavar="N",
              help="With --dry-run: run the first N real batches in a transaction that is rolled back, and "
                   "report rows touched, time per batch, the projected duration and the page query's plan "
                   "(needs transactional=True on the backfill).")
@click.option("--force", is_flag=True, help="With NAME: run a new pass even though one completed.")
@click.option("--retry-failed", is_flag=True,
              help="With NAME: run a pass over exactly the rows earlier passes quarantined.")
@click.option("--wait", is_flag=True, help="With NAME: run the pass here in the foreground with a progress bar.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def backfill_command(config: Config, name: str | None, show_pending: bool, check: bool, allow_none: bool,
                     enqueue_pending: bool, dry_run: bool, sample: int | None, force: bool, retry_failed: bool,
                     wait: bool, as_json: bool) -> None:
    """Run, gate and inspect backfills. Without NAME or a flag: list every declared backfill.

    Also: `x db backfill pause NAME` (stop at the next batch boundary), `resume NAME` (go on from the
    last checkpoint, same ledger row), `failures NAME` (the rows its passes quarantined). A backfill
    named like one of those is run as `x db backfill run NAME`.
    """
    config.load_apps()
    modes = sum([show_pending, check, enqueue_pending, name is not None])
    if modes > 1:
        raise XError("pass one of NAME, --pending, --check or --enqueue-pending",
                     "e.g. `x db backfill --pending`, or `x db backfill NAME --wait`", code="X_CLI_USAGE")
    if name is None and (dry_run or force or wait or retry_failed or sample is not None):
        raise XError("--dry-run, --sample, --force, --retry-failed and --wait act on one backfill and need its NAME",
                     "write `x db backfill NAME --wait`", code="X_CLI_USAGE")
    if sample is not None and not dry_run:
        raise XError(f"--sample {sample} runs real batches only inside a dry run",
                     f"write `x db backfill {name} --dry-run --sample {sample}`", code="X_CLI_USAGE")
    if force and retry_failed:
        raise XError("--force runs a whole new pass and --retry-failed only the quarantined rows: pick one",
                     f"write `x db backfill {name} --retry-failed --wait`", code="X_CLI_USAGE")
    if show_pending or check:
        pending = config.call(pending_backfills, config.driver(), allow_none=allow_none)
        if as_json:
            emit_json([_pending_json(p) for p in pending])
        elif pending:
            _pending_table(pending)
        else:
            say("no pending backfills")
        if check and pending:
            if not as_json:
                say(f"{len(pending)} backfill(s) pending: " + ", ".join(p.name for p in pending), style="red")
            raise click.exceptions.Exit(1)
        return
    if enqueue_pending:
        _enqueue_pending(config, as_json, allow_none=allow_none)
        return
    if name is not None:
        _one(config, name, dry_run=dry_run, sample=sample, force=force, retry_failed=retry_failed, wait=wait,
             as_json=as_json)
        return
    _list_all(config, as_json)


def _list_all(config: Config, as_json: bool) -> None:
    from rich.table import Table

    rows = config.call(backfill_status, config.driver())
    if as_json:
        emit_json([{**row.declaration.to_json(), "pending": row.pending, "deciding_run": run_json(row.deciding),
                    "latest_run": run_json(row.latest),
                    "runs": [run_json(r) for r in config.call(config.driver().backfills.list, row.declaration.name)]}
                   for row in rows])
        return
    if not rows:
        say("no backfills are declared (pass --app with the module that declares them)")
        return
    table = Table(header_style="bold", title="backfills")
    for column in ("name", "checksum", "gate", "deciding pass (last completed)", "latest pass"):
        table.add_column(column, overflow="fold")
    for row in rows:
        gate = cell("done", "green") if row.pending is None else cell(f"pending: {row.pending}", "yellow")
        deciding = "never completed" if row.deciding is None else (
            f"{row.deciding.run_id} · {row.deciding.batches} batches · {row.deciding.rows} rows · "
            f"{short_time(row.deciding.finished_at)}"
            + (f" · {row.deciding.failures} failed" if row.deciding.failures else ""))
        latest = ""
        if row.latest is not None and (row.deciding is None or row.latest.run_id != row.deciding.run_id):
            latest = _run_line(row.latest)
        elif row.latest is not None:
            latest = "(the same pass)"
        if row.pending == "failed-rows":
            latest += f" · {config.call(config.driver().backfills.outstanding, row.declaration.name)} quarantined"
        table.add_row(cell(row.declaration.name), cell(row.declaration.checksum), gate, cell(deciding),
                      cell(latest or "never run"))
    console.print(table)


def _run_line(run: Any) -> str:
    """One pass for a person: id, status (and who paused it, why it is held), counts."""
    status = run.status
    if run.status == "paused":
        status = f"paused by {run.paused_by}"
    elif run.status == "running" and run.paused_by:
        status = f"running (pause asked by {run.paused_by})"
    kind = "" if run.kind == "pass" else f"{run.kind} · "
    line = f"{run.run_id} · {kind}{status} · {run.batches} batches · {run.rows} rows"
    if run.failures:
        line += f" · {run.failures} failed"
    if run.throttle:
        line += f" · held: {run.throttle}"
    return line


def _resolve(name: str) -> Any:
    from ultimat3.backfill.registry import get_backfill, registered_backfills

    handle = get_backfill(name)
    if handle is None:
        known = ", ".join(d.name for d in registered_backfills()) or "none are declared"
        raise XError(f"no backfill named {name!r} is declared (known: {known})",
                     "check the name, and pass --app with the module that declares it",
                     code="X_BACKFILL_UNKNOWN")
    return handle


def _enqueue_pending(config: Config, as_json: bool, *, allow_none: bool) -> None:
    from ultimat3.backfill.registry import get_backfill

    driver = config.driver()
    enqueued, held = [], []
    for item in config.call(pending_backfills, driver, allow_none=allow_none):
        declaration = item.declaration
        if item.reason == "failed-rows":
            # Its pass completed; sweeping again would not fix the rows it could not handle.
            held.append({"name": declaration.name, "code": "X_BACKFILL_FAILED_ROWS",
                         "reason": f"rows are quarantined: fix them, then `x db backfill {declaration.name} "
                                   "--retry-failed`"})
            continue
        reason = config.call(hold_reason, driver, config.environment, declaration)
        if reason is not None:
            held.append({"name": declaration.name, "code": reason.code, "reason": reason.message})
            continue
        handle = get_backfill(declaration.name)
        assert handle is not None
        # A pass completed under an older checksum would be skipped by the ledger rule, so the
        # deploy trigger forces it: the code changed, so this is a different sweep.
        result = config.call(lambda h=handle, f=item.reason == "checksum-changed":
                             h.enqueue({"force": f}, driver=driver))
        enqueued.append({"name": declaration.name, "job_id": result.id, "deduped": result.deduped,
                         "forced": item.reason == "checksum-changed"})
    if as_json:
        emit_json({"enqueued": enqueued, "held": held})
        return
    for e in enqueued:
        note = " (already queued)" if e["deduped"] else ""
        say(f"enqueued {e['name']} as job {e['job_id']}{note}")
    for h in held:
        say(f"held {h['name']}: {h['code']}: {h['reason']}", style="yellow")
    if not enqueued and not held:
        say("no pending backfills")


def _one(config: Config, name: str, *, dry_run: bool, sample: int | None, force: bool, retry_failed: bool,
         wait: bool, as_json: bool) -> None:
    from ultimat3.backfill import dry_run as plan_dry_run
    from ultimat3.backfill.registry import declaration_of

    handle = _resolve(name)
    driver = config.driver()
    declaration = declaration_of(handle)
    assert declaration is not None
    reason = config.call(hold_reason, driver, config.environment, declaration)
    if reason is not None:
        raise reason
    if dry_run and sample is not None:
        from ultimat3.backfill.sample import sample as run_sample

        measured = config.call(run_sample, handle, sample, driver, config.environment)
        if as_json:
            emit_json(measured.to_json())
        else:
            _sample_table(measured)
        return
    if retry_failed and config.call(driver.backfills.outstanding, name) == 0:
        raise XError(f'backfill "{name}" has no quarantined rows to retry',
                     f"`x db backfill failures {name}` lists them when there are some", code="X_BACKFILL_NO_FAILURES")
    if dry_run:
        plan = config.call(plan_dry_run, handle, driver, config.environment)
        if as_json:
            emit_json({"name": name, "rows": plan.rows, "batches": plan.batches, "seconds": plan.seconds})
            return
        if plan.rows is None:
            say(f"{name}: no count= declared, so a dry run cannot say how many rows it would visit")
        else:
            say(f"{name} would visit {plan.rows} rows in ~{plan.batches} batches, "
                f"~{_human(plan.seconds)} at its declared rate")
        return
    if wait:
        from ultimat3.cli.progress import run_in_foreground

        report = run_in_foreground(config, handle, force=force, quiet=as_json, retry_failed=retry_failed)
        if as_json:
            emit_json(report.to_dict())
        return
    result = config.call(lambda: handle.enqueue({"force": force, "retry_failed": retry_failed}, driver=driver))
    if as_json:
        emit_json({"name": name, "job_id": result.id, "run_id": result.run_id, "deduped": result.deduped})
        return
    note = " (a pass was already queued or running; this is the same pass)" if result.deduped else ""
    say(f"enqueued {name} as job {result.id}{note}")


def _sample_table(measured: Any) -> None:
    from rich.table import Table

    per = measured.seconds
    table = Table(header_style="bold", title=f"{measured.name}: a sample of {measured.batches} batch(es), rolled back")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("rows read and handled", f"{measured.rows:,}")
    table.add_row("rows its statements changed", f"{measured.touched:,}")
    if measured.failed:
        table.add_row("rows it would quarantine", f"{measured.failed:,}")
    if per:
        table.add_row("time per batch (mean / max)", f"{sum(per) / len(per) * 1000:.1f} ms / {max(per) * 1000:.1f} ms")
    table.add_row("rows the pass would visit", "?" if measured.total_rows is None else f"{measured.total_rows:,}")
    if measured.projected_seconds is not None:
        table.add_row("projected pass",
                      f"~{measured.projected_batches:,} batches, ~{_human(measured.projected_seconds)}")
    console.print(table)
    console.print("page query plan:", style="bold")
    console.print(measured.plan, markup=False, highlight=False)
    if measured.sequential_scan:
        say("the page query scans the whole table: every batch reads it again. Index the key (or the "
            "source's filter) before running this pass on a big table", style="yellow")


def _human(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _declared(config: Config, name: str) -> str:
    config.load_apps()
    _resolve(name)
    return name


@backfill_group.command("pause")
@click.argument("name")
@click.option("--actor", help="Who acts, for the ledger and the audit log (default: cli:<your login>).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def pause_command(config: Config, name: str, actor: str | None, as_json: bool) -> None:
    """Stop the running pass of NAME at its next batch boundary (status `paused`)."""
    from ultimat3.backfill.control import pause_backfill

    run = config.call(pause_backfill, config.driver(), _declared(config, name), actor=actor)
    if as_json:
        emit_json(run_json(run))
        return
    say(f"asked pass {run.run_id} of {name} to pause: it stops at its next batch boundary (the batch in "
        f"flight finishes); {run.batches} batches / {run.rows} rows so far; `x db backfill resume {name}` goes on")


@backfill_group.command("resume")
@click.argument("name")
@click.option("--actor", help="Who acts, for the audit log (default: cli:<your login>).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def resume_command(config: Config, name: str, actor: str | None, as_json: bool) -> None:
    """Resume the paused pass of NAME from its last checkpoint (the same ledger row)."""
    from ultimat3.backfill.control import resume_backfill

    run = config.call(resume_backfill, config.driver(), _declared(config, name), actor=actor)
    if as_json:
        emit_json(run_json(run))
        return
    say(f"resumed pass {run.run_id} of {name} at {run.batches} batches / {run.rows} rows: a worker goes on "
        "from its last checkpoint")


@backfill_group.command("failures")
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--after", help="Keyset paging: only keys after this one (as printed in --json).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def failures_command(config: Config, name: str, limit: int, after: str | None, as_json: bool) -> None:
    """The rows NAME's passes quarantined (batch.fail), by key, with their reasons."""
    from rich.table import Table

    from ultimat3.backfill.control import quarantined
    from ultimat3.backfill.cursor import decode_failure_key

    driver = config.driver()
    rows = config.call(quarantined, driver, _declared(config, name), limit=limit, after=after)
    total = config.call(driver.backfills.outstanding, name)
    if as_json:
        emit_json({"name": name, "outstanding": total,
                   "failures": [{"key": f.key, "value": str(decode_failure_key(f.key)), "reason": f.reason,
                                 "run_id": f.run_id, "batch": f.batch, "failed_at": f.failed_at.isoformat()}
                                for f in rows]})
        return
    if not rows:
        say(f"{name} has no quarantined rows")
        return
    table = Table(header_style="bold", title=f"{name}: {total:,} quarantined row(s)")
    for column in ("key", "reason", "batch", "pass", "failed"):
        table.add_column(column, overflow="fold")
    for f in rows:
        table.add_row(cell(str(decode_failure_key(f.key))), cell(f.reason), str(f.batch), cell(f.run_id),
                      short_time(f.failed_at))
    console.print(table)
    if total > len(rows):
        say(f"showing {len(rows)} of {total:,}: page on with --after '{rows[-1].key}'")
    say(f"fix them, then `x db backfill {name} --retry-failed --wait` re-runs exactly these rows")
