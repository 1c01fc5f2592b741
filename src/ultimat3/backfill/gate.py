"""The deploy gate: which declared backfills have no completed pass under their current code.

It fails closed. Asked about an app that declares no backfill at all, it does not answer "nothing
pending" — a gate run without ``--app``/``X_APP`` would then pass every deploy — but refuses with
``X_BACKFILL_NONE_DECLARED``, unless the caller says explicitly that the app has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ultimat3.backfill.checks import requirement_error
from ultimat3.backfill.registry import BackfillDeclaration, registered_backfills
from ultimat3.core.context import Environment
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import BackfillRun, JobDriver

__all__ = [
    "BackfillStatusRow",
    "PendingBackfill",
    "backfill_status",
    "hold_reason",
    "pending_backfills",
    "pending_reason",
]

#: Why a declared backfill is pending: never completed, completed only under other code, or
#: completed with rows still quarantined (``batch.fail``) -- a pass that left rows behind has not
#: done what the code that waits for it assumes.
PendingReason = Literal["never-run", "checksum-changed", "failed-rows"]


@dataclass(frozen=True)
class PendingBackfill:
    """A declared backfill with no completed pass under its current checksum."""

    declaration: BackfillDeclaration
    reason: PendingReason
    #: The last completed pass (under an older checksum), if any.
    last: BackfillRun | None

    @property
    def name(self) -> str:
        """The backfill's name."""
        return str(self.declaration.name)


@dataclass(frozen=True)
class BackfillStatusRow:
    """What ``x db backfill`` shows for one declaration.

    ``deciding`` is the run the gate looks at (the last completed pass); ``latest`` is the most
    recently started pass — shown beside it when it is a different run (a retry in flight, a
    failed forced pass after a completed one).
    """

    declaration: BackfillDeclaration
    pending: PendingReason | None
    deciding: BackfillRun | None
    latest: BackfillRun | None


def _declared(allow_none: bool) -> list[BackfillDeclaration]:
    declared = registered_backfills()
    if not declared and not allow_none:
        raise XError(
            "no backfill is declared in this process, so the gate cannot say whether any is pending",
            "pass --app (or set X_APP) with the module that declares your backfills; if the app really "
            "has none, say so with --allow-none",
            code="X_BACKFILL_NONE_DECLARED",
        )
    return declared


def pending_reason(driver: JobDriver, name: str, checksum: str) -> tuple[PendingReason | None, BackfillRun | None]:
    """Why backfill ``name`` (whose code hashes to ``checksum``) is pending, or ``None``; and the
    completed pass that decides it."""
    last = driver.backfills.last_completed(name)
    if last is None:
        return "never-run", None
    if last.checksum != checksum:
        return "checksum-changed", last
    if driver.backfills.outstanding(name) > 0:
        return "failed-rows", last
    return None, last


def pending_backfills(driver: JobDriver, *, allow_none: bool = False) -> list[PendingBackfill]:
    """Declared and never completed, completed only under another checksum, or completed with rows
    still quarantined. Refuses (``X_BACKFILL_NONE_DECLARED``) when nothing is declared, unless
    ``allow_none``."""
    pending: list[PendingBackfill] = []
    for declaration in _declared(allow_none):
        reason, last = pending_reason(driver, declaration.name, declaration.checksum)
        if reason is not None:
            pending.append(PendingBackfill(declaration, reason, last))
    return pending


def backfill_status(driver: JobDriver, *, allow_none: bool = True) -> list[BackfillStatusRow]:
    """Every declared backfill with the run that decides the gate and the latest run."""
    rows: list[BackfillStatusRow] = []
    for declaration in _declared(allow_none):
        runs = driver.backfills.list(declaration.name)
        pending, deciding = pending_reason(driver, declaration.name, declaration.checksum)
        rows.append(BackfillStatusRow(declaration, pending, deciding, runs[0] if runs else None))
    return rows


def hold_reason(driver: JobDriver, environment: Environment, declaration: BackfillDeclaration) -> XError | None:
    """Why a declared backfill may not be enqueued here and now (environment, ``requires``), or ``None``."""
    environments = declaration.environments
    if environments is not None and environment not in environments:
        return XError(
            f'backfill "{declaration.name}" runs in {", ".join(environments)}, not in {environment}',
            "set X_ENV to one of those, or add this environment to its environments=",
            code="X_BACKFILL_ENVIRONMENT",
        )
    if declaration.requires is not None:
        return requirement_error(driver, declaration.name, declaration.requires)
    return None
