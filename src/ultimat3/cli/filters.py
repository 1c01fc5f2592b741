"""The job filter options ``x jobs ls`` and the bulk actions share, and how their values read."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from ultimat3.core.errors import XError
from ultimat3.drivers.filters import validate_filter
from ultimat3.drivers.protocol import JOB_STATES, JobFilter, JobState

F = TypeVar("F", bound=Callable[..., Any])

#: At most this many ids are read from ``--ids`` (a bigger list is a mistake, or wants a filter).
MAX_IDS = 1_000_000
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_FILTER_KEYS = ("queue", "name", "state", "tenant_id", "error", "since", "until", "ids")


def filter_options(command: F) -> F:
    """Add ``--queue --name --state --tenant --error --since --until --ids`` to ``command``."""
    options = [
        click.option("--queue", help="Only this queue."),
        click.option("--name", help="Only this job name; * matches any run of characters (billing.*)."),
        click.option("--state", type=click.Choice(JOB_STATES), help="Only jobs in this state."),
        click.option("--tenant", "tenant_id", help="Only this tenant's jobs."),
        click.option("--error", help="Only jobs whose last error contains this text (a code such as X_WORKER_LOST, "
                                     "an exception type, any words of the message)."),
        click.option("--since", metavar="WHEN", help="Only jobs that last changed state at or after WHEN: an age "
                                                      "(30m, 2h, 1d) or an ISO time (2026-12-03T14:00Z; UTC when "
                                                      "no offset is given)."),
        click.option("--until", metavar="WHEN", help="Only jobs that last changed state before WHEN (as --since)."),
        click.option("--ids", "ids_from", metavar="FILE", help="Only the job ids listed in FILE, one per line "
                                                                "(- reads standard input)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def parse_when(text: str, now: float, *, option: str) -> float:
    """``--since``/``--until``: an age before ``now`` (``30m``) or an ISO-8601 time, as epoch seconds."""
    match = _AGO.match(text)
    if match is not None:
        return now - float(match.group(1)) * _UNIT[match.group(2)]
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise XError(f"{option} {text!r} is neither an age nor an ISO time",
                     f"write an age such as {option} 2h (s, m, h, d, w) or a time such as "
                     f"{option} 2026-12-03T14:00Z", code="X_FILTER_TIME") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.timestamp()
    except (OverflowError, OSError, ValueError):  # pragma: no cover - fromisoformat bounds years already
        raise XError(f"{option} {text!r} is not a time a row can hold", "give a time within years 1970..9999",
                     code="X_FILTER_TIME") from None


def read_ids(source: str) -> tuple[str, ...]:
    """The ids of ``--ids FILE`` (or ``-``): one per line, blank lines and ``#`` comments skipped."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise XError(f"--ids {source!r} cannot be read: {error}",
                     "give a readable UTF-8 file with one job id per line, or - for standard input",
                     code="X_FILTER_IDS") from None
    ids = [line.strip() for line in text.splitlines()]
    ids = [job_id for job_id in ids if job_id and not job_id.startswith("#")]
    if not ids:
        raise XError(f"--ids {source!r} holds no job id", "list one job id per line (from `x jobs ls --json`)",
                     code="X_FILTER_IDS")
    if len(ids) > MAX_IDS:
        raise XError(f"--ids {source!r} holds {len(ids):,} ids, more than {MAX_IDS:,}",
                     "select them with a filter (--queue, --name, --error, --since) instead", code="X_FILTER_IDS")
    return tuple(dict.fromkeys(ids))


def build_filter(values: dict[str, Any], now: float, *, limit: int = 100) -> JobFilter:
    """A :class:`JobFilter` from the parsed options (refused with a coded error when a value is bad)."""
    since = values.get("since")
    until = values.get("until")
    ids_from = values.get("ids_from")
    flt = JobFilter(
        queue=values.get("queue"), name=values.get("name"), state=cast(JobState | None, values.get("state")),
        tenant_id=values.get("tenant_id"), error=values.get("error"), limit=limit,
        since=None if since is None else parse_when(since, now, option="--since"),
        until=None if until is None else parse_when(until, now, option="--until"),
        ids=None if ids_from is None else read_ids(ids_from),
    )
    if flt.since is not None and flt.until is not None and flt.since >= flt.until:
        raise XError(f"--since {since!r} is not before --until {until!r}", "give --since earlier than --until",
                     code="X_FILTER_TIME")
    validate_filter(flt)
    return flt


def has_filter(values: dict[str, Any]) -> bool:
    """Whether any filter option was given."""
    return any(values.get(key) is not None for key in (*_FILTER_KEYS, "ids_from"))
