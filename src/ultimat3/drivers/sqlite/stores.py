"""The SQLite driver's stores: introspection, steps, the backfill ledger, leases, migrations."""

from __future__ import annotations

import builtins
import json
import sqlite3
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import ConfigError, XError
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.filters import error_code, storable_filter
from ultimat3.drivers.flow import Bucket
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
from ultimat3.drivers.sqlite.rows import (
    DECODE,
    EVERY_JOB,
    FINISHED_BACKFILL,
    QUERIES,
    backfill_run_of,
    dumps_json,
    job_record_of,
    lease_of,
    loads,
    sqlite_filter,
)
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

if TYPE_CHECKING:
    from ultimat3.drivers.sqlite.driver import SqliteDriver

__all__ = [
    "SqliteBackfillLedger",
    "SqliteIntrospection",
    "SqliteLeaseStore",
    "SqliteMigrationLedger",
    "SqliteStepStore",
]


class SqliteIntrospection:
    """Read side of :class:`SqliteDriver`: list, get, stats."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver

    def list(self, filter: JobFilter = EVERY_JOB) -> builtins.list[JobRecord]:
        """Jobs matching ``filter``, newest first (``created_at`` desc, then ``id`` desc)."""
        if not storable_filter(filter):
            return []
        if filter.before is not None and not is_storable_text(filter.before):
            return []
        # A negative LIMIT is "no limit" to SQLite.
        params = {**sqlite_filter(filter), "limit": max(filter.limit, 0), "before": filter.before}
        return [job_record_of(row) for row in self._driver._rows("jobs_list", params)]

    def count(self, filter: JobFilter, states: tuple[JobState, ...] | None = None, as_of: float | None = None) -> int:
        """How many jobs match ``filter`` (within ``states`` and ``updated_at <= as_of`` when given)."""
        if not storable_filter(filter):
            return 0
        rows = self._driver._rows("jobs_count", {**sqlite_filter(filter, states), "as_of": as_of})
        return int(rows[0][0])

    def error_groups(self, filter: JobFilter) -> builtins.list[ErrorGroup]:
        """Matching jobs with a ``last_error``, grouped by its first line, largest group first."""
        if not storable_filter(filter):
            return []
        rows = self._driver._rows("jobs_error_groups", {**sqlite_filter(filter), "limit": max(filter.limit, 0)})
        return [ErrorGroup(code=error_code(row["message"]), message=row["message"], count=row["count"],
                           first_seen=to_datetime(row["first_seen"]), last_seen=to_datetime(row["last_seen"]),
                           sample_id=row["sample_id"]) for row in rows]

    @unknown_key(lambda: None)
    def get(self, job_id: str) -> JobRecord | None:
        """One job, or ``None`` when no job has that id."""
        rows = self._driver._rows("job_get", {"id": job_id})
        return job_record_of(rows[0]) if rows else None

    @unknown_key(lambda: [])
    def slot_holders(self, flow_key: str) -> builtins.list[JobRecord]:
        """The running jobs under ``flow_key``, oldest claim first."""
        return [job_record_of(row) for row in self._driver._rows("flow_holders", {"key": flow_key})]

    def completions(self, since: float, bucket: float = 60.0) -> builtins.list[Completed]:
        """Jobs finished ``done`` since ``since``, per queue and ``bucket`` seconds."""
        check_bucket(bucket)
        rows = self._driver._rows("job_completions", {"since": since, "bucket": bucket})
        return [Completed(row["queue"], to_datetime(float(row["at"])), int(row["done"])) for row in rows]

    @unknown_key(lambda: [])
    def attempts(self, job_id: str) -> builtins.list[AttemptRecord]:
        """Every attempt of ``job_id``, oldest first."""
        ended = [attempt_record(row, DECODE) for row in self._driver._rows("attempts_of", {"id": job_id})]
        rows = self._driver._rows("job_get", {"id": job_id})
        return attempt_history(job_record_of(rows[0]) if rows else None, ended)

    @unknown_key(lambda: None)
    def rate_bucket(self, rate_key: str) -> Bucket | None:
        """The bucket of ``rate_key`` as stored."""
        rows = self._driver._rows("flow_bucket", {"key": rate_key})
        return Bucket.of(rows[0]) if rows else None

    def waiting_names(self) -> builtins.list[WaitingName]:
        """Every (queue, name) with jobs ready, delayed or suspended, by queue then name."""
        return [WaitingName(row["queue"], row["name"], row["n"]) for row in self._driver._rows("jobs_waiting_names")]

    def stats(self) -> builtins.list[QueueStats]:
        """Counts in every state (zeros included) per queue that holds a job, by queue name."""
        counts: dict[str, dict[str, int]] = {}
        for row in self._driver._rows("jobs_stats"):
            queue = counts.setdefault(row["queue"], dict.fromkeys(JOB_STATES, 0))
            queue[row["state"]] = row["n"]
        return [QueueStats(queue, counts[queue]) for queue in sorted(counts)]


class SqliteStepStore:
    """Durable step results in ``x_job_steps``; writes fenced by the claim token."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver

    @unknown_key(dict)
    def load(self, run_id: str) -> dict[str, StepRecord]:
        """Every recorded step of ``run_id`` by name."""
        return {
            row["name"]: StepRecord(row["run_id"], row["name"], loads(row["result"]), to_datetime(row["created_at"]))
            for row in self._driver._rows("step_load", {"run_id": run_id})
        }

    @fenced_key(lambda: False)
    def record(self, job_id: str, claim_token: str, name: str, result: Any, connection: Any = None) -> bool:
        """Record step ``name`` if the job is running under ``claim_token``; the first result wins.
        With ``connection`` (on this driver's file): inside its transaction, uncommitted."""
        check_step_name(name)
        encoded = dumps_json(
            result,
            f'result of step "{name}"',
            "X_STEP_RESULT",
            "return JSON values from the step (str, int, float, bool, None, lists and dicts of them)",
        )

        def run(conn: sqlite3.Connection, now: float) -> bool:
            params = {"job_id": job_id, "claim_token": claim_token, "name": name, "result": encoded, "now": now}
            if conn.execute(QUERIES["step_record"], params).rowcount == 1:
                return True
            # Nothing inserted: either the step exists (a replay, fine) or the claim is gone.
            claimed = conn.execute(QUERIES["job_is_claimed"], {"job_id": job_id, "claim_token": claim_token})
            return claimed.fetchone() is not None

        if connection is not None:
            return run(self._driver._joined(connection), self._driver._now())
        return self._driver._write(run)


class SqliteBackfillLedger:
    """The ``x_backfills`` ledger: one row per pass."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver

    def start(self, run_id: str, name: str, checksum: str, job_id: str | None,
              kind: BackfillKind = "pass") -> BackfillRun:
        """Open the pass's row, or reopen it (``running``, error cleared) for a later attempt."""
        require_text("X_BACKFILL_LEDGER", run_id=run_id, name=name, checksum=checksum, job_id=job_id)
        check_backfill_kind(kind)
        params = {"run_id": run_id, "name": name, "checksum": checksum, "job_id": job_id, "kind": kind,
                  "now": self._driver._now()}
        return backfill_run_of(self._driver._rows("backfill_start", params)[0])

    def progress(self, run_id: str, batches: int, rows: int, throttle: str | None = None) -> bool:
        """Record how far the pass got and why it waits; whether a pause was asked for."""
        params = {"run_id": run_id, "batches": batches, "rows": rows,
                  "throttle": None if throttle is None else storable(throttle)[:MAX_REASON_LENGTH]}
        found = self._driver._rows("backfill_progress", params)
        return bool(found and found[0]["pause"])

    def request_pause(self, name: str, actor: str) -> BackfillRun | None:
        """Ask the newest running pass of ``name`` to pause at its next batch boundary."""
        require_text("X_BACKFILL_LEDGER", name=name, actor=actor)
        found = self._driver._rows("backfill_request_pause", {"name": name, "actor": actor})
        return backfill_run_of(found[0]) if found else None

    def pause(self, run_id: str) -> bool:
        """A running pass with a pause request becomes ``paused``."""
        return self._driver._write(
            lambda conn, _now: conn.execute(QUERIES["backfill_pause"], {"run_id": run_id}).rowcount == 1)

    def resume(self, name: str, actor: str) -> BackfillRun | None:
        """Resume the newest paused (or asked-to-pause) pass of ``name`` and wake its job, in one transaction."""
        require_text("X_BACKFILL_LEDGER", name=name, actor=actor)

        def run(conn: sqlite3.Connection, now: float) -> tuple[sqlite3.Row | None, list[str]]:
            row = conn.execute(QUERIES["backfill_resume"], {"name": name}).fetchone()
            if row is None or row["job_id"] is None:
                return row, []
            woken = conn.execute(QUERIES["backfill_wake"], {"id": row["job_id"], "now": now}).fetchall()
            return row, [w["queue"] for w in woken]

        row, queues = self._driver._write(run)
        if queues:
            self._driver._notify(queues)
        return None if row is None else backfill_run_of(row)

    def quarantine(self, run_id: str, name: str, batch: int, failed: Sequence[tuple[str, str]],
                   handled: Sequence[str], connection: Any = None) -> None:
        """Store ``failed`` rows, count the ones new to this pass, forget ``handled`` ones
        (with ``connection``: inside its transaction, uncommitted)."""
        require_text("X_BACKFILL_LEDGER", run_id=run_id, name=name)
        failed_rows, handled_keys = quarantine_rows(failed, handled)

        def run(conn: sqlite3.Connection, now: float) -> None:
            if failed_rows:
                keys = json.dumps([key for key, _ in failed_rows])
                fresh = conn.execute(QUERIES["backfill_count_fresh"],
                                     {"keys": keys, "name": name, "run_id": run_id}).fetchone()[0]
                conn.execute(QUERIES["backfill_quarantine"], {"failed": json.dumps(failed_rows), "name": name,
                                                              "run_id": run_id, "batch": batch, "now": now})
                conn.execute(QUERIES["backfill_count_failures"], {"fresh": fresh, "run_id": run_id})
            if handled_keys:
                conn.execute(QUERIES["backfill_forget"], {"name": name, "keys": json.dumps(handled_keys)})

        if not failed_rows and not handled_keys:
            return
        if connection is not None:
            run(self._driver._joined(connection), self._driver._now())
            return
        self._driver._write(run)

    def failures(self, name: str, limit: int = 1000, after: str | None = None) -> builtins.list[RowFailure]:
        """Quarantined rows of ``name`` by key, after ``after``."""
        if not filter_is_storable(name, after):
            return []
        rows = self._driver._rows("backfill_failures", {"name": name, "after": after, "limit": max(limit, 0)})
        return [row_failure(row, DECODE) for row in rows]

    def outstanding(self, name: str) -> int:
        """How many rows of ``name`` are quarantined now."""
        if not filter_is_storable(name):
            return 0
        return int(self._driver._rows("backfill_outstanding", {"name": name})[0][0])

    def finish(self, run_id: str, status: BackfillStatus, error: str | None = None) -> None:
        """Close the pass with ``status`` (``finished_at`` = now)."""
        if status not in FINISHED_BACKFILL:
            raise ConfigError(
                f"backfill run {run_id!r} cannot finish as {status!r}",
                "finish a pass as 'completed', 'failed' or 'cancelled'",
                code="X_BACKFILL_STATUS",
            )
        params = {"run_id": run_id, "status": status, "error": error, "now": self._driver._now()}
        self._driver._execute("backfill_finish", params)

    @unknown_key(lambda: None)
    def get(self, run_id: str) -> BackfillRun | None:
        """One pass by run id."""
        rows = self._driver._rows("backfill_get", {"run_id": run_id})
        return backfill_run_of(rows[0]) if rows else None

    @unknown_key(lambda: None)
    def last_completed(self, name: str) -> BackfillRun | None:
        """The most recently finished ``completed`` pass of ``name``."""
        rows = self._driver._rows("backfill_last_completed", {"name": name})
        return backfill_run_of(rows[0]) if rows else None

    def list(self, name: str | None = None) -> builtins.list[BackfillRun]:
        """Every pass (of ``name``), newest first."""
        if not filter_is_storable(name):
            return []
        return [backfill_run_of(row) for row in self._driver._rows("backfill_list", {"name": name})]


class SqliteLeaseStore:
    """Fleet slots in ``x_leases``: the lowest free or expired slot is taken under the write lock."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver

    def acquire(self, key: str, holder: str, limit: int, ttl: float) -> Lease | None:
        """Take a free (or expired) slot in ``0..limit-1``; ``None`` when all are held."""
        require_text("X_LEASE_KEY", key=key, holder=holder)
        if limit < 1:
            raise XError(
                f"lease {key!r} asked for a limit of {limit}",
                "a lease limit is a whole number of slots, at least 1",
                code="X_LEASE_LIMIT",
            )

        def run(conn: sqlite3.Connection, now: float) -> Lease | None:
            held = {
                row["slot"]
                for row in conn.execute(QUERIES["lease_slots"], {"key": key, "limit": limit})
                if row["expires_at"] > now
            }
            slot = next((slot for slot in range(limit) if slot not in held), None)
            if slot is None:
                return None
            lease = Lease(key, slot, holder, uuid.uuid4().hex, to_datetime(now + ttl))
            params = {"key": key, "slot": slot, "holder": holder, "token": lease.token, "expires_at": now + ttl}
            conn.execute(QUERIES["lease_take"], params)
            return lease

        return self._driver._write(run)

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend ``lease`` if its slot is still held under its token; ``None`` when lost."""
        params = {"key": lease.key, "slot": lease.slot, "token": lease.token, "expires_at": self._driver._now() + ttl}
        rows = self._driver._rows("lease_renew", params)
        return lease_of(rows[0]) if rows else None

    def release(self, lease: Lease) -> bool:
        """Free the slot if still held under the lease's token."""
        params = {"key": lease.key, "slot": lease.slot, "token": lease.token}
        return self._driver._execute("lease_release", params)[1] == 1

    @unknown_key(lambda: [])
    def holders(self, key: str) -> builtins.list[Lease]:
        """Unexpired leases of ``key``, by slot."""
        return [lease_of(row) for row in self._driver._rows("lease_holders", {"key": key, "now": self._driver._now()})]


class SqliteMigrationLedger:
    """The ``x_migrations`` table (library ids ``x:...`` and the app's own)."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver

    def applied(self) -> list[MigrationRecord]:
        """Every applied migration, oldest first (none before the first migrate)."""
        if not self._driver._rows("migrations_table_exists"):
            return []
        return [
            MigrationRecord(row["id"], to_datetime(row["applied_at"]))
            for row in self._driver._rows("migrations_applied")
        ]

    @unknown_key(lambda: False)
    def is_applied(self, migration_id: str) -> bool:
        """Whether ``migration_id`` is recorded."""
        if not self._driver._rows("migrations_table_exists"):
            return False
        return bool(self._driver._rows("migration_is_applied", {"id": migration_id}))

    def mark_applied(self, migration_id: str) -> None:
        """Record ``migration_id`` as applied (idempotent)."""
        require_text("X_MIGRATION_ID", migration_id=migration_id)
        try:
            self._driver._execute("migration_mark_applied", {"id": migration_id, "now": self._driver._now()})
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            raise DriverError(
                f"cannot record migration {migration_id!r}: the x_migrations table does not exist",
                "run `x db migrate` (or driver.migrate()) first",
                code="X_DRIVER_MIGRATE",
            ) from exc
