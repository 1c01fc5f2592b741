"""A backfill pass in the foreground, with a live progress bar: batches, rows, rows/sec and an ETA."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ultimat3.cli.config import Config
from ultimat3.cli.render import console, err_console, run_json, say, visible


def run_in_foreground(config: Config, handle: Any, *, force: bool, quiet: bool, retry_failed: bool = False) -> Any:
    """Enqueue (or join) the pass and run it in this process until it settles; returns its report.
    The bar shows why the pass waits while a health check holds it, and the rows it quarantined."""
    from ultimat3.backfill import BackfillProgress, add_progress_listener, dry_run, run_backfill

    driver = config.driver()
    if retry_failed:
        total: int | None = config.call(driver.backfills.outstanding, handle.name)
    else:
        total = config.call(dry_run, handle, driver, config.environment).rows
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows · {task.fields[batches]} batches · {task.fields[rate]} rows/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
        console=err_console if quiet else console,
        disable=quiet,
    )
    task = progress.add_task(visible(handle.name), total=total, batches=0, rate="–", note="")

    def on_progress(event: BackfillProgress) -> None:
        if event.name != handle.name:
            return
        elapsed = progress.tasks[task].elapsed or 0.0
        rate = f"{event.rows / elapsed:,.0f}" if elapsed > 0 else "–"
        # `count` is rows still matching at the start, so the bar's total only grows when the
        # pass finds more than it predicted (rows inserted while it runs).
        new_total = None if total is None else max(total, event.rows)
        notes = []
        if event.throttle is not None:
            notes.append(f"[yellow]held: {escape(event.throttle)}[/]")
        if event.failures:
            notes.append(f"[red]{event.failures} quarantined[/]")
        progress.update(task, completed=event.rows, total=new_total, batches=event.batches, rate=rate,
                        note=" · ".join(notes))

    remove = add_progress_listener(on_progress)
    try:
        with progress:
            report = config.call(run_backfill, handle, force=force, driver=driver,
                                 environment=config.environment, interruptible=True, retry_failed=retry_failed)
            if not report.skipped:
                progress.update(task, completed=report.rows, total=report.rows)
    finally:
        remove()
    if not quiet:
        if report.skipped:
            say(f"{handle.name}: skipped — a pass already completed (run {report.previous_run_id}); "
                "use --force for a new pass")
        else:
            what = "quarantined rows retried" if report.kind == "retry" else "rows"
            say(f"{handle.name}: {report.rows} {what} in {report.batches} batches")
            if report.failures:
                say(f"{report.failures} row(s) quarantined: `x db backfill failures {handle.name}` lists them",
                    style="yellow")
            last = config.call(driver.backfills.list, handle.name)
            if last:
                row = run_json(last[0])
                assert row is not None
                say(f"ledger x_backfills: run {row['run_id']} {row['status']}, checksum "
                    f"{row['checksum']}, {row['batches']} batches, {row['rows']} rows")
    return report
