"""``x queues ls|pause|resume``: see every queue at a glance, stop one while a cause is fixed."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ultimat3.cli.config import Config
from ultimat3.cli.main import cli
from ultimat3.cli.render import cell, console, emit_json, iso, say, short_time
from ultimat3.drivers.protocol import QueueInfo
from ultimat3.jobs.operator import pause_queue, queue_overview, resume_queue

#: The window ``x queues ls`` counts recent outcomes over.
WINDOW = 3600.0


def queue_json(info: QueueInfo) -> dict[str, Any]:
    """The ``--json`` shape of one queue."""
    return {
        "queue": info.queue, "state": "paused" if info.paused else "active", "paused": info.paused,
        "depth": info.counts["ready"] + info.counts["delayed"] + info.counts["suspended"], "due": info.due,
        "oldest_due_seconds": None if info.oldest_due_age is None else round(info.oldest_due_age, 3),
        "running": info.counts["running"], "counts": info.counts,
        "last_hour": {"done": info.done_recent, "failed": info.failed_recent, "dead": info.dead_recent},
        "changed_at": iso(info.changed_at), "changed_by": info.changed_by,
    }


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def queues_table(infos: list[QueueInfo]) -> Table:
    """``x queues ls``."""
    table = Table(header_style="bold")
    for column in ("queue", "state", "depth", "due", "oldest due", "running", "done/h", "failed/h", "dead/h",
                   "changed"):
        table.add_column(column, justify="left" if column in ("queue", "state", "changed") else "right",
                         no_wrap=column != "changed")
    for info in infos:
        depth = info.counts["ready"] + info.counts["delayed"] + info.counts["suspended"]
        state = cell("paused", "bold red") if info.paused else cell("active", "green")
        changed = f"{short_time(info.changed_at)} by {info.changed_by}" if info.changed_at is not None else ""
        table.add_row(cell(info.queue), state, f"{depth:,}", f"{info.due:,}", _age(info.oldest_due_age),
                      f"{info.counts['running']:,}", f"{info.done_recent:,}",
                      cell(f"{info.failed_recent:,}", "yellow" if info.failed_recent else ""),
                      cell(f"{info.dead_recent:,}", "red" if info.dead_recent else ""), cell(changed))
    return table


@cli.group("queues")
def queues_group() -> None:
    """See queues; pause and resume them."""


@queues_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of queues (see docs/cli.md).")
@click.pass_obj
def ls(config: Config, as_json: bool) -> None:
    """Every queue: active or paused (by whom, since when), how many jobs wait, how many are due and
    how long the oldest due one has waited, how many run, and over the last hour how many finished,
    failed an attempt (and wait to retry) or died."""
    infos = config.call(queue_overview, config.driver(), window=WINDOW)
    if as_json:
        emit_json([queue_json(info) for info in infos])
        return
    if not infos:
        say("no queues yet (a queue appears with its first job)")
        return
    console.print(queues_table(infos))


def _switch(config: Config, queue: str, actor: str | None, as_json: bool, *, pause: bool) -> None:
    act = pause_queue if pause else resume_queue
    changed = config.call(act, config.driver(), queue, actor=actor)
    state = "paused" if pause else "active"
    if as_json:
        emit_json({"queue": queue, "state": state, "changed": changed})
        return
    if pause:
        say(f"{queue} is paused: workers start nothing more from it; running attempts finish, enqueues are kept"
            if changed else f"{queue} was already paused")
    else:
        say(f"{queue} is active again: workers were woken" if changed else f"{queue} was not paused")


@queues_group.command("pause")
@click.argument("queue")
@click.option("--actor", help="Who acts, for the audit log (default: cli:<your login>).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def pause(config: Config, queue: str, actor: str | None, as_json: bool) -> None:
    """Pause QUEUE on every worker from their next claim (persisted in the database). Running
    attempts finish; enqueues are still accepted and wait."""
    _switch(config, queue, actor, as_json, pause=True)


@queues_group.command("resume")
@click.argument("queue")
@click.option("--actor", help="Who acts, for the audit log (default: cli:<your login>).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def resume(config: Config, queue: str, actor: str | None, as_json: bool) -> None:
    """Resume QUEUE and wake the workers that serve it."""
    _switch(config, queue, actor, as_json, pause=False)
