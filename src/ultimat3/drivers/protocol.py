"""The driver protocol: the whole contract between the job runtime and a storage backend.

Three drivers implement it (memory, sqlite, postgres) and ONE contract suite
(``tests/contract``) runs against each. Requests and records are frozen dataclasses; every
timestamp a driver stores comes from the driver's injected :class:`~ultimat3.core.Clock`, so the
suite can move time instead of sleeping.

Fencing: :meth:`JobDriver.claim` mints a fresh ``claim_token`` for every job it hands out.
``ack``, ``nack``, ``heartbeat`` and :meth:`StepStore.record` take that token and change nothing
(returning ``False``) unless the job is still ``running`` under that very token. A worker whose
claim lapsed and was re-taken, or whose job was cancelled, can therefore neither settle the job
nor write a checkpoint for it.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from ultimat3.core.clock import Clock
from ultimat3.drivers.flow import Bucket

JobState = Literal["ready", "delayed", "running", "suspended", "done", "dead", "cancelled"]
JOB_STATES: tuple[JobState, ...] = ("ready", "delayed", "running", "suspended", "done", "dead", "cancelled")
#: States in which a job still holds its idempotency key.
LIVE_STATES: frozenset[JobState] = frozenset({"ready", "delayed", "running", "suspended"})
#: States a job never leaves on its own.
FINAL_STATES: frozenset[JobState] = frozenset({"done", "dead", "cancelled"})
DEFAULT_QUEUE = "default"
#: ``introspect.list`` returns at most this many rows when no limit is given.
DEFAULT_LIST_LIMIT = 100
OnConflict = Literal["return", "error"]


@dataclass(frozen=True)
class EnqueueRequest:
    """One job to write. ``run_at`` (epoch seconds) of ``None`` means "as soon as possible"."""

    name: str
    payload: dict[str, Any]
    queue: str = DEFAULT_QUEUE
    idempotency_key: str | None = None
    run_at: float | None = None
    priority: int = 0
    max_attempts: int = 5
    tenant_id: str | None = None
    traceparent: str | None = None
    enqueued_by: str | None = None
    on_conflict: OnConflict = "return"
    #: Flow control (see :mod:`ultimat3.drivers.flow`): at most ``flow_max`` jobs under
    #: ``flow_key`` run at once; starts under ``rate_key`` stay under ``rate_per_second``, at most
    #: ``rate_burst`` at once. The enqueue computes them from the job's declaration.
    flow_key: str | None = None
    flow_max: int | None = None
    rate_key: str | None = None
    rate_per_second: float | None = None
    rate_burst: int | None = None


@dataclass(frozen=True)
class EnqueueResult:
    """What an enqueue produced. ``deduped`` is true when a live job under the key was returned."""

    id: str
    run_id: str
    deduped: bool


@dataclass(frozen=True)
class JobRecord:
    """A job row as every driver reports it. Times are aware UTC datetimes."""

    id: str
    run_id: str
    name: str
    queue: str
    payload: dict[str, Any]
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    idempotency_key: str | None = None
    tenant_id: str | None = None
    traceparent: str | None = None
    enqueued_by: str | None = None
    claimed_by: str | None = None
    visible_at: datetime | None = None
    finished_at: datetime | None = None
    last_error: str | None = None
    result: Any = None
    flow_key: str | None = None
    flow_max: int | None = None
    rate_key: str | None = None
    rate_per_second: float | None = None
    rate_burst: int | None = None
    #: When the current (or, once settled, the last) attempt was claimed.
    started_at: datetime | None = None


AttemptOutcome = Literal["running", "done", "failed", "dead", "suspended", "released", "cancelled", "lapsed", "lost"]


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a job, as ``x jobs show`` and the dashboard list them.

    ``outcome``: ``running`` (still on ``worker_id``), ``done``, ``failed`` (it will be tried
    again), ``dead`` (dead-lettered), ``suspended`` (a durable sleep gave the attempt back),
    ``released`` (claimed but never started: the worker stopped), ``cancelled``, ``lapsed`` (its
    claim ran out and another claim took the job over) or ``lost`` (its worker died and was
    rescued). ``error`` is the error the attempt ended with, where it ended with one.
    ``attempt`` numbers restart at 1 after an operator retry.
    """

    job_id: str
    attempt: int
    outcome: AttemptOutcome
    worker_id: str | None
    started_at: datetime | None
    ended_at: datetime | None = None
    error: str | None = None


#: The starvation bound of every driver's claim, in seconds of its clock: a job that is runnable
#: is handed out by a claim made this long after it became so at the latest (a claim that finds
#: ``limit`` jobs ahead of it in claim order excepted) -- also when the claimer was not told of it
#: (it subscribes to nothing, or NOTIFY does not reach it): a commit behind its position in claim
#: order, a lapsed claim, a row another transaction held while a claim passed. Announced ones (an
#: enqueue, a rescue, a resume, heard through NOTIFY or made by the claiming driver itself) go to the
#: next claim. PostgreSQL uses the time to keep claims off what earlier jobs left behind (see
#: ``ultimat3.drivers.postgres.cursors``; a claimer that hears NOTIFY also walks from the head every
#: 30 s as a safety net); SQLite and memory hand every runnable job to the next claim.
CLAIM_STARVATION_BOUND = 2.0


@dataclass(frozen=True)
class ClaimRequest:
    """Claim up to ``limit`` runnable jobs for ``worker_id``.

    Runnable: ``ready``/``delayed``/``suspended`` with ``run_at <= now``, or ``running`` whose
    visibility lapsed (its worker is presumed lost). ``queues``/``names`` of ``None`` mean any.
    Order: ``priority`` descending, then ``run_at``, then ``id``; see :data:`CLAIM_STARVATION_BOUND`.

    Jobs under flow control (a ``flow_key`` or ``rate_key`` on the row) are claimed only when
    ``flow`` is true, and then only within their limits (see :mod:`ultimat3.drivers.flow`): a
    claim takes those first, in claim order among themselves, then the others in claim order.
    A worker passes ``flow=True`` when it runs a job that declares flow control; a claimer that
    does not know of limits never takes a job under one.

    ``fair``: round-robin by tenant instead of one claim order across them. The claim serves the
    tenants with due jobs in turn, from after the tenant this claimer served last (each driver
    keeps that cursor), each tenant's jobs in claim order: every tenant's first job, then every
    tenant's second... so a tenant with ten jobs behind another's hundred thousand starts them in
    the first claims. Priority then orders within a tenant and within a turn, not across turns.
    ``weights`` (with ``fair``): jobs per turn by tenant id (``''`` for no tenant), 1 for the others.
    """

    worker_id: str
    limit: int = 1
    visibility_timeout: float = 30.0
    queues: tuple[str, ...] | None = None
    names: tuple[str, ...] | None = None
    flow: bool = False
    fair: bool = False
    weights: Mapping[str, int] | None = None


class ClaimBatch(list["ClaimedJob"]):
    """What :meth:`JobDriver.claim` returns: the claimed jobs, and ``wake_at`` (epoch seconds of the
    driver's clock, ``None`` when there is nothing to wait for): when a job this claim passed over
    for a rate limit gets its token, so a claimer that found too little can come back then instead
    of at its next poll (``None`` too when the claim filled its limit: its claimer claims again at
    once); and ``more``: this claim turned jobs away at a limit it filled itself, so a
    claim made at once may find others it did not reach (the next one leaves that key out)."""

    wake_at: float | None = None
    more: bool = False


@dataclass(frozen=True)
class ClaimedJob:
    """A job handed to a worker, with the token that fences every write the worker makes for it."""

    job: JobRecord
    claim_token: str


@dataclass(frozen=True)
class Ack:
    """One item of :meth:`JobDriver.ack_many`: settle ``job_id`` as ``done`` with ``result``."""

    job_id: str
    claim_token: str
    result: Any = None


@dataclass(frozen=True)
class NackRequest:
    """How a failed or suspended attempt is put back.

    ``counts_as_attempt=False`` is a suspension (``step.sleep``): the job becomes ``suspended``
    and its ``attempt`` goes back down by one, never below zero. ``dead_letter`` ends it as
    ``dead``. Otherwise it becomes ``ready`` (with ``run_at`` ``delay`` seconds from now: a
    backoff is a waiting ``ready`` row, ``delayed`` is kept for what was enqueued for later).
    ``error`` of ``None`` keeps the previous ``last_error``. ``release`` hands the job back
    untouched (worker shutdown, a name this worker cannot run): ``ready`` at ``now + delay``, its
    attempt given back (floored at 0), ``claimed_by`` cleared, ``last_error`` unchanged and
    ``error`` ignored.
    """

    error: str | None = None
    delay: float = 0.0
    counts_as_attempt: bool = True
    dead_letter: bool = False
    release: bool = False


@dataclass(frozen=True)
class WaitingName:
    """How many jobs of ``name`` wait (ready, delayed or suspended) in ``queue``."""

    queue: str
    name: str
    count: int


@dataclass(frozen=True)
class JobFilter:
    """Which jobs an operator means: for :meth:`JobIntrospection.list`, counts, error groups and
    bulk actions. Every given field must hold (``None``: any).

    ``name`` is exact, or a pattern where ``*`` stands for any run of characters (``billing.*``;
    declared names cannot contain ``*``). ``error`` is a substring of ``last_error`` (a code such as
    ``X_WORKER_LOST`` or any text of the message). ``since``/``until`` (epoch seconds) bound
    ``updated_at``, the last time the job changed state (when it died, finished, was enqueued or
    retried): ``since <= updated_at < until``. ``ids`` restricts to those job ids.
    """

    queue: str | None = None
    name: str | None = None
    state: JobState | None = None
    tenant_id: str | None = None
    limit: int = DEFAULT_LIST_LIMIT
    error: str | None = None
    since: float | None = None
    until: float | None = None
    ids: tuple[str, ...] | None = None
    #: :meth:`JobIntrospection.list` only (keyset pagination): the id of the last job of the
    #: previous page; the list goes on after it in its order (nothing, once that job is gone).
    before: str | None = None


BulkAction = Literal["retry", "cancel", "delete"]
#: The states each bulk action may act on: retry revives what ended badly, cancel stops what has not
#: ended, delete removes what is not running (a running attempt must be cancelled first).
BULK_STATES: dict[BulkAction, frozenset[JobState]] = {
    "retry": frozenset({"dead", "cancelled"}),
    "cancel": frozenset({"ready", "delayed", "running", "suspended"}),
    "delete": frozenset({"ready", "delayed", "suspended", "done", "dead", "cancelled"}),
}


@dataclass(frozen=True)
class BulkRequest:
    """One bounded batch of an operator's bulk action (see :meth:`JobDriver.bulk`).

    Acts on at most ``limit`` jobs matching ``filter`` (its ``state`` and ``limit`` ignored) whose
    state is in ``states`` and whose id is greater than ``after``, lowest ids first, skipping
    rows another transaction holds locked. ``as_of`` (epoch seconds), when given, also requires
    ``updated_at <= as_of``, so a job retried by this very action that dies again is not retried
    twice. ``audit_id``'s ``touched`` count grows in the same transaction. ``reason`` is the
    ``last_error`` a cancel writes (``None`` keeps the previous one).
    """

    action: BulkAction
    filter: JobFilter
    states: tuple[JobState, ...]
    limit: int = 500
    after: str = ""
    as_of: float | None = None
    audit_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class BulkBatch:
    """What one :meth:`JobDriver.bulk` batch did: the ids it changed, and the highest id it looked
    at (the ``after`` of the next batch; ``None`` when it found no candidate at all)."""

    touched: tuple[str, ...]
    last_id: str | None


@dataclass(frozen=True)
class ErrorGroup:
    """Jobs that ended (or last failed) with the same error: ``code`` (``X_...`` or the exception
    type, ``None`` when the text has neither) and ``message`` (the first line of ``last_error``);
    ``first_seen``/``last_seen`` are the earliest and latest ``updated_at`` among them."""

    code: str | None
    message: str
    count: int
    first_seen: datetime
    last_seen: datetime
    sample_id: str


@dataclass(frozen=True)
class QueueStats:
    """How many jobs a queue holds in each state (states with none are reported as 0)."""

    queue: str
    counts: dict[str, int]


@dataclass(frozen=True)
class Completed:
    """How many jobs of ``queue`` finished ``done`` in the bucket of time starting at ``at``."""

    queue: str
    at: datetime
    done: int


@dataclass(frozen=True)
class QueueInfo:
    """One queue as ``x queues ls`` shows it.

    ``paused`` and who changed it when come from ``x_queues``; ``counts`` are jobs per state now
    (all seven, zeros included); ``due`` is how many waiting jobs could start now, and
    ``oldest_due_age`` the seconds the longest-waiting of them has been due (``None``: none is).
    Over the last ``window`` seconds: ``done_recent`` finished, ``failed_recent`` failed an
    attempt and wait to try again, ``dead_recent`` were dead-lettered.
    """

    queue: str
    paused: bool
    counts: dict[str, int]
    due: int = 0
    oldest_due_age: float | None = None
    done_recent: int = 0
    failed_recent: int = 0
    dead_recent: int = 0
    changed_at: datetime | None = None
    changed_by: str | None = None


@dataclass(frozen=True)
class ScheduleRecord:
    """One schedule's row in ``x_schedules``: the newest tick it fired (or skipped), the job that
    tick enqueued, and whether an operator paused it."""

    key: str
    last_tick: datetime
    paused: bool
    updated_at: datetime
    last_job_id: str | None = None
    changed_at: datetime | None = None
    changed_by: str | None = None


@dataclass(frozen=True)
class Fired:
    """What :meth:`ScheduleStore.fire` did with a tick: ``job`` is the enqueue's result (``None``
    when the schedule is paused: the tick is recorded as passed, nothing runs)."""

    tick: float
    job: EnqueueResult | None


@dataclass(frozen=True)
class SnapshotHolder:
    """What holds the database's oldest open snapshot, so VACUUM keeps every row version newer
    than it (in a queue table: every claim's and settlement's leftovers); on SQLite, a reader that
    keeps the WAL from being checkpointed (``kind`` ``wal-reader``: the file in ``application_name``,
    the frames left behind in ``state``). ``kind`` is ``backend``
    (a session with an open transaction: ``pid``, ``application_name``, ``state``, the first line of
    its ``query``) or ``prepared`` (a prepared transaction, its gid in ``application_name``);
    ``age`` is how long that transaction has been open, in seconds."""

    kind: str
    age: float
    pid: int | None = None
    application_name: str | None = None
    state: str | None = None
    backend_type: str | None = None
    query: str | None = None

    def describe(self) -> str:
        """One line for logs and the CLI, with what to do about it."""
        if self.kind == "wal-reader":
            return (f"a read transaction on {self.application_name} has kept the WAL from being checkpointed for "
                    f"{self.age:,.0f}s ({self.state}); end it (an open BEGIN or a long SELECT in another "
                    "connection to the file): the WAL shrinks back at the next checkpoint")
        who = (f"backend pid {self.pid} ({self.backend_type or 'backend'}, application_name "
               f"{self.application_name or '(none)'!r}, state {self.state or '?'})" if self.kind == "backend"
               else f"prepared transaction {self.application_name!r}")
        fix = ("COMMIT PREPARED or ROLLBACK PREPARED it" if self.kind == "prepared"
               else "end it, or set idle_in_transaction_session_timeout")
        return f"{who} has held the oldest open snapshot for {self.age:,.0f}s; {fix}"


AuditAction = Literal["retry", "cancel", "delete", "pause", "resume"]
AuditStatus = Literal["running", "completed", "interrupted", "failed"]


@dataclass(frozen=True)
class AuditEntry:
    """One operator action in ``x_audit``: who (``actor``), when, what (``action`` on ``target``:
    a filter or a queue), how many jobs it touched, and whether it ran to the end. A bulk action
    opens its entry ``running`` and every batch adds to ``touched`` in its own transaction, so an
    action killed midway still shows exactly what it did."""

    id: str
    at: datetime
    actor: str
    action: AuditAction
    target: dict[str, Any]
    touched: int
    status: AuditStatus
    finished_at: datetime | None = None


@dataclass(frozen=True)
class StepRecord:
    """A recorded durable step: its JSON result, written once per run."""

    run_id: str
    name: str
    result: Any
    created_at: datetime


BackfillStatus = Literal["running", "paused", "completed", "failed", "cancelled"]
#: ``pass``: a sweep of the whole source; ``retry``: a pass over only the rows an earlier pass
#: quarantined (``--retry-failed``). Only a ``pass`` can decide the deploy gate.
BackfillKind = Literal["pass", "retry"]
#: Longest reason kept for a quarantined row or a throttle (longer text is cut, not refused).
MAX_REASON_LENGTH = 2000


@dataclass(frozen=True)
class BackfillRun:
    """One row of the ``x_backfills`` ledger: one pass of one backfill."""

    run_id: str
    name: str
    checksum: str
    status: BackfillStatus
    batches: int
    rows: int
    started_at: datetime
    job_id: str | None = None
    finished_at: datetime | None = None
    error: str | None = None
    #: ``retry`` for a ``--retry-failed`` pass.
    kind: BackfillKind = "pass"
    #: Rows this pass quarantined (``batch.fail``).
    failures: int = 0
    #: Why the pass is waiting instead of sweeping (a tripped health check), ``None`` when it is not.
    throttle: str | None = None
    #: Who asked the pass to pause: a request while ``running``, who paused it once ``paused``.
    paused_by: str | None = None


@dataclass(frozen=True)
class RowFailure:
    """A row a pass quarantined: ``key`` is the row's key as its checkpoint encodes it (JSON text
    of ``{"cursor": ..., "cursor_type": ...}``), kept until a later pass handles the row."""

    name: str
    key: str
    reason: str
    run_id: str
    batch: int
    failed_at: datetime


@dataclass(frozen=True)
class Lease:
    """One held fleet slot: ``slot`` in ``0..limit-1`` of ``key``, held by ``holder`` until ``expires_at``."""

    key: str
    slot: int
    holder: str
    token: str
    expires_at: datetime


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker says of itself when it registers (shown by ``x workers ls``)."""

    id: str
    host: str
    pid: int
    concurrency: int
    queues: tuple[str, ...] | None = None


@dataclass(frozen=True)
class WorkerRecord:
    """One registered worker as the registry sees it now.

    ``alive`` is what the liveness signal says (the database session or the lock file that the
    OS releases when the process dies), never a timer; ``why`` says how it was decided.
    ``running`` are the ids of the jobs it holds claims on. ``clock_offset``: the worker host's
    wall clock minus the database's, as the worker last measured it (``None``: not measured).
    ``wakeups``: how it learns of new jobs (``notify``, or ``polling (why)``), as it last said.
    """

    id: str
    host: str
    pid: int
    concurrency: int
    queues: tuple[str, ...] | None
    started_at: datetime
    last_seen_at: datetime
    alive: bool
    why: str
    running: tuple[str, ...] = ()
    clock_offset: float | None = None
    wakeups: str | None = None


@dataclass(frozen=True)
class RescuedJob:
    """A ``running`` job of a dead worker, put back to ``ready`` by :meth:`WorkerRegistry.rescue`."""

    job_id: str
    queue: str
    worker_id: str


#: ``last_error`` of a job rescued from a dead worker (the worker id is appended).
WORKER_LOST = "X_WORKER_LOST: the worker running this attempt died"


@dataclass(frozen=True)
class MigrationRecord:
    """One applied migration in the ``x_migrations`` ledger."""

    id: str
    applied_at: datetime


class JobIntrospection(Protocol):
    """Read side, for the CLI and dashboards."""

    def list(self, filter: JobFilter = JobFilter()) -> list[JobRecord]:
        """Jobs matching ``filter``, newest first (``created_at`` desc, then ``id`` desc)."""
        ...

    def get(self, job_id: str) -> JobRecord | None:
        """One job, or ``None`` when no job has that id."""
        ...

    def stats(self) -> builtins.list[QueueStats]:
        """Counts per state for every queue that holds a job, ordered by queue name."""
        ...

    def waiting_names(self) -> builtins.list[WaitingName]:
        """Every (queue, name) with jobs waiting to run (ready, delayed, suspended), by queue then name."""
        ...

    def count(self, filter: JobFilter, states: tuple[JobState, ...] | None = None, as_of: float | None = None) -> int:
        """How many jobs match ``filter`` (its ``limit`` ignored), restricted to ``states`` when given
        (then ``filter.state`` is ignored) and to ``updated_at <= as_of`` when given."""
        ...

    def error_groups(self, filter: JobFilter) -> builtins.list[ErrorGroup]:
        """Jobs matching ``filter`` that carry a ``last_error``, grouped by its first line, largest
        group first; at most ``filter.limit`` groups."""
        ...

    def slot_holders(self, flow_key: str) -> builtins.list[JobRecord]:
        """The ``running`` jobs under concurrency key ``flow_key`` (the slots in use), oldest claim first."""
        ...

    def completions(self, since: float, bucket: float = 60.0) -> builtins.list[Completed]:
        """Jobs finished ``done`` from ``since`` (epoch seconds) on, per queue and per ``bucket``
        seconds of epoch time (buckets start at multiples of ``bucket``), by queue then time; a
        bucket with none is left out."""
        ...

    def attempts(self, job_id: str) -> builtins.list[AttemptRecord]:
        """Every attempt of ``job_id`` oldest first (the running or successful one last); ``[]``
        for an unknown job or one never claimed."""
        ...

    def rate_bucket(self, rate_key: str) -> Bucket | None:
        """The token bucket of ``rate_key`` as stored (``None`` before its first start)."""
        ...


class StepStore(Protocol):
    """Durable step results, keyed by (run id, step name)."""

    def load(self, run_id: str) -> dict[str, StepRecord]:
        """Every recorded step of ``run_id`` by name."""
        ...

    def record(self, job_id: str, claim_token: str, name: str, result: Any, connection: Any = None) -> bool:
        """Record step ``name`` of the job's run with a JSON-serialisable ``result``.

        FENCED: writes only if job ``job_id`` is ``running`` under ``claim_token``; returns
        whether it wrote. Recording a name the run already has keeps the first result and
        returns ``True`` (a replay is not an error). ``connection``: the caller's open connection
        to the job store's own database (as ``enqueue`` takes one): the record is written in its
        transaction, not committed, so it commits or rolls back with the caller's other writes.
        A driver with no database to share refuses it (``X_DRIVER_CONNECTION``).
        """
        ...


class BackfillLedger(Protocol):
    """The ``x_backfills`` table: one row per pass, history never overwritten."""

    def start(self, run_id: str, name: str, checksum: str, job_id: str | None,
              kind: BackfillKind = "pass") -> BackfillRun:
        """Open the row for ``run_id`` (status ``running``), or return it (set back to
        ``running``, error cleared) when a previous attempt of the same pass opened it. A pause
        request (``paused_by``) survives the reopening: the operator still wants the pass paused."""
        ...

    def progress(self, run_id: str, batches: int, rows: int, throttle: str | None = None) -> bool:
        """Record how far the pass got and why it waits (``throttle``; ``None`` clears it).
        Returns whether an operator asked the pass to pause (:meth:`request_pause`)."""
        ...

    def request_pause(self, name: str, actor: str) -> BackfillRun | None:
        """Ask the newest ``running`` pass of ``name`` to pause at its next batch boundary
        (``paused_by`` = ``actor``). ``None`` when no pass of ``name`` is running."""
        ...

    def pause(self, run_id: str) -> bool:
        """The pass itself, at a batch boundary: a ``running`` row with a pause request becomes
        ``paused``. ``False`` (nothing changed) when there was no request or the row is not running."""
        ...

    def resume(self, name: str, actor: str) -> BackfillRun | None:
        """Resume the newest pass of ``name`` that is ``paused`` or asked to pause: the row goes
        back to ``running`` with the request cleared, and its job, suspended by the pause, becomes
        runnable now (in the same transaction) so a worker picks the pass up from its last
        checkpoint. ``None`` when no pass of ``name`` is paused or asked to pause."""
        ...

    def quarantine(self, run_id: str, name: str, batch: int, failed: Sequence[tuple[str, str]],
                   handled: Sequence[str], connection: Any = None) -> None:
        """Store the rows ``failed`` (``(key, reason)``) of batch ``batch`` of pass ``run_id`` as
        quarantined (a key already stored is taken over by this pass, its reason replaced), count
        the keys new to this pass in the row's ``failures``, and forget the keys ``handled``
        (rows a later pass handled without a failure). With ``connection`` (SQL drivers, on the
        job store's database): inside its transaction, uncommitted. Idempotent: a replayed batch
        neither counts its failures twice nor loses them."""
        ...

    def failures(self, name: str, limit: int = 1000, after: str | None = None) -> builtins.list[RowFailure]:
        """Quarantined rows of ``name`` by ``key``, from after ``after`` (keyset paging)."""
        ...

    def outstanding(self, name: str) -> int:
        """How many rows of ``name`` are quarantined now."""
        ...

    def finish(self, run_id: str, status: BackfillStatus, error: str | None = None) -> None:
        """Close a ``running`` row as ``completed``, ``failed`` or ``cancelled`` (``finished_at`` =
        now). A row already closed (a cancel closed it under its pass) is left as it is."""
        ...

    def get(self, run_id: str) -> BackfillRun | None:
        """One pass by run id."""
        ...

    def last_completed(self, name: str) -> BackfillRun | None:
        """The most recently finished ``completed`` pass (kind ``pass``) of ``name``."""
        ...

    def list(self, name: str | None = None) -> builtins.list[BackfillRun]:
        """Every pass (of ``name``), newest first."""
        ...


class LeaseStore(Protocol):
    """Fleet slots: at most ``limit`` concurrent holders of a key across every worker."""

    def acquire(self, key: str, holder: str, limit: int, ttl: float) -> Lease | None:
        """Take a free (or expired) slot of ``key``; ``None`` when all ``limit`` are held."""
        ...

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend a lease still held under its token; ``None`` when it was lost."""
        ...

    def release(self, lease: Lease) -> bool:
        """Free the slot if still held under the lease's token."""
        ...

    def holders(self, key: str) -> list[Lease]:
        """Unexpired leases of ``key``, by slot."""
        ...


class WorkerRegistry(Protocol):
    """The ``x_workers`` table and each worker's liveness signal.

    Liveness is what the database or the OS says, not a timer: on PostgreSQL a session-level
    advisory lock held on a connection the worker keeps open (the server frees it the moment that
    connection dies); on SQLite an ``flock`` on a lock file beside the database (the kernel frees
    it the moment the process dies); in memory a flag (one process). A worker whose signal is
    free is dead, and :meth:`rescue` puts its running jobs back at once, each fenced: the old
    claim token is cleared, so the dead worker (or one that only looked dead) can settle nothing.
    """

    def register(self, info: WorkerInfo) -> None:
        """Take the worker's liveness signal, then enter (or refresh) its row. Raises
        ``X_WORKER_ID_TAKEN`` when a live worker already holds the id."""
        ...

    def beat(self, worker_id: str, clock_offset: float | None = None, wakeups: str | None = None) -> bool:
        """Record that the worker is here now (with its clock offset and how it is woken); re-take
        its signal and row when they were lost (a dropped connection, a rescue that took it for
        dead). ``False`` when it had to re-register."""
        ...

    def unregister(self, worker_id: str) -> None:
        """Clean shutdown: remove the row, then free the signal. Idempotent."""
        ...

    def abandon(self, worker_id: str) -> None:
        """Free the signal WITHOUT removing the row, exactly as the process dying would."""
        ...

    def list(self) -> list[WorkerRecord]:
        """Every registered worker, alive or presumed dead, by id (probing liveness, changing nothing)."""
        ...

    def rescue(self, worker_id: str) -> builtins.list[RescuedJob]:
        """From worker ``worker_id``: find registered workers whose signal is free, put their
        ``running`` jobs back to ``ready`` (attempt counted, claim cleared, ``last_error``
        :data:`WORKER_LOST`), and remove their rows, in one transaction."""
        ...


class QueueControl(Protocol):
    """Queue pause and resume, kept in ``x_queues``, and the per-queue overview.

    A paused queue is skipped by every claim (so no new attempt starts from it, on any worker,
    from the next claim on); running attempts finish and enqueue is still accepted. Each pause or
    resume is written to the audit log in the same transaction.
    """

    def pause(self, queue: str, actor: str) -> bool:
        """Pause ``queue``; ``False`` when it already was (the act is still audited)."""
        ...

    def resume(self, queue: str, actor: str) -> bool:
        """Resume ``queue`` and wake the workers that serve it; ``False`` when it was not paused."""
        ...

    def paused(self) -> list[str]:
        """The paused queues, by name."""
        ...

    def overview(self, window: float = 3600.0) -> builtins.list[QueueInfo]:
        """Every queue that holds a job or was ever paused, by name (see :class:`QueueInfo`)."""
        ...


class ScheduleStore(Protocol):
    """The ``x_schedules`` table: per schedule, the newest tick fired, so each tick fires once.

    No leader: every worker computes the same ticks and calls :meth:`fire`; the row's compare-and-set
    lets exactly one of them through per tick, and the job is enqueued in that same transaction.
    """

    def register(self, key: str, start: float) -> ScheduleRecord:
        """The row of ``key``, created with ``last_tick = start`` when absent (a new schedule fires
        the ticks after its first sighting, not the past)."""
        ...

    def fire(self, key: str, tick: float, request: EnqueueRequest | None) -> Fired | None:
        """In ONE transaction: move ``last_tick`` of ``key`` up to ``tick`` if it is earlier, and then
        enqueue ``request`` (unless the schedule is paused or ``request`` is ``None``: a skipped
        tick). ``None`` when the row already had ``tick`` or a later one (another worker fired it),
        or has no row."""
        ...

    def get(self, key: str) -> ScheduleRecord | None:
        """One schedule's row."""
        ...

    def set_paused(self, key: str, paused: bool, actor: str) -> bool:
        """Pause or resume ``key`` (audited as ``pause``/``resume`` with target ``{"schedule": key}``);
        whether it changed. A schedule with no row yet gets one."""
        ...

    def list(self) -> list[ScheduleRecord]:
        """Every schedule row, by key."""
        ...


class AuditLog(Protocol):
    """The ``x_audit`` table: what operators did, newest first."""

    def open(self, actor: str, action: AuditAction, target: dict[str, Any]) -> AuditEntry:
        """Start an entry (status ``running``, nothing touched yet)."""
        ...

    def close(self, audit_id: str, status: AuditStatus, touched: int | None = None) -> None:
        """End a ``running`` entry with ``status`` (``finished_at`` = now), setting ``touched`` when
        given (an action that did not count in batches); closed ones stay as they are."""
        ...

    def list(self, limit: int = DEFAULT_LIST_LIMIT, action: AuditAction | None = None) -> builtins.list[AuditEntry]:
        """The newest ``limit`` entries (of ``action``)."""
        ...


class MigrationLedger(Protocol):
    """The ``x_migrations`` table: which migrations (the library's and the app's) are applied."""

    def applied(self) -> list[MigrationRecord]:
        """Every applied migration, oldest first."""
        ...

    def is_applied(self, migration_id: str) -> bool:
        """Whether ``migration_id`` is recorded."""
        ...

    def mark_applied(self, migration_id: str) -> None:
        """Record ``migration_id`` as applied (idempotent)."""
        ...


WakeCallback = Callable[[str], None]


@runtime_checkable
class JobDriver(Protocol):
    """Storage for jobs, steps, the backfill ledger, leases and migrations.

    Methods are synchronous and thread-safe: the worker calls them from a thread pool, app code
    calls ``enqueue`` from wherever it runs. ``connection`` on enqueue is the caller's own open
    transaction (a ``sqlite3.Connection``, a psycopg ``Connection`` or a SQLAlchemy
    ``Connection``): the job is written inside it and vanishes if it rolls back.
    """

    name: str
    #: The clock every timestamp this driver writes comes from (public: enqueue reads it too).
    clock: Clock
    #: The URL this driver was created from (``memory://``, ``sqlite:///...``, ``postgresql://...``).
    url: str
    #: True when another process's enqueue wakes :meth:`subscribe` callbacks (LISTEN/NOTIFY).
    supports_listen_notify: bool
    #: True when ``enqueue(connection=...)`` can join a caller's transaction.
    supports_transactional_enqueue: bool

    # Read-only in the protocol (properties are covariant), so a driver may expose its own
    # concrete store types.
    @property
    def introspect(self) -> JobIntrospection:
        """Listing, lookup and stats."""
        ...

    @property
    def steps(self) -> StepStore:
        """Durable step results."""
        ...

    @property
    def backfills(self) -> BackfillLedger:
        """The ``x_backfills`` ledger."""
        ...

    @property
    def leases(self) -> LeaseStore:
        """Fleet slots."""
        ...

    @property
    def migrations(self) -> MigrationLedger:
        """The ``x_migrations`` ledger."""
        ...

    @property
    def workers(self) -> WorkerRegistry:
        """The worker registry and liveness."""
        ...

    @property
    def queues(self) -> QueueControl:
        """Queue pause, resume and overview."""
        ...

    @property
    def audit(self) -> AuditLog:
        """The operator audit log."""
        ...

    @property
    def schedules(self) -> ScheduleStore:
        """Periodic schedules' ticks."""
        ...

    def migrate(self) -> list[str]:
        """Create or upgrade the library's tables; returns the migration ids applied now."""
        ...

    def enqueue(self, request: EnqueueRequest, connection: Any = None) -> EnqueueResult:
        """Write one job, deduplicated per (name, idempotency key) among live states.

        A live duplicate is returned with ``deduped=True``, or raises
        :class:`~ultimat3.drivers.errors.JobDuplicateError` under ``on_conflict='error'``.
        """
        ...

    def enqueue_many(self, requests: Sequence[EnqueueRequest], connection: Any = None) -> list[EnqueueResult]:
        """Write several jobs in one transaction, with the same per-request rules as ``enqueue``."""
        ...

    async def aenqueue_many(self, requests: Sequence[EnqueueRequest], connection: Any = None) -> list[EnqueueResult]:
        """:meth:`enqueue_many` for async callers, never blocking the event loop. ``connection`` is
        the caller's own ASYNC transaction (a SQLAlchemy ``AsyncConnection``/``AsyncSession``, a
        ``psycopg.AsyncConnection`` or an ``asyncpg.Connection``, as the driver supports): the jobs
        exist if and only if it commits, and this process's workers are woken at that commit."""
        ...

    async def aclose(self) -> None:
        """Release what this driver holds for the running event loop (its async pool); call it
        before the loop ends. :meth:`close` releases the rest."""
        ...

    def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        """Atomically move up to ``request.limit`` runnable jobs to ``running`` for this worker,
        incrementing ``attempt``, setting ``visible_at = now + visibility_timeout`` and minting a
        new claim token for each. Safe under concurrent claimers (SKIP LOCKED / BEGIN IMMEDIATE)."""
        ...

    def ack(self, job_id: str, claim_token: str, result: Any = None) -> bool:
        """Mark ``done`` (storing ``result``, clearing ``last_error``) if still running under ``claim_token``."""
        ...

    def ack_many(self, acks: Sequence[Ack]) -> list[bool]:
        """:meth:`ack` for several jobs in ONE transaction (one commit), each fenced on its own
        token exactly as :meth:`ack` is; returns, per item and in order, whether it was settled.
        Workers batch the acks of attempts that finish together, so a busy worker pays one
        commit for many jobs instead of one each."""
        ...

    def ack_and_claim(self, acks: Sequence[Ack], request: ClaimRequest) -> tuple[list[bool], ClaimBatch]:
        """:meth:`ack_many` then :meth:`claim` in ONE transaction (one commit, one round trip where
        the database allows): the settled flags, per ack and in order, and the claimed batch.

        The acks are fenced exactly as :meth:`ack_many`'s, and the claim is exactly
        :meth:`claim`'s; if either raises, neither is written. A busy worker uses it to hand the
        slots of the attempts it acks straight to the next jobs, paying one commit per batch
        instead of two."""
        ...

    def nack(self, job_id: str, claim_token: str, request: NackRequest) -> bool:
        """Put a failed or suspended attempt back, or dead-letter it, if still running under
        ``claim_token``. See :class:`NackRequest`."""
        ...

    def heartbeat(self, job_id: str, claim_token: str, visibility_timeout: float) -> bool:
        """Extend the claim; ``False`` when it is gone (cancelled, re-claimed, settled)."""
        ...

    def cancel(self, job_id: str, reason: str | None = None) -> JobRecord | None:
        """Cancel a job that is not finished; returns the row (unchanged when it was already
        ``done``, ``dead`` or ``cancelled``), or ``None`` for an unknown id. ``reason`` becomes
        ``last_error``; without one the previous ``last_error`` is kept. The claim is cleared. In
        the same transaction, the run's ``x_backfills`` row, if it is ``running``, is closed as
        ``cancelled`` with the reason."""
        ...

    def retry(self, job_id: str) -> JobRecord | None:
        """Operator retry: a ``dead`` or ``cancelled`` job becomes ``ready`` now with ``attempt``
        0 and the same run (its recorded steps replay), claim and visibility cleared. Other states
        are returned unchanged; a second live job under the same key raises ``JobDuplicateError``."""
        ...

    def bulk(self, request: BulkRequest) -> BulkBatch:
        """One batch of an operator's bulk action, in ONE transaction (see :class:`BulkRequest`).

        ``retry`` does to each job what :meth:`retry` does (same run, attempt 0, ready now), but a
        job whose (name, idempotency key) a live job holds is left as it is, not raised on; of two
        candidates under one key only one is revived. ``cancel`` does what :meth:`cancel` does,
        backfill ledger row included. ``delete`` removes the job and its run's steps (a run id is
        minted with its job and no other job carries it), and closes a ``running`` ledger row of
        its run as ``cancelled``.
        Workers of the queues a retry made runnable are woken.
        """
        ...

    def prune(self, older_than: float) -> int:
        """Delete finished jobs (and their steps) with ``finished_at <= now - older_than``; returns the count.
        Also forgets the rate buckets that are full again (a missing bucket reads as full, so
        nothing a claim decides changes; a key used once no longer keeps a row forever)."""
        ...

    def subscribe(self, callback: WakeCallback) -> Callable[[], None]:
        """Call ``callback(queue)`` (from any thread) when a job may have become runnable.
        Returns an unsubscribe function. Drivers without cross-process notification still
        call it for enqueues made through this driver instance."""
        ...

    def close(self) -> None:
        """Release connections and background threads."""
        ...

