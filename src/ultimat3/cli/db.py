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


@db_group.command("backfill")
@click.argument("name", required=False)
@click.option("--pending", "show_pending", is_flag=True,
              help="List declared backfills not completed under their current checksum.")
@click.option("--check", is_flag=True, help="Exit 1 when any backfill is pending (a deploy gate).")
@click.option("--allow-none", is_flag=True,
              help="With --pending/--check/--enqueue-pending: the app declares no backfill, and that is fine.")
@click.option("--enqueue-pending", is_flag=True,
              help="Enqueue every pending backfill whose requires is applied and whose environments include X_ENV.")
@click.option("--dry-run", is_flag=True, help="With NAME: say how many rows, batches and seconds; write nothing.")
@click.option("--force", is_flag=True, help="With NAME: run a new pass even though one completed.")
@click.option("--wait", is_flag=True, help="With NAME: run the pass here in the foreground with a progress bar.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def backfill_command(config: Config, name: str | None, show_pending: bool, check: bool, allow_none: bool,
                     enqueue_pending: bool, dry_run: bool, force: bool, wait: bool, as_json: bool) -> None:
    """Run, gate and inspect backfills. Without NAME or a flag: list every declared backfill."""
    config.load_apps()
    modes = sum([show_pending, check, enqueue_pending, name is not None])
    if modes > 1:
        raise XError("pass one of NAME, --pending, --check or --enqueue-pending",
                     "e.g. `x db backfill --pending`, or `x db backfill NAME --wait`", code="X_CLI_USAGE")
    if name is None and (dry_run or force or wait):
        raise XError("--dry-run, --force and --wait act on one backfill and need its NAME",
                     "write `x db backfill NAME --wait`", code="X_CLI_USAGE")
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
        _one(config, name, dry_run=dry_run, force=force, wait=wait, as_json=as_json)
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
            f"{short_time(row.deciding.finished_at)}")
        latest = ""
        if row.latest is not None and (row.deciding is None or row.latest.run_id != row.deciding.run_id):
            latest = (f"{row.latest.run_id} · {row.latest.status} · {row.latest.batches} batches · "
                      f"{row.latest.rows} rows")
        elif row.latest is not None:
            latest = "(the same pass)"
        table.add_row(cell(row.declaration.name), cell(row.declaration.checksum), gate, cell(deciding),
                      cell(latest or "never run"))
    console.print(table)


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


def _one(config: Config, name: str, *, dry_run: bool, force: bool, wait: bool, as_json: bool) -> None:
    from ultimat3.backfill import dry_run as plan_dry_run
    from ultimat3.backfill.registry import declaration_of

    handle = _resolve(name)
    driver = config.driver()
    declaration = declaration_of(handle)
    assert declaration is not None
    reason = config.call(hold_reason, driver, config.environment, declaration)
    if reason is not None:
        raise reason
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

        report = run_in_foreground(config, handle, force=force, quiet=as_json)
        if as_json:
            emit_json(report.to_dict())
        return
    result = config.call(lambda: handle.enqueue({"force": force}, driver=driver))
    if as_json:
        emit_json({"name": name, "job_id": result.id, "run_id": result.run_id, "deduped": result.deduped})
        return
    note = " (a pass was already queued or running; this is the same pass)" if result.deduped else ""
    say(f"enqueued {name} as job {result.id}{note}")


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
