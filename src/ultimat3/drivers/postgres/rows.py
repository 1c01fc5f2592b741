"""The PostgreSQL driver's statements, cursors, and how its rows and values read (timestamptz, jsonb)."""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import psycopg
from psycopg.rows import RowMaker, dict_row, tuple_row
from psycopg.types.json import Jsonb

from ultimat3.drivers.protocol import (
    BackfillRun,
    ClaimedJob,
    JobFilter,
    JobRecord,
    Lease,
)
from ultimat3.drivers.records import Decoders, backfill_run, job_record, lease
from ultimat3.drivers.sql import load_queries
from ultimat3.drivers.values import (
    strict_dumps,
)

T = TypeVar("T")
Conn = psycopg.Connection[Any]
Row = dict[str, Any]

#: The NOTIFY channel enqueues announce themselves on.
DEFAULT_CHANNEL: Final = "x_jobs"
_SCHEMES: Final = ("postgres", "postgresql", "postgresql+psycopg")
_FINISHED_BACKFILL: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled"})
_EVERY_JOB: Final = JobFilter()
#: Rows deleted per prune statement: bounded so a big prune never holds long locks or a huge WAL burst.
PRUNE_CHUNK: Final = 1000
# How often an enqueue re-runs when the live row it collided with finished before it could be read.
_RACE_RETRIES: Final = 8
# How long subscribe() waits for LISTEN to be in effect before returning anyway.
_LISTEN_READY_TIMEOUT: Final = 5.0
#: ``prepare=`` for the statements that settle a claim (ack, nack, heartbeat, step record, passed
#: rows): planned on every execution, never from a cached generic plan. A plan cached while x_jobs
#: was small (a fresh install, right after a prune) scans the whole table, and keeps doing so as it
#: grows until something invalidates it; planned afresh, a primary-key lookup wins as soon as the
#: table is more than a few pages (planning one costs ~0.1 ms).
_PLAN_EACH_TIME: Final = False
#: Every named statement of ``queries.sql``, parsed once at import.
_Q: Final = load_queries("ultimat3.drivers.postgres")


def _utc(value: datetime) -> datetime:
    """A timestamptz as the aware UTC datetime every driver reports, whatever the session zone
    (the driver's own sessions are set to UTC, so their values pass through as they are)."""
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def _utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else _utc(value)


def _session_utc(conn: Conn) -> None:
    """A new pooled connection's set-up: times in UTC (``session_utc``)."""
    conn.execute(_Q["session_utc"])


def _as_is(text: Any) -> str:
    """``dumps`` for a value already serialised (and validated) by :func:`_json_text`."""
    return str(text)


def _json_text(value: Any) -> str:
    """``value`` as JSON text, refusing what a ``jsonb`` column refuses (NaN and infinities too).

    Raises ``TypeError``/``ValueError`` like the memory driver, before anything reaches the server.
    """
    return strict_dumps(value)


def _jsonb(value: Any) -> Jsonb:
    return Jsonb(_json_text(value), dumps=_as_is)


#: PostgreSQL stores times as timestamptz and JSON as jsonb (decoded by psycopg already).
_DECODE = Decoders(time=_utc, json=lambda value: value)


def _job(row: Row) -> JobRecord:
    return job_record(row, _DECODE)


def _backfill(row: Row) -> BackfillRun:
    return backfill_run(row, _DECODE)


def _lease(row: Row) -> Lease:
    return lease(row, _DECODE)


#: A claimed row: the job with its token, then the head of the claim order its statement saw
#: (``head_priority``, ``head_run_at``, ``head_id``; NULLs where a statement keeps no cursor).
ClaimedRow = tuple[ClaimedJob, int | None, datetime | None, str | None]
_JOB_NAMES: Final = tuple(field.name for field in fields(JobRecord))
#: The columns of every claim, in order: ``_claimed`` in queries.sql, then the head.
CLAIMED_COLUMNS: Final = (*_JOB_NAMES, "claim_token", "head_priority", "head_run_at", "head_id")
_TOKEN_AT: Final = len(_JOB_NAMES)
_TIMES: Final = ("run_at", "created_at", "updated_at", "visible_at", "finished_at", "started_at")
if set(_TIMES) != {f.name for f in fields(JobRecord) if "datetime" in str(f.type)}:  # pragma: no cover
    raise AssertionError("rows._TIMES must name every datetime field of JobRecord")  # caught on import


def claimed_rows(cursor: psycopg.Cursor[Any]) -> RowMaker[ClaimedRow]:
    """A row factory for the claim statements: each row straight to a :class:`ClaimedJob` by
    position, with no dict per row (psycopg's ``dict_row`` plus a record built by column name
    cost ~6 us a claimed job more: ``bench/budget.py``). The record is the one :func:`_job` builds
    (equal, frozen); the statement's columns are checked against :data:`CLAIMED_COLUMNS` first."""
    names = tuple(column.name for column in cursor.description or ())
    if names != CLAIMED_COLUMNS:
        # Refused when a row is read, not here: a claim's cursor also runs statements whose rows
        # nobody reads (claim_plan's set_config). A claim row read here is a development error:
        # queries.sql's _claimed drifted from JobRecord.
        def refuse(values: Any) -> ClaimedRow:
            raise AssertionError(f"a claim returned {names}, not {CLAIMED_COLUMNS}")

        return refuse
    loads, new, times, at = json.loads, object.__new__, _TIMES, _TOKEN_AT

    def make(values: Any) -> ClaimedRow:
        job = dict(zip(_JOB_NAMES, values, strict=False))  # stops at the token: the job's own columns
        job["payload"] = loads(job["payload"])  # sent as text (see _claimed)
        for name in times:
            value = job[name]
            if value is not None and value.tzinfo is not UTC:
                job[name] = value.astimezone(UTC)
        record: JobRecord = new(JobRecord)
        record.__dict__.update(job)
        claimed: ClaimedJob = new(ClaimedJob)
        claimed.__dict__.update(job=record, claim_token=values[at])
        return claimed, values[at + 1], values[at + 2], values[at + 3]

    return make


def _claimed(conn: Conn) -> psycopg.Cursor[ClaimedRow]:
    """A cursor for the claim statements (see :func:`claimed_rows`)."""
    return conn.cursor(row_factory=claimed_rows)


def _rows(conn: Conn) -> psycopg.Cursor[Row]:
    """A cursor yielding dicts, whatever row factory the connection (maybe a caller's) has."""
    return conn.cursor(row_factory=dict_row)


def _tuples(conn: Conn) -> psycopg.Cursor[tuple[Any, ...]]:
    return conn.cursor(row_factory=tuple_row)
