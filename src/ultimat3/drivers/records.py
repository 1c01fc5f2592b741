"""Rows to records, written once for every SQL driver.

Each dialect hands over its row (a mapping by column name) and how it stores two things: a time
(SQLite: epoch seconds; PostgreSQL: ``timestamptz``) and a JSON value (SQLite: text; PostgreSQL:
``jsonb``, already decoded). Everything else about the mapping is the same, so it lives here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from datetime import datetime
from typing import Any, Protocol, cast

from ultimat3.drivers.protocol import (
    WORKER_LOST,
    AttemptOutcome,
    AttemptRecord,
    BackfillKind,
    BackfillRun,
    BackfillStatus,
    JobRecord,
    JobState,
    Lease,
    RowFailure,
)

__all__ = ["Decoders", "attempt_history", "attempt_record", "backfill_run", "ended_outcome", "job_record", "lease",
           "row_failure"]

class Row(Protocol):
    """A row readable by column name (a dict, a ``sqlite3.Row``, a psycopg ``dict_row``)."""

    def __getitem__(self, key: str, /) -> Any: ...


class Decoders:
    """How a dialect stores times and JSON: ``time(stored) -> aware UTC datetime`` and
    ``json(stored) -> value`` (``None`` stays ``None`` for both)."""

    __slots__ = ("json", "time")

    def __init__(self, time: Callable[[Any], datetime], json: Callable[[Any], Any]) -> None:
        self.time = time
        self.json = json

    def time_or_none(self, value: Any) -> datetime | None:
        """``None`` for a NULL column, else :attr:`time`."""
        return None if value is None else self.time(value)

    def json_or_none(self, value: Any) -> Any:
        """``None`` for a NULL column, else :attr:`json`."""
        return None if value is None else self.json(value)


#: Every field of :class:`JobRecord`, which :func:`job_record` fills without its ``__init__``.
_JOB_FIELDS: frozenset[str] = frozenset(field.name for field in fields(JobRecord))


def job_record(row: Row, decode: Decoders) -> JobRecord:
    """An ``x_jobs`` row as the :class:`JobRecord` every driver reports.

    Built by filling the instance's ``__dict__``: a frozen dataclass's ``__init__`` sets its 27
    fields one ``object.__setattr__`` at a time (3.5 us, a claim pays it per job); this is the
    same record (equal, frozen afterwards) for about half of that. The fields filled are
    checked against the class's at import (``_JOB_FIELDS``), so a new field cannot be missed.
    """
    record: JobRecord = object.__new__(JobRecord)
    record.__dict__.update(_job_values(row, decode))
    return record


def _job_values(row: Row, decode: Decoders) -> dict[str, Any]:
    return dict(
        id=row["id"],
        run_id=row["run_id"],
        name=row["name"],
        queue=row["queue"],
        payload=decode.json(row["payload"]),
        state=cast(JobState, row["state"]),
        priority=row["priority"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        run_at=decode.time(row["run_at"]),
        created_at=decode.time(row["created_at"]),
        updated_at=decode.time(row["updated_at"]),
        idempotency_key=row["idempotency_key"],
        tenant_id=row["tenant_id"],
        traceparent=row["traceparent"],
        enqueued_by=row["enqueued_by"],
        claimed_by=row["claimed_by"],
        visible_at=decode.time_or_none(row["visible_at"]),
        finished_at=decode.time_or_none(row["finished_at"]),
        last_error=row["last_error"],
        result=decode.json_or_none(row["result"]),
        flow_key=row["flow_key"],
        flow_max=row["flow_max"],
        rate_key=row["rate_key"],
        rate_per_second=row["rate_per_second"],
        rate_burst=row["rate_burst"],
        started_at=decode.time_or_none(row["started_at"]),
    )


def _check_job_fields() -> None:
    class _Any(dict[str, Any]):
        def __missing__(self, key: str) -> Any:
            return None

    filled = set(_job_values(_Any(), Decoders(time=lambda value: value, json=lambda value: value)))
    if filled != _JOB_FIELDS:  # pragma: no cover - a development error, caught on import
        raise AssertionError(f"job_record fills {sorted(filled ^ _JOB_FIELDS)} unlike JobRecord's fields")


_check_job_fields()


def attempt_record(row: Row, decode: Decoders) -> AttemptRecord:
    """An ``x_attempts`` row: an attempt that ended other than by success."""
    return AttemptRecord(
        job_id=row["job_id"],
        attempt=row["attempt"],
        outcome=cast(AttemptOutcome, row["outcome"]),
        worker_id=row["worker_id"],
        started_at=decode.time_or_none(row["started_at"]),
        ended_at=decode.time(row["ended_at"]),
        error=row["error"],
    )


def ended_outcome(state: str, old_attempt: int, new_attempt: int, error: str | None) -> AttemptOutcome:
    """How a running attempt ended, from the row it left behind: the rule x_jobs_attempt_ended
    applies in SQL (the memory driver applies it here)."""
    if state == "running":
        return "lapsed"
    if state in ("dead", "cancelled", "suspended"):
        return cast(AttemptOutcome, state)
    if new_attempt < old_attempt:
        return "released"
    if error is not None and error.startswith(WORKER_LOST.split(":", 1)[0]):
        return "lost"
    return "failed"


def attempt_history(job: JobRecord | None, ended: list[AttemptRecord]) -> list[AttemptRecord]:
    """The whole history: the attempts ``x_attempts`` recorded, then the one the job row itself
    holds -- the attempt running now, or the one that succeeded (the hot path writes no history
    row for it: the row's ``claimed_by``, ``started_at`` and ``finished_at`` are that attempt)."""
    if job is None:
        return []
    history = list(ended)
    if job.state == "running" or (job.state == "done" and job.attempt > 0):
        history.append(AttemptRecord(
            job_id=job.id, attempt=job.attempt, outcome="running" if job.state == "running" else "done",
            worker_id=job.claimed_by, started_at=job.started_at,
            ended_at=job.finished_at if job.state == "done" else None))
    return history


def backfill_run(row: Row, decode: Decoders) -> BackfillRun:
    """An ``x_backfills`` row as a :class:`BackfillRun`."""
    return BackfillRun(
        run_id=row["run_id"],
        name=row["name"],
        checksum=row["checksum"],
        status=cast(BackfillStatus, row["status"]),
        batches=row["batches"],
        rows=row["rows"],
        started_at=decode.time(row["started_at"]),
        job_id=row["job_id"],
        finished_at=decode.time_or_none(row["finished_at"]),
        error=row["error"],
        kind=cast(BackfillKind, row["kind"]),
        failures=row["failures"],
        throttle=row["throttle"],
        paused_by=row["paused_by"],
    )


def row_failure(row: Row, decode: Decoders) -> RowFailure:
    """An ``x_backfill_failures`` row as a :class:`RowFailure`."""
    return RowFailure(name=row["name"], key=row["key"], reason=row["reason"], run_id=row["run_id"],
                      batch=row["batch"], failed_at=decode.time(row["failed_at"]))


def lease(row: Row, decode: Decoders) -> Lease:
    """An ``x_leases`` row as a :class:`Lease`."""
    return Lease(key=row["key"], slot=row["slot"], holder=row["holder"], token=row["token"],
                 expires_at=decode.time(row["expires_at"]))
