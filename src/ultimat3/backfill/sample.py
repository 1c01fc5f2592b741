"""A sampled dry run: ``x db backfill NAME --dry-run --sample N``.

A count says how many rows a pass would visit, not what visiting them costs. A sample runs the
first N real batches -- real page reads, the real handler -- inside ONE transaction on the
backfill's database that is rolled back at the end, and reports what they did: rows read, rows
the handler's statements changed, time per batch, the pass's projected duration, and the page
query's plan (a sequential scan is flagged: keyset paging over an unindexed key reads the whole
table for every page).

Only a backfill declared ``transactional=True`` may be sampled: the rollback undoes what the
handler wrote through ``batch.connection`` and nothing else, so a handler that writes elsewhere
(another session, an API) would do it for real. Nothing is written to the job store either: no
ledger row, no checkpoint, no quarantine (``batch.fail`` is counted, not stored).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import event, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.sql.expression import Executable
from sqlalchemy.sql.selectable import Select

from ultimat3.backfill.awaiting import Awaiter
from ultimat3.backfill.checks import (
    check_environment,
    check_requires,
    check_source_tables,
    count_remaining,
    source_statement,
)
from ultimat3.backfill.definition import BackfillDefinition, BackfillError, Batch
from ultimat3.backfill.engines import LazyEngine
from ultimat3.backfill.registry import backfill_origin
from ultimat3.backfill.scope import backfill_scope
from ultimat3.backfill.sizing import BatchSizer
from ultimat3.backfill.sweep import page_statement
from ultimat3.core.context import Actor, Ctx, Environment, default_environment, use_ctx
from ultimat3.drivers.protocol import JobDriver
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.runtime import get_driver
from ultimat3.jobs.signal import AbortSignal
from ultimat3.tenancy.guard import scoped

__all__ = ["SampleReport", "sample"]

#: The most batches a sample may run: it holds one transaction (and its locks) open throughout.
MAX_SAMPLE = 100
_WRITES = ("INSERT", "UPDATE", "DELETE", "MERGE")


@dataclass(frozen=True)
class SampleReport:
    """What ``sample`` measured (see the module docstring)."""

    name: str
    #: Batches run (fewer than asked when the source ran out).
    batches: int
    #: Rows read and handed to ``handle``.
    rows: int
    #: Rows the handler's INSERT/UPDATE/DELETE statements through ``batch.connection`` changed.
    touched: int
    #: Rows the handler failed (``batch.fail``); not stored.
    failed: int
    #: Seconds each batch took (page read and handler).
    seconds: list[float] = field(default_factory=list)
    #: Rows the whole pass would visit now (``count=``, else a count of the source).
    total_rows: int | None = None
    #: Batches and seconds the whole pass would take at the measured cost and the declared rate.
    projected_batches: int | None = None
    projected_seconds: float | None = None
    #: The page query's plan as the database prints it, and whether it scans the table.
    plan: str = ""
    sequential_scan: bool = False

    def to_json(self) -> dict[str, Any]:
        """Plain JSON."""
        return asdict(self)


class _Explain(Executable, ClauseElement):
    """``EXPLAIN <select>``, compiled by the dialect with the select's own bind processing."""

    inherit_cache = False

    def __init__(self, statement: Select[Any], prefix: str) -> None:
        self.statement = statement
        self.prefix = prefix


@compiles(_Explain)
def _compile_explain(element: _Explain, compiler: SQLCompiler, **kw: Any) -> str:
    return f"{element.prefix} {compiler.process(element.statement, **kw)}"


def _plan(conn: Connection, statement: Select[Any]) -> tuple[str, bool]:
    if conn.dialect.name == "sqlite":
        details = [str(row[-1]) for row in conn.execute(_Explain(statement, "EXPLAIN QUERY PLAN"))]
        # "SCAN t" reads the whole table; "SCAN t USING [COVERING] INDEX i" walks an index and
        # "SEARCH t USING ..." seeks into one.
        scans = any(line.startswith("SCAN ") and " USING " not in line for line in details)
        return "\n".join(details), scans
    lines = [str(row[0]) for row in conn.execute(_Explain(statement, "EXPLAIN"))]
    return "\n".join(lines), any("Seq Scan" in line for line in lines)


def _refuse(definition: BackfillDefinition, problem: str, hint: str) -> BackfillError:
    return BackfillError(f'backfill "{definition.name}": {problem}', hint, code="X_BACKFILL_SAMPLE")


def sample(handle: JobHandle[Any], batches: int, driver: JobDriver | None = None,
           environment: Environment | None = None) -> SampleReport:
    """Run the first ``batches`` batches of a pass in a transaction that is rolled back, and
    report what they did (see the module docstring). Refuses (``X_BACKFILL_SAMPLE``) a backfill
    not declared ``transactional=True`` and a count outside ``1..MAX_SAMPLE``."""
    definition = backfill_origin(handle)
    if definition is None:
        raise BackfillError(f"{handle!r} is a plain job, not a backfill",
                            "pass a handle returned by backfill(...)", code="X_BACKFILL_UNKNOWN")
    if isinstance(batches, bool) or not isinstance(batches, int) or not 1 <= batches <= MAX_SAMPLE:
        raise _refuse(definition, f"--sample {batches!r} is not a number of batches from 1 to {MAX_SAMPLE}",
                      "write e.g. --sample 5: the first five batches run and are rolled back")
    if not definition.transactional:
        raise _refuse(
            definition,
            "a sample rolls back only what handle writes through batch.connection, and this backfill does not "
            "say that is all it writes",
            f'declare transactional=True on backfill(name="{definition.name}") once handle writes only through '
            "batch.connection; or use --dry-run without --sample for a count",
        )
    env = environment if environment is not None else default_environment()
    check_environment(definition, env)
    target = driver if driver is not None else get_driver()
    engine = LazyEngine(definition, target)
    check_requires(definition, target, engine)
    org = handle.tenant_of(handle.parse_input({}))
    ctx = Ctx(actor=Actor(id=f"backfill:{definition.name}:sample", org_id=org), environment=env)
    awaiter = Awaiter()
    try:
        with use_ctx(ctx), backfill_scope(definition.name, definition.tenant, ctx) as pass_ctx:
            report = _run(definition, pass_ctx, engine(), batches, awaiter)
            total = _total(definition, pass_ctx, engine, awaiter)
    finally:
        awaiter.close()
    if total is None or not report.batches:
        return report
    per_batch_rows = max(report.rows / report.batches, 1.0)
    projected = math.ceil(total / per_batch_rows)
    per_batch = max(sum(report.seconds) / len(report.seconds), 1.0 / definition.rate)
    return SampleReport(**{**asdict(report), "total_rows": total, "projected_batches": projected,
                           "projected_seconds": projected * per_batch})


def _total(definition: BackfillDefinition, ctx: Ctx, engine: LazyEngine, awaiter: Awaiter) -> int:
    if definition.count is not None:
        return count_remaining(definition, ctx, engine, awaiter)
    source = scoped(source_statement(definition, ctx), ctx, bind=engine())
    statement = select(func.count()).select_from(source.subquery())
    with engine().connect() as conn:
        return int(conn.execute(statement).scalar_one())


def _run(definition: BackfillDefinition, ctx: Ctx, engine: Engine, batches: int, awaiter: Awaiter) -> SampleReport:
    signal = AbortSignal(definition.name)
    sizer = BatchSizer(definition.batch)
    rows = touched = failed = 0
    seconds: list[float] = []
    cursor: Any = None
    explained: Select[Any] | None = None
    with engine.connect() as conn:
        transaction = conn.begin()

        def count_writes(_conn: Any, cursor_: Any, statement: str, *_args: Any) -> None:
            nonlocal touched
            if statement.lstrip().upper().startswith(_WRITES) and cursor_.rowcount > 0:
                touched += cursor_.rowcount

        event.listen(conn, "after_cursor_execute", count_writes)
        try:
            for index in range(batches):
                limit = sizer.size
                statement, key = page_statement(definition, ctx, cursor, index == 0, engine, limit)
                if index == 0:
                    check_source_tables(definition, statement, engine)
                explained = statement
                began = time.perf_counter()
                page = list(conn.execute(statement).all())
                if not page:
                    break
                batch = Batch(page, ctx, signal, index, conn, definition.name, key)
                awaiter.resolve(definition.handle(batch))
                took = time.perf_counter() - began
                seconds.append(took)
                sizer.observe(len(page), took)
                failed += len(batch.failed)
                rows += len(page)
                cursor = page[-1][key]
                # The plan that matters is a later page's: the first has no cursor condition.
                explained = page_statement(definition, ctx, cursor, False, engine, sizer.size)[0]
                if len(page) < limit:
                    break
            assert explained is not None
            plan, scans = _plan(conn, explained)
        finally:
            event.remove(conn, "after_cursor_execute", count_writes)
            transaction.rollback()
    return SampleReport(definition.name, len(seconds), rows, touched, failed, seconds, plan=plan,
                        sequential_scan=scans)
