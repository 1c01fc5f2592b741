"""Errors a driver raises. Each carries a stable ``X_...`` code; drivers import nothing from ``jobs/``."""

from __future__ import annotations

from ultimat3.core.errors import XError

__all__ = ["DriverError", "JobDuplicateError", "StepResultError"]


class JobDuplicateError(XError):
    """``on_conflict='error'`` and a live job already holds this (name, idempotency key)."""

    code = "X_JOB_DUPLICATE"
    retryable = False

    def __init__(self, name: str, key: str, existing_id: str) -> None:
        super().__init__(
            f'job "{name}" already has a live run under idempotency key {key!r} (job {existing_id})',
            "enqueue with on_conflict='return' to get the live run back, or wait for it to finish",
            name=name,
            key=key,
            existing_id=existing_id,
        )
        self.existing_id = existing_id


class DriverError(XError):
    """The driver could not do what was asked (bad URL, unreachable database, wrong connection)."""

    code = "X_DRIVER"


class StepResultError(XError):
    """A step returned something that is not JSON; retrying would return it again."""

    code = "X_STEP_RESULT"
    retryable = False
