"""Which backfills this process DECLARED, as against which passes the ledger recorded.

A sweep merged but never enqueued has no ledger row; without a list of declarations it would be
invisible to ``x db backfill --pending``. The list is derived from the job registry (a backfill is
a job) plus a stamp that only :func:`~ultimat3.jobs.backfill.backfill` writes: there is no second
registry to disagree with the first about whether a name exists.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from ultimat3.backfill.definition import BackfillDefinition, BackfillInput
from ultimat3.core.context import Environment
from ultimat3.jobs.job import JobHandle, get_job, registered_jobs

__all__ = [
    "BackfillDeclaration",
    "backfill_origin",
    "declaration_of",
    "get_backfill",
    "is_backfill",
    "registered_backfills",
]

# Weak keys: a handle dropped with a test's isolated registry takes its stamp with it.
_origins: weakref.WeakKeyDictionary[JobHandle[Any], BackfillDefinition] = weakref.WeakKeyDictionary()


def _stamp(handle: JobHandle[BackfillInput], definition: BackfillDefinition) -> None:
    # Private on purpose: a second way to mark a handle as a backfill would let a plain job
    # inherit the pending list, the deploy gate and the cross-tenant grant it never declared.
    _origins[handle] = definition


def is_backfill(value: object) -> bool:
    """Whether ``value`` is a job handle that :func:`backfill` built (a look-alike is not)."""
    return isinstance(value, JobHandle) and value in _origins


def backfill_origin(handle: JobHandle[Any]) -> BackfillDefinition | None:
    """Everything :func:`backfill` knew about ``handle`` (count, pacer, engine...), or ``None``."""
    return _origins.get(handle)


@dataclass(frozen=True)
class BackfillDeclaration:
    """What a process declares about one backfill, as the gate and the CLI see it.

    ``requires`` is the requirement's label (``alembic:<rev>`` or an ``x_migrations`` id);
    ``counts`` says whether a ``count`` was declared (the function itself never crosses JSON).
    """

    name: str
    checksum: str
    requires: str | None
    environments: tuple[Environment, ...] | None
    counts: bool

    def to_json(self) -> dict[str, Any]:
        """``{kind, name, checksum, requires, environments, counts}``, the CLI's ``--json`` shape."""
        return {
            "kind": "backfill",
            "name": self.name,
            "checksum": self.checksum,
            "requires": self.requires,
            "environments": None if self.environments is None else list(self.environments),
            "counts": self.counts,
        }


def declaration_of(handle: JobHandle[Any]) -> BackfillDeclaration | None:
    """What ``handle`` declares, or ``None`` for a plain job."""
    definition = _origins.get(handle)
    if definition is None:
        return None
    return BackfillDeclaration(
        name=handle.name,
        checksum=definition.checksum,
        requires=None if definition.requires is None else definition.requires.label,
        environments=definition.environments,
        counts=definition.count is not None,
    )


def registered_backfills() -> list[BackfillDeclaration]:
    """Every backfill declared in this process, in declaration order."""
    found: list[BackfillDeclaration] = []
    for handle in registered_jobs():
        declaration = declaration_of(handle)
        if declaration is not None:
            found.append(declaration)
    return found


def get_backfill(name: str) -> JobHandle[BackfillInput] | None:
    """The backfill declared under ``name``; ``None`` when there is none (or it is a plain job)."""
    handle = get_job(name)
    return handle if handle is not None and is_backfill(handle) else None
