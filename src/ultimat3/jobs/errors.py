"""Errors a job or a step raises (a driver's own are in :mod:`ultimat3.drivers.errors`, re-exported
here). Each carries a stable ``X_...`` code."""

from __future__ import annotations

from ultimat3.core.errors import XError
from ultimat3.drivers.errors import DriverError, JobDuplicateError, StepResultError

__all__ = [
    "DriverError",
    "JobAbortedError",
    "JobDuplicateError",
    "JobInputError",
    "StepDuplicateError",
    "StepResultError",
]


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
