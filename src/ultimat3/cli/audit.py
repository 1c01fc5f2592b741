"""``x audit ls``: what operators did, who, when, to what, and how many jobs it touched."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from ultimat3.cli.config import Config
from ultimat3.cli.main import cli
from ultimat3.cli.render import cell, console, emit_json, iso, say, short_time
from ultimat3.drivers.protocol import AuditEntry
from ultimat3.jobs.operator import audit_log

_STATUS_STYLE = {"completed": "green", "running": "yellow", "interrupted": "red", "failed": "red"}


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    """The ``--json`` shape of one audit entry."""
    return {"id": entry.id, "at": iso(entry.at), "actor": entry.actor, "action": entry.action, "target": entry.target,
            "touched": entry.touched, "status": entry.status, "finished_at": iso(entry.finished_at)}


def audit_table(entries: list[AuditEntry]) -> Table:
    """``x audit ls``."""
    table = Table(header_style="bold")
    for column in ("at", "actor", "action", "target", "jobs", "status", "id"):
        table.add_column(column, justify="right" if column == "jobs" else "left",
                         overflow="fold" if column == "target" else "ellipsis", no_wrap=column != "target")
    for entry in entries:
        target = json.dumps(entry.target, separators=(", ", ": "))
        table.add_row(short_time(entry.at), cell(entry.actor), cell(entry.action), cell(target), f"{entry.touched:,}",
                      cell(entry.status, _STATUS_STYLE.get(entry.status, "")), cell(entry.id))
    return table


@cli.group("audit")
def audit_group() -> None:
    """The audit trail of operator actions."""


@audit_group.command("ls")
@click.option("--action", type=click.Choice(["retry", "cancel", "delete", "pause", "resume"]))
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of entries (see docs/cli.md).")
@click.pass_obj
def ls(config: Config, action: str | None, limit: int, as_json: bool) -> None:
    """Operator actions, newest first: bulk retries, cancels and deletes (with their filter and how
    many jobs each touched; `running` means it is still going or its process died midway), single-job
    actions, and queue pauses and resumes."""
    entries = config.call(audit_log, config.driver(), limit=limit, action=action)
    if as_json:
        emit_json([audit_json(entry) for entry in entries])
        return
    if not entries:
        say("no operator action recorded yet")
        return
    console.print(audit_table(entries))
