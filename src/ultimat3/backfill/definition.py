"""What a backfill IS: its input, its declaration, a batch, a report, progress and dry-run
records. A leaf: every other module of the package imports it, it imports none of them."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Select

from ultimat3.backfill.health import Health
from ultimat3.backfill.pacer import Pacer
from ultimat3.backfill.requires import MigrationRequirement
from ultimat3.backfill.sizing import Adaptive
from ultimat3.core.context import Ctx, Environment
from ultimat3.core.errors import XError
from ultimat3.jobs.job import Tenant
from ultimat3.jobs.signal import AbortSignal

#: ``engine=JOB_STORE``: the backfill's tables live in the job store's own database. Said
#: explicitly, never assumed: a default would sweep whatever same-named table the job database has.
JOB_STORE = "job-store"
#: Rows per page and per durable step: one statement's worth of work that an attempt can still
#: finish well inside its claim. Smaller batches mean many more step rows for the same sweep.
DEFAULT_BACKFILL_BATCH = 1000

class BackfillInput(BaseModel):
    """A backfill's whole payload. What to visit is declared, never enqueued, so a queued row
    cannot drift from the code; ``force`` only decides whether a name the ledger already records
    as completed runs a SECOND pass (written as a new ledger row — history is kept)."""

    model_config = ConfigDict(extra="forbid")

    force: bool = False
    #: Run a ``retry`` pass over exactly the rows earlier passes quarantined (``batch.fail``),
    #: instead of a sweep of the whole source.
    retry_failed: bool = False


class BackfillError(XError):
    """A backfill pass refused to start or to finish. Never retried: the same attempt would fail
    the same way, so the job is dead-lettered at once with the reason on the row."""

    code = "X_BACKFILL"
    retryable = False


@dataclass(frozen=True)
class Batch:
    """What ``handle`` receives: one page of rows and the pass's context.

    ``rows`` are SQLAlchemy ``Row`` objects from the source's select. ``signal`` is the attempt's
    abort signal: pass it to anything slow and stop when it is set. ``index`` is 0-based and is
    also the durable step the batch is recorded under (``batch:<index>``). A batch may be handled
    twice (the one in flight when an attempt died), so the handler must be idempotent -- unless
    it writes through ``connection``.

    ``connection`` (a SQLAlchemy ``Connection`` in an open transaction) is given when the pass's
    engine is the job store's own database (``engine="job-store"``): the batch's checkpoint is
    recorded in that same transaction, so what the handler writes through it commits exactly
    once with the checkpoint -- a pass killed at any instant replays no batch's writes. Writes made
    elsewhere (another engine, an API) are still at-least-once. A backfill declared
    ``transactional=True`` gets it on any engine (its batch commits as one transaction; the
    checkpoint follows it unless the engine is the job store's). ``None`` otherwise.

    ``keys`` lists the rows' keys in order (what an ``UPDATE ... WHERE id = ANY(...)`` needs).

    ``fail(row, reason)`` quarantines a row the handler cannot handle: the pass goes on, the row
    is stored with its reason (``x db backfill failures NAME``) until a ``--retry-failed`` pass
    handles it.
    """

    rows: list[Row[Any]]
    ctx: Ctx
    signal: AbortSignal
    index: int
    connection: Connection | None = None
    #: The backfill's name and where the key sits in each row: how ``fail`` finds a row's key.
    backfill: str = ""
    key_position: int = 0
    _failed: dict[Any, str] = field(default_factory=dict, repr=False, compare=False)

    def fail(self, row: Row[Any] | Any, reason: str) -> None:
        """Quarantine ``row`` (one of :attr:`rows`, or its key) with ``reason``; the pass goes on.
        A row of another batch, or an empty reason, is refused (``X_BACKFILL_FAIL``)."""
        key = row[self.key_position] if isinstance(row, Row) else row
        if not isinstance(reason, str) or not reason.strip():
            raise BackfillError(
                f'backfill "{self.backfill}": batch {self.index} failed row {key!r} with reason {reason!r}',
                'say why, e.g. batch.fail(row, "email is not valid: \'x@\'")', code="X_BACKFILL_FAIL")
        if not isinstance(key, Hashable) or all(r[self.key_position] != key for r in self.rows):
            raise BackfillError(
                f'backfill "{self.backfill}": batch {self.index} has no row with key {key!r} to fail',
                "pass one of batch.rows (or its key) to batch.fail", code="X_BACKFILL_FAIL")
        self._failed[key] = reason

    @property
    def keys(self) -> list[Any]:
        """The page's keys, in key order: ``[row[key] for row in rows]`` without an attribute
        lookup per row (e.g. ``UPDATE ... WHERE id = ANY(:keys)``)."""
        position = self.key_position
        return [row[position] for row in self.rows]

    @property
    def failed(self) -> dict[Any, str]:
        """The rows failed so far: key -> reason."""
        return dict(self._failed)


@dataclass(frozen=True)
class BackfillReport:
    """What a pass reports; the job's result is :meth:`to_dict`.

    ``batches``/``rows`` count everything THIS pass covered, replayed batches included (0 when
    skipped). ``skipped`` is true when the ledger already held a completed pass and ``force`` was
    not set; ``previous_run_id`` is that completed pass (for a forced pass: the one it follows).
    """

    name: str
    batches: int
    rows: int
    skipped: bool = False
    previous_run_id: str | None = None
    #: Rows this pass quarantined; ``retry`` for a ``--retry-failed`` pass.
    failures: int = 0
    kind: Literal["pass", "retry"] = "pass"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackfillReport:
        """Read back a job result written by :meth:`to_dict`."""
        return cls(
            name=str(data["name"]),
            batches=int(data["batches"]),
            rows=int(data["rows"]),
            skipped=bool(data.get("skipped", False)),
            previous_run_id=data.get("previous_run_id"),
            failures=int(data.get("failures", 0)),
            kind="retry" if data.get("kind") == "retry" else "pass",
        )


@dataclass(frozen=True)
class BackfillProgress:
    """Sent to progress listeners after every batch (``replayed`` for ones a retry skipped over),
    and while a tripped health check holds the pass (``throttle``: why)."""

    name: str
    run_id: str
    batches: int
    rows: int
    replayed: bool
    throttle: str | None = None
    failures: int = 0


@dataclass(frozen=True)
class DryRun:
    """What a pass would do now: ``rows`` still matching (``None`` without ``count=``), the
    ``batches`` that takes and the ``seconds`` the pacer would spread them over."""

    name: str
    rows: int | None
    batches: int | None
    seconds: float | None


#: ``source(ctx)``: the rows to visit, as a select; built once per attempt of a pass (at its first page).
Source = Callable[[Ctx], "Select[*tuple[Any, ...]]"]
#: ``handle(batch)``: sync, or async (awaited on the pass's own loop).
Handle = Callable[[Batch], object]
#: ``count(ctx)``: rows still matching — an int (possibly awaited) or a select that is counted.
Count = Callable[[Ctx], object]
#: ``engine=``: an Engine, a function returning one, or ``JOB_STORE``.
EngineSource = Engine | Callable[[], Engine] | Literal["job-store"]


@dataclass(frozen=True, eq=False)
class BackfillDefinition:
    """Everything :func:`backfill` knows that a :class:`JobHandle` has no field for."""

    name: str
    tenant: Tenant
    source: Source
    handle: Handle
    batch: int | Adaptive
    rate: float
    checksum: str
    pacer: Pacer
    requires: MigrationRequirement | None = None
    environments: tuple[Environment, ...] | None = None
    count: Count | None = None
    engine: EngineSource | None = None
    key: ColumnElement[Any] | str | None = None
    health: Health | None = None
    transactional: bool = False


def batch_step_name(index: int) -> str:
    """The durable step a batch is recorded under."""
    return f"batch:{index}"
