"""One pass of a backfill: the checks, the ledger row, and the paced keyset sweep.

Runs as the body of the backfill's job, in a worker thread (SQLAlchemy is used synchronously).
Each batch is its own durable step ``batch:<index>`` recording ``{"cursor", "rows"}``; a retried
or resumed attempt replays those records without reading a page or calling the handler, and goes
on from the last cursor — so no row is skipped and at most one batch (the one in flight when the
previous attempt died) is handled twice."""

from __future__ import annotations

import functools
import time
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import Engine
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
from ultimat3.backfill.cursor import decode_cursor, encode_cursor
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
from ultimat3.core.context import Ctx
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import BackfillLedger
from ultimat3.jobs.errors import JobAbortedError
from ultimat3.jobs.execute import SHUTDOWN
from ultimat3.jobs.steps import SyncStep
from ultimat3.tenancy.guard import scoped
from ultimat3.tenancy.tables import base_of
from ultimat3.tenancy.where import and_where

__all__ = [
    "LEDGER_PROGRESS_EVERY",
    "run_pass",
]

#: Seconds between writes of a running pass's counters to its ledger row.
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


def _page_statement(definition: BackfillDefinition, ctx: Ctx, cursor: Any, first: bool,
                    engine: Engine, limit: int) -> tuple[Select[Any], int]:
    """The page's statement and the POSITION of the key among its columns.

    Built afresh for every page: source is lazy, and scoping happens against the pass's ctx. The
    key is read back by position, not by column object: scoping rebuilds the statement, so the
    source's column objects are not the ones the rows are keyed by (a subquery, a CTE or an
    alias of an alias would otherwise fail to find it).
    """
    stmt = source_statement(definition, ctx)
    key = _key_column(definition, stmt)
    position = next(i for i, column in enumerate(stmt.selected_columns) if column is key)
    if not first:
        # Grouped: an OR inside the source's own criteria must not swallow the cursor condition.
        stmt = and_where(stmt, key > cursor)
    # The pass owns the order and the limit: keyset paging is only correct in key order.
    page = stmt.order_by(None).order_by(key).limit(limit)
    return scoped(page, ctx, bind=engine), position


def _sweep(definition: BackfillDefinition, ctx: Ctx, step: SyncStep, engine: LazyEngine,
           awaiter: Awaiter) -> tuple[int, int]:
    name, run_id, signal = definition.name, step.run_id, step.signal
    ledger = step.driver.backfills
    index = batches = rows = 0
    cursor: Any = None

    # Replay what earlier attempts recorded: no page read, no handler call.
    while (record := step.recorded(batch_step_name(index))) is not None:
        cursor = decode_cursor(record.result)
        batches += 1
        rows += int(record.result["rows"])
        index += 1
        emit(BackfillProgress(name, run_id, batches, rows, replayed=True))
    if batches:
        ledger.progress(run_id, batches, rows)
    reported, reported_at = batches, time.monotonic()
    checked = False
    # The pass reads the job store's own database: checkpoints can join the handler's transaction.
    same_database = isinstance(definition.engine, str)
    sizer = BatchSizer(definition.batch)

    try:
        while True:
            step_name = batch_step_name(index)
            definition.pacer.wait(signal, step_name)
            limit = sizer.size
            began = definition.pacer.monotonic()
            statement, key = _page_statement(definition, ctx, cursor, index == 0, engine(), limit)
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
            checkpoint = {**encode_cursor(last, backfill=name), "rows": len(page)}
            if same_database:
                # The handler's writes through batch.connection and the checkpoint: one transaction.
                with engine().begin() as transaction:
                    awaiter.resolve(definition.handle(Batch(page, ctx, signal, index, transaction)))
                    # Fenced: a lost claim refuses the record, raises JobAbortedError, and so rolls
                    # back the handler's writes with it.
                    step.run(step_name, functools.partial(dict, checkpoint), connection=transaction)
            else:
                awaiter.resolve(definition.handle(Batch(page, ctx, signal, index)))
                # Fenced: if this attempt lost its claim the write is refused and JobAbortedError raised.
                step.run(step_name, functools.partial(dict, checkpoint))
            # The key as the database returned it, not its JSON form: the next page compares it.
            cursor = last
            sizer.observe(len(page), definition.pacer.monotonic() - began)
            batches += 1
            rows += len(page)
            index += 1
            # The batch step above is the durable checkpoint; the ledger's counters are for people
            # watching, so they are written at most every LEDGER_PROGRESS_EVERY seconds and once at
            # the end, not per batch (a second write per batch halved a fast sweep's throughput).
            if time.monotonic() - reported_at >= LEDGER_PROGRESS_EVERY:
                ledger.progress(run_id, batches, rows)
                reported, reported_at = batches, time.monotonic()
            emit(BackfillProgress(name, run_id, batches, rows, replayed=False))
            if len(page) < limit:
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
    engine = LazyEngine(definition, driver)
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
    awaiter = Awaiter()
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
