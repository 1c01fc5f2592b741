"""An operator's hands on a running pass: pause it at a batch boundary, resume it from its last
checkpoint under the same ledger row, list the rows it quarantined.

A pause is a request the pass answers: the operator's ``pause`` marks the pass's ledger row, the
pass reads the mark at its next batch boundary (the batch in flight finishes and is checkpointed;
none is cut in half), sets the row ``paused`` and parks its job (suspended, no attempt spent).
``resume`` sets the row back to ``running`` and wakes the job in one transaction; a worker goes on
from the last checkpoint. Both are written to the audit log.
"""

from __future__ import annotations

from ultimat3.backfill.definition import BackfillError
from ultimat3.drivers.protocol import BackfillRun, JobDriver, RowFailure
from ultimat3.jobs.operator import default_actor

__all__ = ["pause_backfill", "quarantined", "resume_backfill"]


def pause_backfill(driver: JobDriver, name: str, *, actor: str | None = None) -> BackfillRun:
    """Ask the running pass of ``name`` to pause; its ledger row as it is now (``running`` with
    ``paused_by`` set until the pass reaches a batch boundary). Refuses with
    ``X_BACKFILL_NOT_RUNNING`` when no pass of ``name`` is running."""
    who = actor or default_actor()
    entry = driver.audit.open(who, "pause", {"backfill": name})
    run = driver.backfills.request_pause(name, who)
    if run is None:
        driver.audit.close(entry.id, "failed", 0)
        raise BackfillError(
            f'no pass of backfill "{name}" is running, so there is nothing to pause',
            "`x db backfill` shows its passes; a pass still waiting in the queue can be held with "
            "`x queues pause QUEUE` or cancelled with `x jobs cancel ID`",
            code="X_BACKFILL_NOT_RUNNING",
        )
    driver.audit.close(entry.id, "completed", 1)
    return run


def resume_backfill(driver: JobDriver, name: str, *, actor: str | None = None) -> BackfillRun:
    """Resume the paused pass of ``name`` (or withdraw a pause request it has not reached yet);
    its ledger row, ``running`` again. Refuses with ``X_BACKFILL_NOT_PAUSED`` when no pass of
    ``name`` is paused or asked to pause."""
    who = actor or default_actor()
    entry = driver.audit.open(who, "resume", {"backfill": name})
    run = driver.backfills.resume(name, who)
    if run is None:
        driver.audit.close(entry.id, "failed", 0)
        raise BackfillError(
            f'no pass of backfill "{name}" is paused or asked to pause, so there is nothing to resume',
            f"`x db backfill` shows its passes; `x db backfill {name} --wait` starts a new one",
            code="X_BACKFILL_NOT_PAUSED",
        )
    driver.audit.close(entry.id, "completed", 1)
    return run


def quarantined(driver: JobDriver, name: str, *, limit: int = 1000, after: str | None = None) -> list[RowFailure]:
    """The rows of ``name`` quarantined now, by key (``after``: keyset paging)."""
    return driver.backfills.failures(name, limit=limit, after=after)
