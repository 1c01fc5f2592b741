"""One pass of a backfill: the checks, the ledger row, and the paced keyset sweep.

Runs as the body of the backfill's job, in a worker thread (SQLAlchemy is used synchronously).
Each batch is its own durable step ``batch:<index>`` recording ``{"cursor", "rows"}``; a retried
or resumed attempt replays those records without reading a page or calling the handler, and goes
on from the last cursor — so no row is skipped and at most one batch (the one in flight when the
previous attempt died) is handled twice."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, Table, bindparam
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Select

from ultimat3.backfill.awaiting import Awaiter
from ultimat3.backfill.checks import (
    check_environment,
    check_requires,
    check_source_tables,
    count_remaining,
    source_statement,
)
from ultimat3.backfill.cursor import decode_cursor, decode_failure_key, encode_cursor, failure_key
from ultimat3.backfill.definition import (
    BackfillDefinition,
    BackfillError,
    BackfillInput,
    BackfillProgress,
    BackfillReport,
    Batch,
    batch_step_name,
)
from ultimat3.backfill.engines import LazyEngine
from ultimat3.backfill.progress import emit
from ultimat3.backfill.scope import backfill_scope
from ultimat3.backfill.sizing import BatchSizer
from ultimat3.backfill.throttle import Throttle
from ultimat3.core.context import Ctx
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import BackfillKind, BackfillLedger
from ultimat3.jobs.errors import JobAbortedError
from ultimat3.jobs.execute import SHUTDOWN
from ultimat3.jobs.steps import SuspendRun, SyncStep
from ultimat3.tenancy.guard import scoped
from ultimat3.tenancy.tables import base_of
from ultimat3.tenancy.where import and_where

__all__ = [
    "CURSOR_PARAMETER",
    "LEDGER_PROGRESS_EVERY",
    "LIMIT_PARAMETER",
    "PAUSE_POLL",
    "PAUSE_RECHECK",
    "PageStatements",
    "page_statement",
    "run_pass",
]

#: Seconds (the pacer's clock) between writes of a running pass's counters to its ledger row.
LEDGER_PROGRESS_EVERY = 1.0


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


def page_statement(definition: BackfillDefinition, ctx: Ctx, cursor: Any, first: bool,
                   engine: Engine, limit: int | None, keys: list[Any] | None = None) -> tuple[Select[Any], int]:
    """The page's statement and the POSITION of the key among its columns.

    Built afresh on each call: source is lazy, and scoping happens against the pass's ctx. The
    key is read back by position, not by column object: scoping rebuilds the statement, so the
    source's column objects are not the ones the rows are keyed by (a subquery, a CTE or an
    alias of an alias would otherwise fail to find it). ``keys``: a retry pass's page, exactly
    those rows (those still matching the source).
    """
    stmt, key, position = _keyed_source(definition, ctx)
    if keys is not None:
        stmt = and_where(stmt, key.in_(keys))
    elif not first:
        # Grouped: an OR inside the source's own criteria must not swallow the cursor condition.
        stmt = and_where(stmt, key > cursor)
    return _ordered(stmt, key, limit, ctx, engine), position


def _keyed_source(definition: BackfillDefinition, ctx: Ctx) -> tuple[Select[Any], ColumnElement[Any], int]:
    """``source(ctx)``, its key column, and where the key sits among its columns."""
    stmt = source_statement(definition, ctx)
    key = _key_column(definition, stmt)
    return stmt, key, next(i for i, column in enumerate(stmt.selected_columns) if column is key)


def _ordered(stmt: Select[Any], key: ColumnElement[Any], limit: int | None, ctx: Ctx,
             engine: Engine) -> Select[Any]:
    # The pass owns the order and the limit: keyset paging is only correct in key order.
    page = stmt.order_by(None).order_by(key)
    if limit is not None:
        page = page.limit(limit)
    return scoped(page, ctx, bind=engine)


#: The bound parameters a sweep's page statement takes its cursor and its size from.
CURSOR_PARAMETER = "x_backfill_cursor"
LIMIT_PARAMETER = "x_backfill_limit"


class PageStatements:
    """A sweep attempt's two page statements, built from ``source(ctx)`` once per attempt.

    The first page has no cursor condition; every later one takes the cursor as the bound
    parameter :data:`CURSOR_PARAMETER`, and both take the page size as :data:`LIMIT_PARAMETER`,
    so a page costs its execution only, not a fresh source, key inference and scoping walk (with
    SQLAlchemy compiling the statement to find its FROM list, twice, that was ~1 ms of a
    1,000-row batch; a ``.limit()`` per page, another ~0.2 ms of CPU). A retried or resumed attempt
    builds them again, so a source that reads the clock or the ctx is re-read at each attempt.
    """

    def __init__(self, definition: BackfillDefinition, ctx: Ctx, engine: Engine) -> None:
        stmt, key, position = _keyed_source(definition, ctx)
        #: Where the key sits among the page's columns (see :func:`page_statement`).
        self.position = position
        limit = bindparam(LIMIT_PARAMETER, type_=Integer)
        self.first = _ordered(stmt, key, None, ctx, engine).limit(limit)
        after = and_where(stmt, key > bindparam(CURSOR_PARAMETER, type_=key.type))
        self.next = _ordered(after, key, None, ctx, engine).limit(limit)

    def page(self, cursor: Any, first: bool, limit: int) -> tuple[Select[Any], dict[str, Any]]:
        """The statement for the page after ``cursor`` (the first page when ``first``), and its
        parameters."""
        if first:
            return self.first, {LIMIT_PARAMETER: limit}
        return self.next, {CURSOR_PARAMETER: cursor, LIMIT_PARAMETER: limit}


#: Seconds (the pacer's clock) between a pass's looks at whether it was asked to pause, when its
#: batches come faster than that; slower passes look at every batch boundary.
PAUSE_POLL = 0.1

#: How long a paused pass's job is parked before it looks at its ledger row again. A resume wakes
#: it at once; the bound only covers a resume that lands while the pass is still suspending itself.
PAUSE_RECHECK = 300.0


#: What the ledger learns from a handled batch: (failure key, reason) pairs, and keys handled.
_Outcome = tuple[list[tuple[str, str]], list[str]]


@dataclass
class _Page:
    """What one batch covers: the rows handed to the handler, the checkpoint's cursor (the last
    key), and the failure keys a retry pass read (``None`` for a sweep page)."""

    rows: list[Row[Any]]
    cursor: Any
    key: int
    quarantined: list[str] | None = None


class _Sweep:
    """One attempt's sweep of a pass: the page loop, its checkpoints, pauses and throttle."""

    def __init__(self, definition: BackfillDefinition, ctx: Ctx, step: SyncStep, engine: LazyEngine,
                 awaiter: Awaiter, kind: BackfillKind, failures: int) -> None:
        self.definition, self.ctx, self.step, self.engine, self.awaiter = definition, ctx, step, engine, awaiter
        self.kind = kind
        self.name, self.run_id, self.signal = definition.name, step.run_id, step.signal
        self.ledger = step.driver.backfills
        self.index = self.batches = self.rows = 0
        #: Rows this pass quarantined, as its ledger row counted them when this attempt began.
        self.failures = failures
        self.cursor: Any = None
        self.reported = -1
        self.reported_at: float | None = None
        self.asked_at = float("-inf")
        self.checked = False
        self.throttle: Throttle | None = None
        #: This attempt's page statements, built at its first page read.
        self.pages: PageStatements | None = None
        #: The pass's connection (:meth:`_connection`), ``None`` until its first batch.
        self.held: Connection | None = None
        self.throttled: str | None = None
        # The pass reads the job store's own database: checkpoints can join the handler's transaction.
        self.same_database = isinstance(definition.engine, str)
        # Only a pass over a backfill with quarantined rows needs to tell the ledger what it handled.
        self.forget = kind == "pass" and self.ledger.outstanding(self.name) > 0

    def run(self) -> tuple[int, int]:
        # Replay what earlier attempts recorded: no page read, no handler call.
        while (record := self.step.recorded(batch_step_name(self.index))) is not None:
            self.cursor = decode_cursor(record.result)
            self.batches += 1
            self.rows += int(record.result["rows"])
            self.index += 1
            emit(BackfillProgress(self.name, self.run_id, self.batches, self.rows, replayed=True,
                                  failures=self.failures))
        sizer = BatchSizer(self.definition.batch)
        pacer = self.definition.pacer
        try:
            # The first boundary always reports: a pause asked for before the pass started applies.
            self._boundary(force=True)
            while True:
                step_name = batch_step_name(self.index)
                pacer.wait(self.signal, step_name)
                limit = sizer.size
                began = pacer.monotonic()
                page = self._batch(limit, step_name)
                if page is None:
                    break
                sizer.observe(len(page.rows), pacer.monotonic() - began)
                self.cursor = page.cursor
                self.batches += 1
                self.rows += len(page.rows)
                self.index += 1
                emit(BackfillProgress(self.name, self.run_id, self.batches, self.rows, replayed=False,
                                      failures=self.failures))
                read = len(page.rows) if page.quarantined is None else len(page.quarantined)
                if read < limit:
                    break  # a short page: the key range is exhausted, no need to pay for an empty read
                self._boundary()
        finally:
            self._release()
            if self.batches != self.reported or self.throttled is not None:
                self.ledger.progress(self.run_id, self.batches, self.rows)
        return self.batches, self.rows

    def _batch(self, limit: int, step_name: str) -> _Page | None:
        """Read the next page and hand it to the handler, on the pass's one connection: a joined
        pass (its checkpoints or its batches transactional) reads inside the batch's transaction,
        so one checkout, one BEGIN and one COMMIT serve the read, the handler and the checkpoint.

        A connection found dead by the read (the database restarted since the last batch) is
        replaced once: nothing of the batch has run, so reading it again on a new one is safe.
        """
        joined = self.same_database or self.definition.transactional
        for last_try in (False, True):
            conn = self._connection(joined)
            handling = False
            outcome: _Outcome = ([], [])
            try:
                # PostgreSQL reads in the batch's transaction (READ COMMITTED: the read's snapshot
                # ends with it). SQLite must not: a transaction that read first and writes later
                # fails, unretried, when another connection commits in between (WAL's busy
                # snapshot), so its read ends before the batch's transaction begins.
                read_joined = joined and conn.dialect.name == "postgresql"
                with conn.begin() if read_joined else contextlib.nullcontext():
                    page = self._read(limit, conn)
                    if page is not None and read_joined:
                        handling = True
                        outcome = self._handle(page, step_name, conn)
                if page is not None and not read_joined:
                    if joined:
                        conn.rollback()  # the read's own (autobegun) transaction: it wrote nothing
                    handling = True
                    with conn.begin() if joined else contextlib.nullcontext():
                        outcome = self._handle(page, step_name, conn if joined else None)
            except BaseException as error:
                if conn.invalidated:
                    self._release()
                lost = isinstance(error, DBAPIError) and error.connection_invalidated
                if last_try or handling or not lost:
                    raise
                continue
            if page is not None and not self.same_database:
                self._settle(page, outcome, step_name)
            return page
        raise AssertionError("unreachable: the last try returns or raises")  # pragma: no cover

    def _connection(self, joined: bool) -> Connection:
        """The pass's connection, checked out at its first batch and held until the attempt ends:
        idle between batches, in no transaction (a joined pass commits each batch; any other
        reads in autocommit), so it pins no snapshot. Per page, a checkout cost a pre-ping and
        the pool's bookkeeping, about a tenth of a fast sweep's time."""
        if self.held is None:
            conn = self.engine().connect()
            if not joined:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            self.held = conn
        return self.held

    def _release(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            held.close()

    def _boundary(self, force: bool = False) -> None:
        """Between batches. The batch steps are the durable checkpoints; the ledger's counters are
        for people watching, so they are written at most every LEDGER_PROGRESS_EVERY seconds, not
        per batch (a second write per batch halved a fast sweep's throughput). Every boundary
        asks whether an operator wants the pass paused."""
        now = self.definition.pacer.monotonic()
        due = force or self.reported_at is None or now - self.reported_at >= LEDGER_PROGRESS_EVERY
        if due:
            asked = self._report(None)
        elif now - self.asked_at >= PAUSE_POLL:
            # Between progress writes a read (no commit, no WAL) answers, so a pause lands at the
            # next boundary: at every one for a pass at rate <= 10/s, within PAUSE_POLL above that
            # (a read per batch cost a fast sweep ~9% of its rows/s).
            own = self.ledger.get(self.run_id)
            asked = own is not None and own.status == "running" and own.paused_by is not None
            self.asked_at = now
        else:
            return
        if asked:
            self._pause()

    def _report(self, throttle: str | None) -> bool:
        self.throttled = throttle
        pause = self.ledger.progress(self.run_id, self.batches, self.rows, throttle)
        self.reported, self.reported_at = self.batches, self.definition.pacer.monotonic()
        self.asked_at = self.reported_at
        if throttle is not None:
            emit(BackfillProgress(self.name, self.run_id, self.batches, self.rows, replayed=False,
                                  throttle=throttle, failures=self.failures))
        return pause

    def _pause(self) -> None:
        if self.ledger.pause(self.run_id):
            # Parked, not failed: the job is suspended (no attempt spent) until `resume` wakes it;
            # the same job, run and ledger row then go on from the last checkpoint.
            raise SuspendRun(PAUSE_RECHECK)

    def _read(self, limit: int, conn: Connection) -> _Page | None:
        engine = self.engine()
        if self.kind == "retry":
            held = self.ledger.failures(self.name, limit=limit, after=self.cursor)
            if not held:
                return None
            keys = [decode_failure_key(failure.key) for failure in held]
            statement, key = page_statement(self.definition, self.ctx, None, False, engine, None, keys)
            return _Page(self._fetch(statement, {}, engine, conn), held[-1].key, key,
                         [failure.key for failure in held])
        if self.pages is None:
            self.pages = PageStatements(self.definition, self.ctx, engine)
        statement, parameters = self.pages.page(self.cursor, self.index == 0, limit)
        rows = self._fetch(statement, parameters, engine, conn)
        key = self.pages.position
        return _Page(rows, rows[-1][key], key) if rows else None

    def _fetch(self, statement: Select[Any], parameters: dict[str, Any], engine: Engine,
               conn: Connection) -> list[Row[Any]]:
        """One page, after the checks that come before every batch (the throttle may wait: the
        batch's transaction, if any, has sent nothing yet, so nothing is held open meanwhile)."""
        self._check_once(statement, engine)
        return list(conn.execute(statement, parameters).all())

    def _check_once(self, statement: Select[Any], engine: Engine) -> None:
        """The source's tables once per attempt, then the health throttle before every batch."""
        if not self.checked:
            check_source_tables(self.definition, statement, engine)
            self.checked = True
            self.throttle = Throttle.for_pass(self.definition, engine, statement)
        self._hold()

    def _hold(self) -> None:
        if self.throttle is not None and self.throttle.hold(self.signal, self._report):
            self._pause()

    def _outcome(self, batch: Batch, page: _Page) -> _Outcome:
        """What the ledger learns from a handled batch: rows failed, and rows handled that it may
        still hold as failed (a retry pass's page; a pass over a backfill with quarantined rows)."""
        failed = [(failure_key(key, backfill=self.name), str(reason)) for key, reason in batch.failed.items()]
        failed_keys = {key for key, _ in failed}
        if page.quarantined is not None:
            handled = [key for key in page.quarantined if key not in failed_keys]
        elif self.forget:
            handled = [k for row in page.rows if (k := failure_key(row[page.key], backfill=self.name))
                       not in failed_keys]
        else:
            handled = []
        self.failures += len(failed)
        return failed, handled

    def _handle(self, page: _Page, step_name: str, transaction: Connection | None) -> _Outcome:
        """The handler on ``page``, and what the ledger learns from it; in ``transaction`` (open on
        the pass's connection) when the pass is joined, where a same-database pass also records
        its quarantine and checkpoint."""
        definition, name, index = self.definition, self.name, self.index
        batch = Batch(page.rows, self.ctx, self.signal, index, transaction, name, page.key)
        self.awaiter.resolve(definition.handle(batch))
        failed, handled = self._outcome(batch, page)
        if self.same_database and transaction is not None:
            # The handler's writes, the quarantine and the checkpoint: one transaction.
            # Fenced: a lost claim refuses the record, raises JobAbortedError, and so rolls
            # back the handler's writes with it.
            if failed or handled:
                self.ledger.quarantine(self.run_id, name, index, failed, handled, connection=transaction)
            self.step.run(step_name, self._checkpoint(page), connection=transaction)
        return failed, handled

    def _settle(self, page: _Page, outcome: _Outcome, step_name: str) -> None:
        """The quarantine and the checkpoint of a handled batch, each its own commit, for a pass
        whose store is another database."""
        failed, handled = outcome
        # Quarantine first, then the checkpoint: a kill between them replays the batch, which
        # stores the same failures again (idempotent) rather than losing them.
        if failed or handled:
            self.ledger.quarantine(self.run_id, self.name, self.index, failed, handled)
        # Fenced: if this attempt lost its claim the write is refused and JobAbortedError raised.
        self.step.run(step_name, self._checkpoint(page))

    def _checkpoint(self, page: _Page) -> Callable[[], dict[str, Any]]:
        # The checkpoint's cursor: a sweep's last key (typed), a retry pass's last failure key (text).
        checkpoint = {**encode_cursor(page.cursor, backfill=self.name), "rows": len(page.rows)}
        return functools.partial(dict, checkpoint)


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

    Order: environment, ``requires``, skip-if-completed (unless ``force``; never for a
    ``retry_failed`` pass), ledger start, the paced keyset sweep (or, for a retry pass, the
    quarantined rows), the ``count`` convergence check, ledger finish. Any failure closes the
    ledger row as ``failed`` (``cancelled`` on a cancel) and re-raises; a retry reopens it. A pause
    parks the job (:class:`~ultimat3.jobs.steps.SuspendRun`) and leaves the row ``paused``.
    """
    name = definition.name
    driver = step.driver
    engine = LazyEngine(definition, driver)
    check_environment(definition, ctx.environment)
    check_requires(definition, driver, engine)
    ledger = driver.backfills
    run_id = step.run_id
    kind: BackfillKind = "retry" if input.retry_failed else "pass"
    own = ledger.get(run_id)
    if own is not None and own.status == "completed":
        # An earlier attempt finished the pass but died before the job was acked.
        return BackfillReport(name, own.batches, own.rows, failures=own.failures, kind=own.kind)
    if own is not None and own.status == "paused":
        # Woken while still paused (a resume raced the pause): park again, look again later.
        raise SuspendRun(PAUSE_RECHECK)
    previous = ledger.last_completed(name)
    if previous is not None and not input.force and kind == "pass":
        return BackfillReport(name, 0, 0, skipped=True, previous_run_id=previous.run_id)
    ledger.start(run_id, name, definition.checksum, step.job_id, kind)
    awaiter = Awaiter()
    try:
        with backfill_scope(name, definition.tenant, ctx) as pass_ctx:
            sweep = _Sweep(definition, pass_ctx, step, engine, awaiter, kind, 0 if own is None else own.failures)
            batches, rows = sweep.run()
            if definition.count is not None and kind == "pass":
                remaining = count_remaining(definition, pass_ctx, engine, awaiter)
                # Quarantined rows were left as they were, so they may well still match.
                quarantined = ledger.outstanding(name) if remaining > 0 else 0
                if remaining > quarantined:
                    raise BackfillError(
                        f'backfill "{name}" read its source to the end ({rows} rows in {batches} '
                        f"batches) but count() still reports {remaining} row(s) left"
                        + (f" ({quarantined} of them quarantined)" if quarantined else "")
                        + ": source and count select different rows, or handle does not change what source matches",
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
    # The ledger's count, not this attempt's: a batch replayed after a kill fails its rows again,
    # and the ledger counts each row once per pass.
    final = ledger.get(run_id)
    return BackfillReport(name, batches, rows, previous_run_id=None if previous is None else previous.run_id,
                          failures=sweep.failures if final is None else final.failures, kind=kind)
