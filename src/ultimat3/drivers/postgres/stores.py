"""The PostgreSQL driver's stores: introspection, steps, the backfill ledger, leases, migrations."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Sequence
from typing import Any

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import ConfigError, XError
from ultimat3.drivers.errors import StepResultError
from ultimat3.drivers.filters import error_code, storable_filter
from ultimat3.drivers.flow import Bucket
from ultimat3.drivers.postgres.database import _caller_connection, _Database
from ultimat3.drivers.postgres.operations import pg_filter
from ultimat3.drivers.postgres.rows import (
    _DECODE,
    _EVERY_JOB,
    _FINISHED_BACKFILL,
    _PLAN_EACH_TIME,
    _Q,
    Conn,
    Row,
    _backfill,
    _job,
    _jsonb,
    _lease,
    _rows,
    _tuples,
    _utc,
)
from ultimat3.drivers.protocol import (
    JOB_STATES,
    MAX_REASON_LENGTH,
    AttemptRecord,
    BackfillKind,
    BackfillRun,
    BackfillStatus,
    Completed,
    ErrorGroup,
    JobFilter,
    JobRecord,
    JobState,
    Lease,
    MigrationRecord,
    QueueStats,
    RowFailure,
    StepRecord,
    WaitingName,
)
from ultimat3.drivers.records import attempt_history, attempt_record, row_failure
from ultimat3.drivers.values import (
    check_backfill_kind,
    check_bucket,
    check_step_name,
    fenced_key,
    filter_is_storable,
    is_storable_text,
    quarantine_rows,
    require_text,
    storable,
    unknown_key,
)


class PostgresIntrospection:
    """The read side, for the CLI and dashboards."""

    def __init__(self, db: _Database) -> None:
        self._db = db

    @unknown_key(lambda: None)
    def get(self, job_id: str) -> JobRecord | None:
        """One job, or ``None`` when no job has that id."""
        row = self._db.run(lambda conn, _: _rows(conn).execute(_Q["job_get"], {"id": job_id}).fetchone())
        return None if row is None else _job(row)

    @unknown_key(lambda: [])
    def slot_holders(self, flow_key: str) -> list[JobRecord]:
        """The running jobs under ``flow_key``, oldest claim first."""
        rows = self._db.run(lambda conn, _: _rows(conn).execute(_Q["flow_holders"], {"key": flow_key}).fetchall())
        return [_job(row) for row in rows]

    def completions(self, since: float, bucket: float = 60.0) -> list[Completed]:
        """Jobs finished ``done`` since ``since``, per queue and ``bucket`` seconds."""
        check_bucket(bucket)
        params = {"since": to_datetime(since), "bucket": bucket}
        rows = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["job_completions"], params).fetchall())
        return [Completed(queue, to_datetime(float(at)), int(done)) for queue, at, done in rows]

    @unknown_key(lambda: [])
    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """Every attempt of ``job_id``, oldest first (history read before the row: an attempt that
        ends between the two reads shows once, as the row's)."""
        def read(conn: Conn, _: Any) -> tuple[list[Row], Row | None]:
            ended = _rows(conn).execute(_Q["attempts_of"], {"id": job_id}).fetchall()
            return ended, _rows(conn).execute(_Q["job_get"], {"id": job_id}).fetchone()

        ended, row = self._db.run(read)
        return attempt_history(None if row is None else _job(row), [attempt_record(r, _DECODE) for r in ended])

    @unknown_key(lambda: None)
    def rate_bucket(self, rate_key: str) -> Bucket | None:
        """The bucket of ``rate_key`` as stored."""
        row = self._db.run(lambda conn, _: _rows(conn).execute(_Q["flow_bucket"], {"key": rate_key}).fetchone())
        return None if row is None else Bucket.of(row)

    def waiting_names(self) -> list[WaitingName]:
        """Every (queue, name) with jobs ready, delayed or suspended, by queue then name."""
        rows = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["job_waiting_names"]).fetchall())
        return [WaitingName(queue, name, count) for queue, name, count in rows]

    def stats(self) -> list[QueueStats]:
        """Counts for all seven states of every queue that holds a job, by queue name."""
        rows = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["job_stats"]).fetchall())
        counts: dict[str, dict[str, int]] = {}
        for queue, state, count in rows:
            counts.setdefault(queue, dict.fromkeys(JOB_STATES, 0))[state] = count
        return [QueueStats(queue=queue, counts=counts[queue]) for queue in sorted(counts)]

    def count(self, filter: JobFilter, states: tuple[JobState, ...] | None = None, as_of: float | None = None) -> int:
        """How many jobs match ``filter`` (within ``states`` and ``updated_at <= as_of`` when given)."""
        if not storable_filter(filter):
            return 0
        params = {**pg_filter(filter, states), "as_of": None if as_of is None else to_datetime(as_of)}
        row = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["job_count"], params).fetchone())
        return 0 if row is None else int(row[0])

    def error_groups(self, filter: JobFilter) -> builtins.list[ErrorGroup]:
        """Matching jobs with a ``last_error``, grouped by its first line, largest group first."""
        if not storable_filter(filter):
            return []
        if filter.before is not None and not is_storable_text(filter.before):
            return []
        params = {**pg_filter(filter), "limit": max(0, filter.limit), "before": filter.before}
        rows = self._db.run(lambda conn, _: _rows(conn).execute(_Q["job_error_groups"], params).fetchall())
        return [ErrorGroup(code=error_code(row["message"]), message=row["message"], count=int(row["count"]),
                           first_seen=_utc(row["first_seen"]), last_seen=_utc(row["last_seen"]),
                           sample_id=row["sample_id"]) for row in rows]

    # Defined last: a method named ``list`` would shadow the builtin in later annotations.
    def list(self, filter: JobFilter = _EVERY_JOB) -> list[JobRecord]:
        """Jobs matching ``filter``, newest first (``created_at`` desc, then ``id`` desc)."""
        if not storable_filter(filter):
            return []
        if filter.before is not None and not is_storable_text(filter.before):
            return []
        params = {**pg_filter(filter), "limit": max(0, filter.limit), "before": filter.before}
        rows = self._db.run(lambda conn, _: _rows(conn).execute(_Q["job_list"], params).fetchall())
        return [_job(row) for row in rows]


class PostgresStepStore:
    """Durable step results keyed by (run id, step name); first write wins."""

    def __init__(self, db: _Database) -> None:
        self._db = db

    @unknown_key(dict)
    def load(self, run_id: str) -> dict[str, StepRecord]:
        """Every recorded step of ``run_id`` by name."""
        rows = self._db.run(lambda conn, _: _rows(conn).execute(_Q["steps_load"], {"run_id": run_id}).fetchall())
        return {
            row["name"]: StepRecord(
                run_id=row["run_id"], name=row["name"], result=row["result"], created_at=_utc(row["created_at"])
            )
            for row in rows
        }

    @fenced_key(lambda: False)
    def record(self, job_id: str, claim_token: str, name: str, result: Any, connection: Any = None) -> bool:
        """Record step ``name`` if job ``job_id`` is still ``running`` under ``claim_token``
        (with ``connection``, a psycopg or SQLAlchemy one: inside its transaction, uncommitted).

        ``True`` also when the run already had the step (its first result is kept). Raises
        :class:`~ultimat3.drivers.errors.StepResultError` (``X_STEP_RESULT``, not retryable) when
        ``result`` is not JSON, whether or not the fence holds: it is a bug in the step, not a lost race.
        """
        check_step_name(name)
        try:
            value = _jsonb(result)
        except (TypeError, ValueError) as exc:
            raise StepResultError(
                f'step "{name}" returned a value that is not JSON ({type(result).__name__}): {exc}',
                "return JSON from a step: dicts, lists, strings, numbers (finite), booleans or None",
                code="X_STEP_RESULT",
            ) from exc
        params = {
            "id": job_id,
            "token": claim_token,
            "name": name,
            "result": value,
            "now": to_datetime(self._db.now()),
        }
        if connection is not None:
            caller = _caller_connection(connection)
            row = _tuples(caller).execute(_Q["steps_record"], params, prepare=_PLAN_EACH_TIME).fetchone()
            return row is not None and row[0] == 1
        row = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["steps_record"], params,
                                                                 prepare=_PLAN_EACH_TIME).fetchone())
        return row is not None and row[0] == 1


class PostgresBackfillLedger:
    """The ``x_backfills`` ledger: one row per pass, history never overwritten."""

    def __init__(self, db: _Database, channel: str) -> None:
        self._db = db
        self._channel = channel

    def start(self, run_id: str, name: str, checksum: str, job_id: str | None,
              kind: BackfillKind = "pass") -> BackfillRun:
        """Open the row for ``run_id``, or reopen it (``running``, error cleared) on a retry."""
        require_text("X_BACKFILL_LEDGER", run_id=run_id, name=name, checksum=checksum, job_id=job_id)
        check_backfill_kind(kind)
        params = {
            "run_id": run_id,
            "name": name,
            "checksum": checksum,
            "job_id": job_id,
            "kind": kind,
            "now": to_datetime(self._db.now()),
        }
        row = self._db.run(lambda conn, _: _rows(conn).execute(_Q["backfill_start"], params).fetchone())
        assert row is not None  # INSERT .. ON CONFLICT DO UPDATE always returns the row
        return _backfill(row)

    def progress(self, run_id: str, batches: int, rows: int, throttle: str | None = None) -> bool:
        """Record how far the pass got and why it waits; whether a pause was asked for."""
        params = {"run_id": run_id, "batches": batches, "rows": rows,
                  "throttle": None if throttle is None else storable(throttle)[:MAX_REASON_LENGTH]}
        row = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["backfill_progress"], params).fetchone())
        return bool(row is not None and row[0])

    def request_pause(self, name: str, actor: str) -> BackfillRun | None:
        """Ask the newest running pass of ``name`` to pause at its next batch boundary."""
        require_text("X_BACKFILL_LEDGER", name=name, actor=actor)
        params = {"name": name, "actor": actor}
        row = self._db.run(lambda conn, _: _rows(conn).execute(_Q["backfill_request_pause"], params).fetchone())
        return None if row is None else _backfill(row)

    def pause(self, run_id: str) -> bool:
        """A running pass with a pause request becomes ``paused``."""
        return bool(self._db.run(
            lambda conn, _: conn.execute(_Q["backfill_pause"], {"run_id": run_id}).rowcount == 1))

    def resume(self, name: str, actor: str) -> BackfillRun | None:
        """Resume the newest paused (or asked-to-pause) pass of ``name`` and wake its job, in one statement."""
        require_text("X_BACKFILL_LEDGER", name=name, actor=actor)
        params = {"name": name, "now": to_datetime(self._db.now()), "channel": self._channel}
        row = self._db.run(lambda conn, _: _rows(conn).execute(_Q["backfill_resume"], params).fetchone())
        return None if row is None else _backfill(row)

    def quarantine(self, run_id: str, name: str, batch: int, failed: Sequence[tuple[str, str]],
                   handled: Sequence[str], connection: Any = None) -> None:
        """Store ``failed`` rows, count the ones new to this pass, forget ``handled`` ones
        (with ``connection``, a psycopg or SQLAlchemy one: inside its transaction, uncommitted)."""
        require_text("X_BACKFILL_LEDGER", run_id=run_id, name=name)
        failed_rows, handled_keys = quarantine_rows(failed, handled)
        if not failed_rows and not handled_keys:
            return
        params = {
            "run_id": run_id, "name": name, "batch": batch, "now": to_datetime(self._db.now()),
            "keys": [key for key, _ in failed_rows], "reasons": [reason for _, reason in failed_rows],
            "handled": handled_keys,
        }
        if connection is not None:
            _caller_connection(connection).execute(_Q["backfill_quarantine"], params)
            return
        self._db.run(lambda conn, _: conn.execute(_Q["backfill_quarantine"], params))

    def failures(self, name: str, limit: int = 1000, after: str | None = None) -> builtins.list[RowFailure]:
        """Quarantined rows of ``name`` by key, after ``after``."""
        if not filter_is_storable(name, after):
            return []
        params = {"name": name, "after": after, "limit": max(limit, 0)}
        rows = self._db.run(lambda conn, _: _rows(conn).execute(_Q["backfill_failures"], params).fetchall())
        return [row_failure(row, _DECODE) for row in rows]

    def outstanding(self, name: str) -> int:
        """How many rows of ``name`` are quarantined now."""
        if not filter_is_storable(name):
            return 0
        row = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["backfill_outstanding"], {"name": name}).fetchone())
        return 0 if row is None else int(row[0])

    def finish(self, run_id: str, status: BackfillStatus, error: str | None = None) -> None:
        """Close the row as ``completed``, ``failed`` or ``cancelled`` with ``finished_at`` = now."""
        if status not in _FINISHED_BACKFILL:
            raise ConfigError(
                f"backfill run {run_id!r} cannot finish as {status!r}",
                "finish a pass as 'completed', 'failed' or 'cancelled'",
                code="X_BACKFILL_STATUS",
            )
        params = {"run_id": run_id, "status": status, "error": error, "now": to_datetime(self._db.now())}
        self._db.run(lambda conn, _: conn.execute(_Q["backfill_finish"], params))

    @unknown_key(lambda: None)
    def get(self, run_id: str) -> BackfillRun | None:
        """One pass by run id."""
        row = self._db.run(lambda conn, _: _rows(conn).execute(_Q["backfill_get"], {"run_id": run_id}).fetchone())
        return None if row is None else _backfill(row)

    @unknown_key(lambda: None)
    def last_completed(self, name: str) -> BackfillRun | None:
        """The most recently finished ``completed`` pass of ``name``."""
        row = self._db.run(
            lambda conn, _: _rows(conn).execute(_Q["backfill_last_completed"], {"name": name}).fetchone()
        )
        return None if row is None else _backfill(row)

    def list(self, name: str | None = None) -> list[BackfillRun]:
        """Every pass (of ``name``), newest first (``started_at`` desc, then ``run_id`` desc)."""
        if not filter_is_storable(name):
            return []
        rows = self._db.run(lambda conn, _: _rows(conn).execute(_Q["backfill_list"], {"name": name}).fetchall())
        return [_backfill(row) for row in rows]


class PostgresLeaseStore:
    """Fleet slots ``0..limit-1`` per key; a slot is free when it has no row or its row expired."""

    def __init__(self, db: _Database) -> None:
        self._db = db

    def acquire(self, key: str, holder: str, limit: int, ttl: float) -> Lease | None:
        """Take the lowest free (or expired) slot of ``key``; ``None`` when all are held."""
        require_text("X_LEASE_KEY", key=key, holder=holder)
        if limit < 1:
            raise XError(
                f"lease {key!r} asked for limit {limit}",
                "a fleet limit is at least 1 concurrent holder",
                code="X_LEASE_LIMIT",
            )
        now = self._db.now()
        params = {
            "key": key,
            "holder": holder,
            "limit": limit,
            "token": uuid.uuid4().hex,
            "now": to_datetime(now),
            "expires_at": to_datetime(now + ttl),
        }

        def op(conn: Conn, retrying: bool) -> Row | None:
            with conn.transaction():
                cur = _rows(conn)
                if retrying:
                    # The lost attempt may have committed: the token is ours alone.
                    held = cur.execute(_Q["lease_by_token"], params).fetchone()
                    if held is not None:
                        return held
                cur.execute(_Q["lease_lock"], params)
                return cur.execute(_Q["lease_acquire"], params).fetchone()

        row = self._db.run(op)
        return None if row is None else _lease(row)

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend a lease still held under its token (even if it expired meanwhile but nobody
        re-took the slot: only the token decides); ``None`` when it was lost."""
        params = {
            "key": lease.key,
            "slot": lease.slot,
            "token": lease.token,
            "expires_at": to_datetime(self._db.now() + ttl),
        }
        row = self._db.run(lambda conn, _: _rows(conn).execute(_Q["lease_renew"], params).fetchone())
        return None if row is None else _lease(row)

    def release(self, lease: Lease) -> bool:
        """Free the slot if still held under the lease's token."""
        params = {"key": lease.key, "slot": lease.slot, "token": lease.token}
        return self._db.run(lambda conn, _: conn.execute(_Q["lease_release"], params).rowcount) == 1

    @unknown_key(lambda: [])
    def holders(self, key: str) -> list[Lease]:
        """Unexpired leases of ``key``, by slot."""
        params = {"key": key, "now": to_datetime(self._db.now())}
        rows = self._db.run(lambda conn, _: _rows(conn).execute(_Q["lease_holders"], params).fetchall())
        return [_lease(row) for row in rows]


class PostgresMigrationLedger:
    """The ``x_migrations`` ledger (the library's migrations and the app's)."""

    def __init__(self, db: _Database) -> None:
        self._db = db

    def applied(self) -> list[MigrationRecord]:
        """Every applied migration, oldest first (in the order they were recorded)."""
        rows = self._db.run(lambda conn, _: _tuples(conn).execute(_Q["migrations_applied"]).fetchall())
        return [MigrationRecord(id=mid, applied_at=_utc(at)) for mid, at in rows]

    @unknown_key(lambda: False)
    def is_applied(self, migration_id: str) -> bool:
        """Whether ``migration_id`` is recorded."""
        row = self._db.run(
            lambda conn, _: _tuples(conn).execute(_Q["migration_is_applied"], {"id": migration_id}).fetchone()
        )
        return bool(row and row[0])

    def mark_applied(self, migration_id: str) -> None:
        """Record ``migration_id`` as applied now; a second call keeps the first time."""
        require_text("X_MIGRATION_ID", migration_id=migration_id)
        params = {"id": migration_id, "now": to_datetime(self._db.now())}
        self._db.run(lambda conn, _: conn.execute(_Q["migration_mark"], params))
