"""Output: rich tables for people, plain JSON (``--json``) with a documented, stable shape for tools."""

from __future__ import annotations

import json
import sys
import unicodedata
from dataclasses import asdict
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ultimat3.drivers.protocol import AttemptRecord, BackfillRun, ErrorGroup, JobRecord, QueueStats, StepRecord

# Piped output (CI logs, `| less`) gets a readable width instead of rich's 80-column default.
_PIPE_WIDTH = 160
console = Console(width=None if sys.stdout.isatty() else _PIPE_WIDTH)
err_console = Console(stderr=True, soft_wrap=True)

STATE_STYLE = {
    "ready": "cyan", "delayed": "blue", "running": "yellow", "suspended": "magenta",
    "done": "green", "dead": "red", "cancelled": "bright_black",
    # Attempt outcomes (x jobs show).
    "failed": "red", "released": "bright_black", "lapsed": "yellow", "lost": "red",
}


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(value: object, *, multiline: bool = False) -> str:
    """``value`` as text a terminal shows as it is: control, format (bidi, zero-width) and
    surrogate characters written as ``\\xNN``/``\\uNNNN`` escapes, so a stored string cannot move the
    cursor, retitle the window, clear the screen or fake output. Newlines and tabs are kept only
    when ``multiline``."""
    text = str(value)
    out = []
    for char in text:
        if multiline and char in "\n\t":
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(_escape(char))
        else:
            out.append(char)
    return "".join(out)


def cell(value: object, style: str = "") -> Text:
    """A table cell (or printed value) from the database: plain text, never rich markup."""
    return Text("" if value is None else visible(value), style=style)


def say(message: str, style: str = "") -> None:
    """Print one line of output built from stored values, as plain text (no markup parsed)."""
    console.print(Text(visible(message, multiline=True), style=style), highlight=False)


def iso(value: datetime | None) -> str | None:
    """An ISO-8601 UTC timestamp, or ``None``."""
    return None if value is None else value.isoformat()


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def job_json(job: JobRecord) -> dict[str, Any]:
    """The ``--json`` shape of one job (every field of :class:`JobRecord`, times as ISO strings)."""
    return {k: _plain(v) for k, v in asdict(job).items()}


def step_json(step: StepRecord) -> dict[str, Any]:
    """The ``--json`` shape of one recorded step."""
    return {"name": step.name, "result": step.result, "created_at": iso(step.created_at)}


def attempt_json(attempt: AttemptRecord) -> dict[str, Any]:
    """The ``--json`` shape of one attempt."""
    return {k: _plain(v) for k, v in asdict(attempt).items() if k != "job_id"}


def run_json(run: BackfillRun | None) -> dict[str, Any] | None:
    """The ``--json`` shape of one ``x_backfills`` row."""
    return None if run is None else {k: _plain(v) for k, v in asdict(run).items()}


def stats_json(stats: list[QueueStats]) -> list[dict[str, Any]]:
    """The ``--json`` shape of queue stats."""
    return [{"queue": s.queue, "counts": s.counts} for s in stats]


def emit_json(value: Any) -> None:
    """Print ``value`` as JSON on stdout (no colour, no wrapping)."""
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


def short_time(value: datetime | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` for tables."""
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def styled_state(state: str) -> Text:
    """A state with its colour, for tables."""
    return cell(state, STATE_STYLE.get(state, "white"))


def jobs_table(jobs: list[JobRecord]) -> Table:
    """``x jobs ls``."""
    table = Table(show_lines=False, header_style="bold")
    for column in ("id", "name", "queue", "state", "attempt", "tenant", "created", "last error"):
        table.add_column(column, no_wrap=column in ("id", "name", "created"), overflow="ellipsis")
    for job in jobs:
        error = (job.last_error or "").splitlines()[0][:60] if job.last_error else ""
        table.add_row(cell(job.id), cell(job.name), cell(job.queue), styled_state(job.state),
                      f"{job.attempt}/{job.max_attempts}", cell(job.tenant_id), short_time(job.created_at), cell(error))
    return table


def job_table(job: JobRecord) -> Table:
    """``x jobs show``: one row per field."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in job_json(job).items():
        if key in ("payload", "result"):
            value = json.dumps(value)
        if key == "state":
            table.add_row(key, styled_state(str(value)))
            continue
        table.add_row(key, Text("" if value is None else visible(value, multiline=key == "last_error")))
    return table


def steps_table(steps: list[StepRecord]) -> Table:
    """The recorded steps of a run."""
    table = Table(header_style="bold", title="steps")
    table.add_column("step")
    table.add_column("recorded")
    table.add_column("result", overflow="fold")
    for step in steps:
        table.add_row(cell(step.name), short_time(step.created_at), cell(json.dumps(step.result)[:200]))
    return table


def attempts_table(attempts: list[AttemptRecord]) -> Table:
    """Every attempt of a job: worker, start, end, outcome, error."""
    table = Table(header_style="bold", title="attempts")
    for column in ("#", "outcome", "worker", "started", "ended", "error"):
        table.add_column(column, overflow="fold" if column == "error" else "ellipsis")
    for a in attempts:
        error = (a.error or "").splitlines()[0][:120] if a.error else ""
        table.add_row(str(a.attempt), styled_state(a.outcome), cell(a.worker_id), short_time(a.started_at),
                      short_time(a.ended_at), cell(error))
    return table


def stats_table(stats: list[QueueStats]) -> Table:
    """``x jobs stats``."""
    states = ("ready", "delayed", "running", "suspended", "done", "dead", "cancelled")
    table = Table(header_style="bold")
    table.add_column("queue")
    for state in states:
        table.add_column(state, justify="right")
    for s in stats:
        table.add_row(cell(s.queue), *(str(s.counts.get(state, 0)) for state in states))
    return table


def error_group_json(group: ErrorGroup) -> dict[str, Any]:
    """The ``--json`` shape of one error group (``x jobs ls --group-by error``)."""
    return {"code": group.code, "message": group.message, "count": group.count,
            "first_seen": iso(group.first_seen), "last_seen": iso(group.last_seen), "sample_id": group.sample_id}


def error_groups_table(groups: list[ErrorGroup]) -> Table:
    """``x jobs ls --group-by error``: the biggest group first."""
    table = Table(header_style="bold")
    table.add_column("jobs", justify="right")
    table.add_column("code", no_wrap=True)
    table.add_column("error", overflow="fold")
    table.add_column("first seen", no_wrap=True)
    table.add_column("last seen", no_wrap=True)
    table.add_column("sample id", no_wrap=True)
    for group in groups:
        table.add_row(f"{group.count:,}", cell(group.code or "", "red"), cell(group.message[:200]),
                      short_time(group.first_seen), short_time(group.last_seen), cell(group.sample_id))
    return table
