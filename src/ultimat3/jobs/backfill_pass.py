"""One pass of a backfill: the checks, the ledger row, and the paced keyset sweep.

Runs as the body of the backfill's job, in a worker thread (SQLAlchemy is used synchronously).
Each batch is its own durable step ``batch:<index>`` recording ``{"cursor", "rows"}``; a retried
or resumed attempt replays those records without reading a page or calling the handler, and goes
on from the last cursor — so no row is skipped and at most one batch (the one in flight when the
previous attempt died) is handled twice.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import signal as signal_module
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic_core import to_jsonable_python
from sqlalchemy import Table, create_engine, func, select
from sqlalchemy import inspect as inspect_database
from sqlalchemy.engine import Engine, Row, make_url
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Select, TableClause

from ultimat3.core.context import Actor, Ctx, Environment, default_environment, use_ctx
from ultimat3.core.errors import Interrupted, XError
from ultimat3.jobs.backfill_registry import backfill_origin
from ultimat3.jobs.backfill_scope import backfill_scope
from ultimat3.jobs.driver import BackfillLedger, JobDriver
from ultimat3.jobs.errors import JobAbortedError
from ultimat3.jobs.execute import SHUTDOWN
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.migrations import requirement_error
from ultimat3.jobs.runtime import get_driver
from ultimat3.jobs.signal import AbortSignal
from ultimat3.jobs.steps import SyncStep
from ultimat3.jobs.worker import Worker
from ultimat3.tenancy.guard import scoped
from ultimat3.tenancy.tables import base_of
from ultimat3.tenancy.where import and_where

if TYPE_CHECKING:
    from ultimat3.jobs.backfill import BackfillDefinition, BackfillInput

#: ``engine=JOB_STORE``: the backfill's tables live in the job store's own database. Said
#: explicitly, never assumed: a default would sweep whatever same-named table the job database has.
JOB_STORE = "job-store"

__all__ = [
    "JOB_STORE",
    "BackfillError",
    "BackfillProgress",
    "BackfillReport",
    "Batch",
    "DryRun",
    "ProgressListener",
    "add_progress_listener",
    "batch_step_name",
    "check_environment",
    "check_requires",
    "check_source_tables",
    "count_remaining",
    "definition_engine",
    "dispose_engines",
    "dry_run",
    "engine_for_url",
    "run_backfill",
    "run_pass",
]

log = logging.getLogger("ultimat3.backfill")
#: Seconds between writes of a running pass's counters to its ledger row.
LEDGER_PROGRESS_EVERY = 1.0
T = TypeVar("T")


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
    twice (the one in flight when an attempt died), so the handler must be idempotent.
    """

    rows: list[Row[Any]]
    ctx: Ctx
    signal: AbortSignal
    index: int


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
        )


@dataclass(frozen=True)
class BackfillProgress:
    """Sent to progress listeners after every batch (``replayed`` for ones a retry skipped over)."""

    name: str
    run_id: str
    batches: int
    rows: int
    replayed: bool


ProgressListener = Callable[[BackfillProgress], None]
_listeners: list[ProgressListener] = []
_listeners_lock = threading.Lock()


def add_progress_listener(listener: ProgressListener) -> Callable[[], None]:
    """Call ``listener`` after every batch of every pass in this process; returns a remover.

    Called from the pass's worker thread. A listener that raises is logged and ignored.
    """
    with _listeners_lock:
        _listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


def _emit(progress: BackfillProgress) -> None:
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(progress)
        except Exception:
            # A progress bar that breaks must not fail the pass it is drawing.
            log.exception("backfill progress listener failed")


def batch_step_name(index: int) -> str:
    """The durable step a batch is recorded under."""
    return f"batch:{index}"


# -- engines ------------------------------------------------------------------------------------

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def engine_for_url(url: str, *, backfill: str = "?") -> Engine:
    """A SQLAlchemy engine on the database a driver URL names (cached per URL).

    ``sqlite:///path`` is the same file; ``postgresql://...`` gets the psycopg 3 dialect.
    """
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        target = url
        options: dict[str, Any] = {"connect_args": {"timeout": 30}}
    elif scheme in ("postgres", "postgresql") or scheme.startswith("postgresql+"):
        parsed = make_url("postgresql" + url[len(scheme):] if scheme == "postgres" else url)
        target = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        options = {"pool_pre_ping": True}
    else:
        raise BackfillError(
            f'backfill "{backfill}" declares no engine= and the driver\'s URL {url!r} is not a SQL database',
            "pass engine=create_engine(...) (or a function returning one) for the tables its source reads",
            code="X_BACKFILL_ENGINE",
        )
    with _engines_lock:
        engine = _engines.get(target)
        if engine is None:
            engine = create_engine(target, **options)
            _engines[target] = engine
        return engine


def dispose_engines() -> None:
    """Close every engine :func:`engine_for_url` built (tests, process shutdown)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()


def definition_engine(definition: BackfillDefinition, driver: JobDriver) -> Callable[[], Engine]:
    """The backfill's app engine as a function: its ``engine=``, else the driver's database.
    Nothing is connected until it is called."""
    return _LazyEngine(definition, driver)


class _LazyEngine:
    """The backfill's app engine, built on first use and at most once per pass."""

    def __init__(self, definition: BackfillDefinition, driver: JobDriver) -> None:
        self._definition = definition
        self._driver = driver
        self._engine: Engine | None = None

    def __call__(self) -> Engine:
        if self._engine is None:
            source = self._definition.engine
            name = self._definition.name
            if source is None or isinstance(source, str):  # JOB_STORE: the declaration said so
                self._engine = engine_for_url(self._driver.url, backfill=name)
            elif isinstance(source, Engine):
                self._engine = source
            else:
                built = source()
                if not isinstance(built, Engine):
                    raise BackfillError(
                        f'backfill "{name}": its engine= function returned {type(built).__name__}, not an Engine',
                        "return sqlalchemy.create_engine(...) from it (build it once and return the same one)",
                        code="X_BACKFILL_ENGINE",
                    )
                self._engine = built
        return self._engine


class _Awaiter:
    """Runs what ``handle``/``count`` return when it is awaitable, on one loop per pass."""

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None

    def resolve(self, value: Any) -> Any:
        if not inspect.isawaitable(value):
            return value
        if self._runner is None:
            self._runner = asyncio.Runner()
        # A fresh copy each time, so the pass's ambient context (cross-tenant scope included)
        # is what the coroutine sees.
        return self._runner.run(_wait_for(value), context=contextvars.copy_context())

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


async def _wait_for(value: Awaitable[T]) -> T:
    return await value


# -- checks -------------------------------------------------------------------------------------


def check_environment(definition: BackfillDefinition, environment: Environment) -> None:
    """Refuse with ``X_BACKFILL_ENVIRONMENT`` when ``environment`` is not one the backfill allows."""
    allowed = definition.environments
    if allowed is not None and environment not in allowed:
        raise BackfillError(
            f'backfill "{definition.name}" may run in {", ".join(allowed)}, not in "{environment}"',
            f'run it in one of those (X_ENV), or add "{environment}" to its environments=[...] '
            "if it belongs there too",
            code="X_BACKFILL_ENVIRONMENT",
        )


def check_requires(
    definition: BackfillDefinition, driver: JobDriver, engine: Callable[[], Engine] | None = None
) -> None:
    """Refuse with ``X_BACKFILL_REQUIRES`` when the declared migration is not applied."""
    if definition.requires is None:
        return
    error = requirement_error(
        driver, definition.name, definition.requires,
        engine if engine is not None else _LazyEngine(definition, driver),
    )
    if error is not None:
        raise error


def count_remaining(definition: BackfillDefinition, ctx: Ctx, engine: Callable[[], Engine],
                    awaiter: _Awaiter | None = None) -> int:
    """What the backfill's ``count(ctx)`` answers: an int, or a select whose rows are counted.

    A select is passed through :func:`~ultimat3.tenancy.scoped` first; an int is the author's
    own count, which they scope themselves.
    """
    assert definition.count is not None
    own = awaiter is None
    resolver = awaiter if awaiter is not None else _Awaiter()
    try:
        value = resolver.resolve(definition.count(ctx))
    finally:
        if own:
            resolver.close()
    if isinstance(value, Select):
        statement = select(func.count()).select_from(scoped(value, ctx, bind=engine()).subquery())
        with engine().connect() as conn:
            value = conn.execute(statement).scalar_one()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackfillError(
            f'backfill "{definition.name}": count() returned {value!r}, not a number of rows',
            "return an int >= 0, or a select of the rows still to do (it is counted for you)",
            code="X_BACKFILL_COUNT",
        )
    return value


# -- paging -------------------------------------------------------------------------------------


def _key_error(definition: BackfillDefinition, problem: str) -> BackfillError:
    return BackfillError(
        f'backfill "{definition.name}": {problem}',
        'declare key=<the primary-key column> (e.g. key=posts.c.id) and make sure source selects it; '
        "keyset paging needs one unique, ordered column",
        code="X_BACKFILL_KEY",
    )


def _key_column(definition: BackfillDefinition, stmt: Select[Any]) -> ColumnElement[Any]:
    key = definition.key
    columns = stmt.selected_columns
    if isinstance(key, str):
        found = columns.get(key)
        if found is None:
            raise _key_error(definition, f"key={key!r} is not a column its source selects")
        return found
    if key is not None:
        if not columns.contains_column(key):
            raise _key_error(definition, f"key={key} is not among the columns its source selects")
        return key
    froms = stmt.get_final_froms()
    if len(froms) != 1:
        raise _key_error(definition, f"its source reads {len(froms)} FROM clauses, so no key can be inferred")
    base = base_of(froms[0])  # through every layer of aliasing
    if not isinstance(base, Table):
        raise _key_error(definition, "its source does not select from a table, so no key can be inferred")
    primary = list(base.primary_key.columns)
    if len(primary) != 1:
        raise _key_error(
            definition, f'table "{base.name}" has a {len(primary)}-column primary key, not a single column'
        )
    column = froms[0].c[primary[0].key]
    if not columns.contains_column(column):
        raise _key_error(definition, f'its source does not select the key column "{column.key}"')
    return column


def _source_statement(definition: BackfillDefinition, ctx: Ctx) -> Select[Any]:
    stmt = definition.source(ctx)
    if not isinstance(stmt, Select):
        raise BackfillError(
            f'backfill "{definition.name}": source(ctx) returned {type(stmt).__name__}, not a select',
            "return a sqlalchemy select, e.g. source=lambda ctx: select(posts).where(posts.c.slug.is_(None))",
            code="X_BACKFILL_SOURCE",
        )
    return stmt


def _page_statement(definition: BackfillDefinition, ctx: Ctx, cursor: Any, first: bool,
                    engine: Engine) -> tuple[Select[Any], int]:
    """The page's statement and the POSITION of the key among its columns.

    Built afresh for every page: source is lazy, and scoping happens against the pass's ctx. The
    key is read back by position, not by column object: scoping rebuilds the statement, so the
    source's column objects are not the ones the rows are keyed by (a subquery, a CTE or an
    alias of an alias would otherwise fail to find it).
    """
    stmt = _source_statement(definition, ctx)
    key = _key_column(definition, stmt)
    position = next(i for i, column in enumerate(stmt.selected_columns) if column is key)
    if not first:
        # Grouped: an OR inside the source's own criteria must not swallow the cursor condition.
        stmt = and_where(stmt, key > cursor)
    # The pass owns the order and the limit: keyset paging is only correct in key order.
    page = stmt.order_by(None).order_by(key).limit(definition.batch)
    return scoped(page, ctx, bind=engine), position


def _tables_read(stmt: Select[Any]) -> list[TableClause]:
    found: dict[tuple[str | None, str], TableClause] = {}
    for element in visitors.iterate(stmt):
        if isinstance(element, TableClause):
            found.setdefault((element.schema, element.name), element)
    return list(found.values())


def check_source_tables(definition: BackfillDefinition, statement: Select[Any], engine: Engine) -> None:
    """Refuse with ``X_BACKFILL_TABLE_MISSING`` when a table ``statement`` (the source's) reads is
    not in ``engine``.

    The engine a pass sweeps is a declaration, and a wrong one must not read as success: a table
    missing there means the pass is pointed at the wrong database.
    """
    inspector = inspect_database(engine)
    for table in _tables_read(statement):
        if not inspector.has_table(table.name, schema=table.schema):
            where = engine.url.render_as_string(hide_password=True)
            qualified = f"{table.schema}.{table.name}" if table.schema else table.name
            raise BackfillError(
                f'backfill "{definition.name}" reads table "{qualified}", which does not exist in the database '
                f"its engine points at ({where})",
                f'pass engine= on backfill(name="{definition.name}") for the database that holds "{qualified}" '
                "(create_engine(...) or a function returning one)",
                code="X_BACKFILL_TABLE_MISSING",
            )


def _sweep(definition: BackfillDefinition, ctx: Ctx, step: SyncStep, engine: _LazyEngine,
           awaiter: _Awaiter) -> tuple[int, int]:
    name, run_id, signal = definition.name, step.run_id, step.signal
    ledger = step.driver.backfills
    index = batches = rows = 0
    cursor: Any = None

    # Replay what earlier attempts recorded: no page read, no handler call.
    while (record := step.recorded(batch_step_name(index))) is not None:
        cursor = record.result["cursor"]
        batches += 1
        rows += int(record.result["rows"])
        index += 1
        _emit(BackfillProgress(name, run_id, batches, rows, replayed=True))
    if batches:
        ledger.progress(run_id, batches, rows)
    reported, reported_at = batches, time.monotonic()
    checked = False

    try:
        while True:
            step_name = batch_step_name(index)
            definition.pacer.wait(signal, step_name)
            statement, key = _page_statement(definition, ctx, cursor, index == 0, engine())
            if not checked:
                check_source_tables(definition, statement, engine())
                checked = True
            # One short-lived connection per page: nothing stays open across the handler or the wait.
            # Autocommit: a single SELECT needs no BEGIN/ROLLBACK around it (two round trips saved).
            with engine().connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                page = list(conn.execute(statement).all())
            if not page:
                break
            last = page[-1][key]
            awaiter.resolve(definition.handle(Batch(page, ctx, signal, index)))
            checkpoint = {"cursor": to_jsonable_python(last), "rows": len(page)}
            # Fenced: if this attempt lost its claim the write is refused and JobAbortedError raised.
            step.run(step_name, functools.partial(dict, checkpoint))
            cursor = checkpoint["cursor"]
            batches += 1
            rows += len(page)
            index += 1
            # The batch step above is the durable checkpoint; the ledger's counters are for people
            # watching, so they are written at most every LEDGER_PROGRESS_EVERY seconds and once at
            # the end, not per batch (a second write per batch halved a fast sweep's throughput).
            if time.monotonic() - reported_at >= LEDGER_PROGRESS_EVERY:
                ledger.progress(run_id, batches, rows)
                reported, reported_at = batches, time.monotonic()
            _emit(BackfillProgress(name, run_id, batches, rows, replayed=False))
            if len(page) < definition.batch:
                break  # a short page: the key range is exhausted, no need to pay for an empty read
    finally:
        if batches != reported:
            ledger.progress(run_id, batches, rows)
    return batches, rows


def _error_text(error: BaseException) -> str:
    return str(error) if isinstance(error, XError) else f"{type(error).__name__}: {error}"


def _close_aborted(ledger: BackfillLedger, run_id: str, error: JobAbortedError) -> None:
    if error.reason == "cancelled":
        ledger.finish(run_id, "cancelled", _error_text(error))
    elif error.reason not in ("claim lost", SHUTDOWN):
        ledger.finish(run_id, "failed", _error_text(error))
    # "claim lost": another worker holds the run now and has reopened the row; closing it from
    # here would mark a live pass failed under its feet. A shutdown releases the job back to
    # ready, so the pass is still in progress and its row stays "running" (a cancel of the waiting
    # job closes it in the driver). A timeout is closed as failed with its reason; the retry's
    # start() reopens it, and a run that dies instead is closed by the on_dead hook.


def run_pass(definition: BackfillDefinition, input: BackfillInput, ctx: Ctx, step: SyncStep) -> BackfillReport:
    """Run (or resume) one pass of ``definition`` as the attempt ``step`` belongs to.

    Order: environment, ``requires``, skip-if-completed (unless ``force``), ledger start, the
    paced keyset sweep, the ``count`` convergence check, ledger finish. Any failure closes the
    ledger row as ``failed`` (``cancelled`` on a cancel) and re-raises; a retry reopens it.
    """
    name = definition.name
    driver = step.driver
    engine = _LazyEngine(definition, driver)
    check_environment(definition, ctx.environment)
    check_requires(definition, driver, engine)
    ledger = driver.backfills
    run_id = step.run_id
    own = ledger.get(run_id)
    if own is not None and own.status == "completed":
        # An earlier attempt finished the pass but died before the job was acked.
        return BackfillReport(name, own.batches, own.rows)
    previous = ledger.last_completed(name)
    if previous is not None and not input.force:
        return BackfillReport(name, 0, 0, skipped=True, previous_run_id=previous.run_id)
    ledger.start(run_id, name, definition.checksum, step.job_id)
    awaiter = _Awaiter()
    try:
        with backfill_scope(name, definition.tenant, ctx) as pass_ctx:
            batches, rows = _sweep(definition, pass_ctx, step, engine, awaiter)
            if definition.count is not None:
                remaining = count_remaining(definition, pass_ctx, engine, awaiter)
                if remaining > 0:
                    raise BackfillError(
                        f'backfill "{name}" read its source to the end ({rows} rows in {batches} '
                        f"batches) but count() still reports {remaining} row(s) left: source and "
                        "count select different rows, or handle does not change what source matches",
                        "make count() use the same predicate as source, and make handle move each "
                        "row out of it (or drop count= if rows are meant to stay matched)",
                        code="X_BACKFILL_STALLED",
                    )
    except JobAbortedError as error:
        _close_aborted(ledger, run_id, error)
        raise
    except Exception as error:
        ledger.finish(run_id, "failed", _error_text(error))
        raise
    finally:
        awaiter.close()
    ledger.finish(run_id, "completed")
    return BackfillReport(name, batches, rows, previous_run_id=None if previous is None else previous.run_id)


# -- foreground: dry runs and in-process passes (for `x db backfill NAME --dry-run/--wait`) -------


@dataclass(frozen=True)
class DryRun:
    """What a pass would do now: ``rows`` still matching (``None`` without ``count=``), the
    ``batches`` that takes and the ``seconds`` the pacer would spread them over."""

    name: str
    rows: int | None
    batches: int | None
    seconds: float | None


def _definition_of(handle: JobHandle[Any]) -> BackfillDefinition:
    definition = backfill_origin(handle)
    if definition is None:
        raise BackfillError(
            f"{handle!r} is a plain job, not a backfill",
            "pass a handle returned by backfill(...), e.g. get_backfill(name)",
            code="X_BACKFILL_UNKNOWN",
        )
    return definition


def dry_run(handle: JobHandle[Any], driver: JobDriver | None = None,
            environment: Environment | None = None) -> DryRun:
    """Estimate a pass from its ``count`` without writing anything.

    ``rows = count(ctx)`` in the context the pass would run in (its org, or the cross-tenant
    scope of a ``tenant='none'`` backfill); ``batches = ceil(rows / batch)``;
    ``seconds = batches / rate``. Refuses an environment the backfill does not allow.
    """
    definition = _definition_of(handle)
    env = environment if environment is not None else default_environment()
    check_environment(definition, env)
    target = driver if driver is not None else get_driver()
    org = handle.tenant_of(handle.parse_input({}))
    ctx = Ctx(actor=Actor(id=f"backfill:{definition.name}:dry-run", org_id=org), environment=env)
    engine = _LazyEngine(definition, target)
    with use_ctx(ctx), backfill_scope(definition.name, definition.tenant, ctx) as pass_ctx:
        # Builds the source once to learn which tables it reads; no page is read.
        check_source_tables(definition, _source_statement(definition, pass_ctx), engine())
        if definition.count is None:
            return DryRun(definition.name, None, None, None)
        rows = count_remaining(definition, pass_ctx, engine)
    batches = math.ceil(rows / definition.batch)
    return DryRun(definition.name, rows, batches, batches / definition.rate)


def _first_line(text: str | None) -> str:
    return (text or "no error").strip().splitlines()[0] if (text or "").strip() else "no error"


def _drain(worker: Worker, interruptible: bool) -> bool:
    """Run the worker until nothing is runnable; True when Ctrl-C released what it held."""

    async def main() -> bool:
        interrupted = False
        loop = asyncio.get_running_loop()

        def on_interrupt() -> None:
            nonlocal interrupted
            interrupted = True
            # Hand the claim back now (no attempt burned): the next worker resumes the pass at
            # once from its last recorded batch instead of waiting out the visibility timeout.
            worker.release_all()

        watching = interruptible and threading.current_thread() is threading.main_thread()
        if watching:
            loop.add_signal_handler(signal_module.SIGINT, on_interrupt)
        try:
            await worker.drain()
        finally:
            if watching:
                loop.remove_signal_handler(signal_module.SIGINT)
        return interrupted

    return asyncio.run(main())


def run_backfill(handle: JobHandle[Any], *, force: bool = False, driver: JobDriver | None = None,
                 environment: Environment | None = None, poll_interval: float = 0.5,
                 interruptible: bool = False) -> BackfillReport:
    """Enqueue the backfill (joining a live pass under its name) and run it in this process
    until the job settles; returns its report. For sync callers (the CLI), not inside a loop.

    The environment and ``requires`` are checked first, so a refusal writes nothing. A pass that
    ends ``dead`` or ``cancelled`` raises ``X_BACKFILL_FAILED``/``X_BACKFILL_CANCELLED`` (the
    message carries the error's first line; the whole traceback is in ``details["traceback"]``).
    While the job waits out a retry delay, or runs on another worker, this polls and reports that
    worker's progress from the ledger. With ``interruptible`` (the CLI), Ctrl-C releases the claim
    this process holds at once and raises :class:`~ultimat3.core.errors.Interrupted`.
    """
    definition = _definition_of(handle)
    target = driver if driver is not None else get_driver()
    env = environment if environment is not None else default_environment()
    check_environment(definition, env)
    check_requires(definition, target)
    enqueued = handle.enqueue({"force": force}, driver=target)
    worker = Worker(target, names=[handle.name], concurrency=1, environment=env)
    try:
        while True:
            if _drain(worker, interruptible):
                ledger = target.backfills.get(enqueued.run_id)
                where = f" after {ledger.batches} batches / {ledger.rows} rows" if ledger is not None else ""
                raise Interrupted(
                    f'interrupted: released backfill "{definition.name}" (job {enqueued.id}){where}; '
                    "it is ready again and resumes from its last recorded batch",
                    f"a running `x worker` picks it up now, or run `x db backfill {definition.name} --wait` again",
                )
            row = target.introspect.get(enqueued.id)
            if row is None:
                raise BackfillError(
                    f'backfill "{definition.name}": job {enqueued.id} disappeared while running',
                    "check whether it was pruned (x db prune) and run the backfill again",
                    code="X_BACKFILL_FAILED",
                )
            if row.state == "done":
                return BackfillReport.from_dict(row.result)
            if row.state in ("dead", "cancelled"):
                code = "X_BACKFILL_FAILED" if row.state == "dead" else "X_BACKFILL_CANCELLED"
                raise BackfillError(
                    f'backfill "{definition.name}" ended {row.state} (job {row.id}): {_first_line(row.last_error)}',
                    f"see `x jobs show {row.id}` for the whole error; fix the cause, then `x jobs retry {row.id}` "
                    "(the pass resumes from its last batch)",
                    code=code,
                    traceback=row.last_error,
                )
            ledger = target.backfills.get(enqueued.run_id)
            if ledger is not None and row.state == "running":
                # Attached to a pass another worker runs: show its progress, not ours (none).
                _emit(BackfillProgress(definition.name, ledger.run_id, ledger.batches, ledger.rows, replayed=False))
            try:
                time.sleep(poll_interval)
            except KeyboardInterrupt:
                raise Interrupted(
                    f'stopped watching backfill "{definition.name}" (job {row.id}, {row.state}); nothing was '
                    "changed: the worker that holds it carries on",
                    f"`x jobs show {row.id}` shows where it is; `x jobs cancel {row.id}` stops it",
                ) from None
    finally:
        worker.close()
