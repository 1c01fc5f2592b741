"""``x workers ls``: the worker registry, with what the liveness signal says of each worker."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ultimat3.cli.config import Config
from ultimat3.cli.main import cli
from ultimat3.cli.render import cell, console, emit_json, iso, say, short_time
from ultimat3.drivers.protocol import WorkerRecord


def worker_json(worker: WorkerRecord, now: float) -> dict[str, Any]:
    """The ``--json`` shape of one registered worker."""
    return {
        "id": worker.id, "host": worker.host, "pid": worker.pid, "concurrency": worker.concurrency,
        "queues": None if worker.queues is None else list(worker.queues),
        "started_at": iso(worker.started_at), "last_seen_at": iso(worker.last_seen_at),
        "last_seen_seconds_ago": round(max(0.0, now - worker.last_seen_at.timestamp()), 3),
        "alive": worker.alive, "why": worker.why, "running": list(worker.running),
        "clock_offset": worker.clock_offset, "wakeups": worker.wakeups,
    }


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _offset(value: float | None) -> str:
    return "" if value is None else f"{value:+.3f}s"


def workers_table(workers: list[WorkerRecord], now: float) -> Table:
    """``x workers ls``."""
    table = Table(header_style="bold")
    for column in ("id", "host", "pid", "queues", "slots", "started", "last seen", "running", "clock", "wake-ups",
                   "status"):
        table.add_column(column, no_wrap=column in ("id", "started"), overflow="fold")
    for w in workers:
        running = f"{len(w.running)}" + (f": {', '.join(w.running[:3])}{' …' if len(w.running) > 3 else ''}"
                                         if w.running else "")
        status = cell("alive", "green") if w.alive else cell(f"presumed dead: {w.why}", "red")
        table.add_row(
            cell(w.id), cell(w.host), str(w.pid), cell(",".join(w.queues) if w.queues else "(every queue)"),
            str(w.concurrency), short_time(w.started_at), _ago(max(0.0, now - w.last_seen_at.timestamp())),
            cell(running), _offset(w.clock_offset), cell(w.wakeups or ""), status,
        )
    return table


@cli.group("workers")
def workers_group() -> None:
    """See the workers of the fleet."""


@workers_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of workers (see docs/cli.md).")
@click.pass_obj
def ls(config: Config, as_json: bool) -> None:
    """Every registered worker: where it runs, what it runs, when it was last seen, its clock's
    offset from the database's, and whether it is alive (its database session or lock file says
    so, not a timer). A dead one is presumed so until a live worker rescues its jobs, within a
    second or so."""
    driver = config.driver()
    workers = config.call(driver.workers.list)
    now = driver.clock.now()
    if as_json:
        emit_json([worker_json(w, now) for w in workers])
        return
    if not workers:
        say("no workers registered (a worker registers while `x worker` runs)")
        return
    console.print(workers_table(workers, now))
