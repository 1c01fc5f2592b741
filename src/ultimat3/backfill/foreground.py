"""A pass in the caller's process: dry runs and ``run_backfill`` (for ``x db backfill NAME --dry-run/--wait``)."""

from __future__ import annotations

import asyncio
import math
import signal as signal_module
import threading
import time
from typing import Any

from ultimat3.backfill.checks import (
    check_environment,
    check_requires,
    check_source_tables,
    count_remaining,
    source_statement,
)
from ultimat3.backfill.definition import BackfillDefinition, BackfillError, BackfillProgress, BackfillReport, DryRun
from ultimat3.backfill.engines import LazyEngine
from ultimat3.backfill.progress import emit
from ultimat3.backfill.registry import backfill_origin
from ultimat3.backfill.scope import backfill_scope
from ultimat3.backfill.sizing import BatchSizer
from ultimat3.core.context import Actor, Ctx, Environment, default_environment, use_ctx
from ultimat3.core.errors import Interrupted, first_line
from ultimat3.drivers.protocol import JobDriver
from ultimat3.jobs.job import JobHandle
from ultimat3.jobs.runtime import get_driver
from ultimat3.jobs.worker import Worker

__all__ = [
    "dry_run",
    "run_backfill",
]


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
    engine = LazyEngine(definition, target)
    with use_ctx(ctx), backfill_scope(definition.name, definition.tenant, ctx) as pass_ctx:
        # Builds the source once to learn which tables it reads; no page is read.
        check_source_tables(definition, source_statement(definition, pass_ctx), engine())
        if definition.count is None:
            return DryRun(definition.name, None, None, None)
        rows = count_remaining(definition, pass_ctx, engine)
    # An adaptive pass starts at its min: the estimate is the most batches it can take.
    batches = math.ceil(rows / BatchSizer(definition.batch).size)
    return DryRun(definition.name, rows, batches, batches / definition.rate)


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
                 interruptible: bool = False, retry_failed: bool = False) -> BackfillReport:
    """Enqueue the backfill (joining a live pass under its name) and run it in this process
    until the job settles; returns its report. For sync callers (the CLI), not inside a loop.

    The environment and ``requires`` are checked first, so a refusal writes nothing. A pass that
    ends ``dead`` or ``cancelled`` raises ``X_BACKFILL_FAILED``/``X_BACKFILL_CANCELLED`` (the
    message carries the error's first line; the whole traceback is in ``details["traceback"]``).
    While the job waits out a retry delay, or runs on another worker, this polls and reports that
    worker's progress from the ledger. With ``interruptible`` (the CLI), Ctrl-C releases the claim
    this process holds at once and raises :class:`~ultimat3.core.errors.Interrupted`.
    ``retry_failed`` runs a pass over exactly the rows earlier passes quarantined. A pass paused
    by an operator raises ``X_BACKFILL_PAUSED`` (it stays paused; ``resume`` continues it).
    """
    definition = _definition_of(handle)
    target = driver if driver is not None else get_driver()
    env = environment if environment is not None else default_environment()
    check_environment(definition, env)
    check_requires(definition, target)
    enqueued = handle.enqueue({"force": force, "retry_failed": retry_failed}, driver=target)
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
                reason = first_line(row.last_error, "no error")
                raise BackfillError(
                    f'backfill "{definition.name}" ended {row.state} (job {row.id}): {reason}',
                    f"see `x jobs show {row.id}` for the whole error; fix the cause, then `x jobs retry {row.id}` "
                    "(the pass resumes from its last batch)",
                    code=code,
                    traceback=row.last_error,
                )
            ledger = target.backfills.get(enqueued.run_id)
            if ledger is not None and ledger.status == "paused":
                raise BackfillError(
                    f'backfill "{definition.name}" was paused by {ledger.paused_by or "an operator"} after '
                    f"{ledger.batches} batches / {ledger.rows} rows (job {row.id}); it stays paused",
                    f"`x db backfill resume {definition.name}` continues it from there (a running worker picks "
                    f"it up; `x db backfill {definition.name} --wait` watches it)",
                    code="X_BACKFILL_PAUSED",
                )
            if ledger is not None and row.state == "running":
                # Attached to a pass another worker runs: show its progress, not ours (none).
                emit(BackfillProgress(definition.name, ledger.run_id, ledger.batches, ledger.rows, replayed=False,
                                      throttle=ledger.throttle, failures=ledger.failures))
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
