"""Durable steps: ``step.run(name, fn)`` records fn's JSON result once per run and replays it on retry.

Every checkpoint write presents the attempt's claim token, so an attempt that lost its claim
(cancelled, timed out, re-claimed after its visibility lapsed) cannot record a step: it is
aborted instead.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from pydantic_core import to_jsonable_python

from ultimat3.core.clock import Clock, to_datetime
from ultimat3.core.tracing import step_span
from ultimat3.drivers.protocol import ClaimedJob, JobDriver, StepRecord
from ultimat3.jobs.duration import DurationInput, parse_duration
from ultimat3.jobs.errors import StepDuplicateError, StepResultError
from ultimat3.jobs.signal import AbortSignal

T = TypeVar("T")


class SuspendRun(BaseException):
    """Raised by ``step.sleep`` to park the run; the worker puts it back without burning an attempt.

    A ``BaseException`` so that a handler's ``except Exception`` cannot swallow the suspension.
    """

    def __init__(self, delay: float) -> None:
        super().__init__(f"suspended for {delay:.3f}s")
        self.delay = delay


def _jsonable(job: str, step: str, value: Any) -> Any:
    try:
        return to_jsonable_python(value)
    except Exception as error:
        raise StepResultError(
            f'job "{job}" step "{step}" returned {type(value).__name__}, which is not JSON',
            "return JSON-ready data from a step (dicts, lists, str, numbers, bool, None, pydantic models)",
            code="X_STEP_RESULT",
        ) from error


class _StepCore:
    """What the sync and async step APIs share: the run's recorded steps and the fence."""

    def __init__(self, driver: JobDriver, claimed: ClaimedJob, signal: AbortSignal, clock: Clock) -> None:
        self.driver = driver
        self.claimed = claimed
        self.signal = signal
        self.clock = clock
        self._recorded: dict[str, StepRecord] | None = None
        self._used: set[str] = set()
        self._lock = threading.Lock()

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self.claimed.job.id

    @property
    def run_id(self) -> str:
        """The durable run the steps belong to (stable across retries)."""
        return self.claimed.job.run_id

    @property
    def attempt(self) -> int:
        """This attempt's number, 1-based."""
        return self.claimed.job.attempt

    def _load(self) -> dict[str, StepRecord]:
        # Loaded lazily: a job that never checkpoints never pays for the read.
        if self._recorded is None:
            self._recorded = self.driver.steps.load(self.run_id)
        return self._recorded

    def _claim_name(self, name: str) -> None:
        with self._lock:
            if name in self._used:
                raise StepDuplicateError(
                    f'job "{self.claimed.job.name}" used step name "{name}" twice in one run',
                    f'give each step its own name, e.g. "{name}:2" or f"{name}:{{item_id}}"',
                )
            self._used.add(name)

    def recorded(self, name: str) -> StepRecord | None:
        """The recorded result of ``name`` in this run, if a previous attempt wrote it."""
        return self._load().get(name)

    def _save(self, name: str, result: Any, connection: Any = None) -> Any:
        value = _jsonable(self.claimed.job.name, name, result)
        if not self.driver.steps.record(self.job_id, self.claimed.claim_token, name, value, connection=connection):
            # The fence refused: this attempt no longer owns the job. Stop rather than go on
            # doing work whose checkpoints nobody can see.
            self.signal.abort("claim lost")
            self.signal.raise_if_aborted(name)
        self._load().setdefault(name, StepRecord(self.run_id, name, value, to_datetime(self.clock.now())))
        return value

    def _sleep_plan(self, name: str, duration: DurationInput) -> float | None:
        """Seconds still to wait for ``step.sleep(name)``, or ``None`` when it has elapsed."""
        seconds = parse_duration(duration, what=f'step.sleep("{name}") duration')
        record = self.recorded(name)
        now = self.clock.now()
        if record is None:
            wake_at = now + seconds
            self._save(name, {"wake_at": wake_at})
        else:
            wake_at = float(record.result["wake_at"])
        remaining = wake_at - now
        return remaining if remaining > 0 else None


class AsyncStep(_StepCore):
    """The step API an ``async def`` handler receives."""

    async def run(self, name: str, fn: Callable[[], Awaitable[T]] | Callable[[], T]) -> T:
        """Run ``fn`` once per run and record its JSON result; a retry returns the record instead."""
        self._claim_name(name)
        record = await asyncio.to_thread(self.recorded, name)
        if record is not None:
            return cast(T, record.result)
        self.signal.raise_if_aborted(name)
        with step_span(name):
            outcome = fn()
            result = await outcome if inspect.isawaitable(outcome) else outcome
        return await asyncio.to_thread(self._save, name, result)

    async def sleep(self, name: str, duration: DurationInput) -> None:
        """Suspend the run until ``duration`` after this step was first reached, without burning
        an attempt. The worker is freed while the run sleeps."""
        self._claim_name(name)
        remaining = await asyncio.to_thread(self._sleep_plan, name, duration)
        if remaining is not None:
            raise SuspendRun(remaining)


class SyncStep(_StepCore):
    """The step API a plain ``def`` handler receives (it runs in a worker thread)."""

    def run(self, name: str, fn: Callable[[], T], *, connection: Any = None) -> T:
        """Run ``fn`` once per run and record its JSON result; a retry returns the record instead.

        ``connection``: an open connection (sqlite3, psycopg or SQLAlchemy) to the job store's own
        database, in the transaction ``fn`` wrote in: the record joins it, so the writes and the
        record commit together or not at all -- a step that is never run twice (SQL drivers).
        """
        self._claim_name(name)
        record = self.recorded(name)
        if record is not None:
            return cast(T, record.result)
        self.signal.raise_if_aborted(name)
        with step_span(name):
            value = fn()
        return cast(T, self._save(name, value, connection))

    def sleep(self, name: str, duration: DurationInput) -> None:
        """Suspend the run (see :meth:`AsyncStep.sleep`)."""
        self._claim_name(name)
        remaining = self._sleep_plan(name, duration)
        if remaining is not None:
            raise SuspendRun(remaining)
