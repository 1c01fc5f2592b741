"""Errors a job, a step or a driver raises. Each carries a stable ``X_...`` code."""

from __future__ import annotations

from ultimat3.core.errors import XError


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


class JobInputError(XError):
    """The input failed the job's pydantic model; nothing was written."""

    code = "X_JOB_INPUT"
    retryable = False


class JobAbortedError(XError):
    """The attempt was cancelled, timed out or lost its claim; it must stop without settling."""

    code = "X_JOB_ABORTED"
    retryable = True

    def __init__(self, job: str, reason: str = "aborted", step: str | None = None) -> None:
        where = f' at step "{step}"' if step else ""
        super().__init__(
            f'job "{job}" was aborted{where}: {reason}',
            "watch step.signal (or batch.signal) and return promptly when it is set",
            job=job,
            reason=reason,
        )
        self.reason = reason


class StepDuplicateError(XError):
    """One run used the same step name twice."""

    code = "X_STEP_DUPLICATE"
    retryable = False


class UnknownJobError(XError):
    """A name that no ``@job`` in this process declared."""

    code = "X_JOB_UNKNOWN"
    retryable = False


class DriverError(XError):
    """The driver could not do what was asked (bad URL, unreachable database, wrong connection)."""

    code = "X_DRIVER"


class StepResultError(XError):
    """A step returned something that is not JSON; retrying would return it again."""

    code = "X_STEP_RESULT"
    retryable = False
