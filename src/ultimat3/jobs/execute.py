"""One attempt of one claimed job: build its context, run its handler under its timeout and abort
signal, and decide how it settles. The worker owns claiming, heartbeats and concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic_core import to_jsonable_python

from ultimat3.core.clock import Clock
from ultimat3.core.context import SYSTEM_SCOPE, Ctx, Environment, Grant, run_context, use_ctx
from ultimat3.core.errors import XError
from ultimat3.core.tracing import attempt_span
from ultimat3.drivers.protocol import ClaimedJob, JobDriver, NackRequest
from ultimat3.drivers.values import Serialized, storable, strict_dumps
from ultimat3.jobs.errors import JobAbortedError
from ultimat3.jobs.job import JobHandle, get_job
from ultimat3.jobs.schedule import tick_of
from ultimat3.jobs.signal import AbortSignal
from ultimat3.jobs.steps import AsyncStep, SuspendRun, SyncStep
from ultimat3.tenancy.enqueue import check_stored_tenant

OutcomeKind = Literal["done", "retry", "dead", "suspended", "aborted", "released"]
#: Abort reasons under which the attempt no longer owns the row: nothing is written for it.
LOST_REASONS = frozenset({"cancelled", "claim lost"})
TIMEOUT = "timeout"
SHUTDOWN = "shutdown"
#: How long a cancelled async handler gets to unwind after its task is cancelled.
CANCEL_GRACE = 5.0
#: Kept on the row: enough traceback to act on, bounded so a deep recursion cannot bloat it.
MAX_ERROR_CHARS = 8000
#: An unknown job name goes back for a worker that knows it, not to the dead-letter queue.
UNKNOWN_JOB_DELAY = 60.0


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, and what (if anything) the worker writes for it."""

    kind: OutcomeKind
    error: str | None = None
    delay: float = 0.0
    result: Any = None

    def nack_request(self) -> NackRequest | None:
        """How a failure, a suspension or a release is written back; ``None`` for ``done`` (an
        ack, which the worker batches) and ``aborted`` (the row belongs to someone else now)."""
        if self.kind == "retry":
            return NackRequest(error=self.error, delay=self.delay)
        if self.kind == "dead":
            return NackRequest(error=self.error, dead_letter=True)
        if self.kind == "suspended":
            return NackRequest(error=self.error, delay=self.delay, counts_as_attempt=False)
        if self.kind == "released":
            return NackRequest(delay=self.delay, counts_as_attempt=False, release=True)
        return None


#: What a handler that returns nothing stores (most do): serialised once, not once per attempt.
_NULL = Serialized("null")


def format_error(error: BaseException) -> str:
    """``Type: message`` then the traceback, bounded."""
    head = f"{type(error).__name__}: {error}"
    body = "".join(traceback.format_exception(error))
    text = storable(f"{head}\n{body}" if body else head)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 20] + "\n…(truncated)"


def run_ctx(claimed: ClaimedJob, environment: Environment, grants: tuple[Grant, ...] = ()) -> Ctx:
    """The context a run executes under: an actor for this job, acting for the row's org (with
    ``grants``, built in one go rather than copied per attempt)."""
    job = claimed.job
    return run_context(f"job:{job.name}:{job.id}", job.tenant_id, environment, job.traceparent, grants,
                       tick_of(job.enqueued_by))


class AttemptRunner:
    """Runs attempts for a worker (or a foreground caller such as ``x db backfill --wait``)."""

    def __init__(
        self,
        driver: JobDriver,
        *,
        environment: Environment,
        handler_pool: Executor | None = None,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.driver = driver
        self.environment = environment
        self.handler_pool = handler_pool
        self.clock = clock or driver.clock
        self.rand = rand

    def _failure(self, handle: JobHandle[Any], claimed: ClaimedJob, error: BaseException, text: str) -> Outcome:
        attempt = claimed.job.attempt
        permanent = isinstance(error, XError) and not error.retryable
        if permanent or attempt >= claimed.job.max_attempts:
            return Outcome("dead", text)
        return Outcome("retry", text, delay=handle.retry.delay(attempt, self.rand))

    async def run(self, claimed: ClaimedJob, signal: AbortSignal) -> Outcome:
        """Run one attempt to its outcome. Never raises for the handler's errors."""
        job = claimed.job
        handle = get_job(job.name)
        if handle is None:
            return Outcome("released", f'no job named "{job.name}" is declared in this worker',
                           delay=UNKNOWN_JOB_DELAY)
        if job.attempt > job.max_attempts:
            # Every earlier attempt ended without settling (its worker died or was killed): a
            # job that takes its worker down with it must not loop forever.
            return Outcome("dead", f"X_JOB_ATTEMPTS_EXHAUSTED: {job.max_attempts} attempts ended without "
                                   "settling (worker lost, killed or stalled)")
        try:
            model = handle.parse_input(job.payload)
            computed = handle.tenant_of(model)
        except XError as error:
            return Outcome("dead", str(error))
        # The row's tenant_id decides whose data the run sees; it must be what the declaration
        # says this input belongs to, or a row written around enqueue() could borrow another org.
        mismatch = check_stored_tenant(job.name, job.tenant_id, computed)
        if mismatch is not None:
            return Outcome("dead", str(mismatch))
        # A run of a tenant='none' job may fan work out to every org, for as long as it runs.
        grant = Grant(SYSTEM_SCOPE, f'run of job "{job.name}" (tenant=\'none\')') if job.tenant_id is None else None
        ctx = run_ctx(claimed, self.environment, () if grant is None else (grant,))
        try:
            with attempt_span(job.name, job.queue, job.id, job.attempt, job.traceparent) as span:
                outcome = await self._run(handle, claimed, model, ctx, signal)
                span.outcome(outcome.kind, outcome.error)
                return outcome
        finally:
            if grant is not None:
                grant.revoke()

    async def _run(self, handle: JobHandle[Any], claimed: ClaimedJob, model: Any, ctx: Ctx,
                   signal: AbortSignal) -> Outcome:
        if handle.is_async:
            return await self._run_here(handle, claimed, model, ctx, signal)
        returned = asyncio.Event()
        task = asyncio.ensure_future(self._invoke(handle, claimed, model, ctx, signal, returned))
        aborted = asyncio.ensure_future(signal.wait_async())
        done, _ = await asyncio.wait({task, aborted}, timeout=handle.timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            signal.abort(TIMEOUT if not signal.aborted else signal.reason or TIMEOUT)
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_GRACE)
            if not handle.is_async:
                # Cancelling the task does not stop a sync handler's thread: give it the same grace
                # to see its signal and return, so the attempt ends when its handler does.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(returned.wait(), timeout=CANCEL_GRACE)
        aborted.cancel()
        return self._outcome(handle, claimed, task, signal)

    async def _run_here(self, handle: JobHandle[Any], claimed: ClaimedJob, model: Any, ctx: Ctx,
                        signal: AbortSignal) -> Outcome:
        """An async handler runs in the attempt's own task: no second task, no waiter, no
        ``asyncio.wait`` per attempt. A cancel, a lost claim or a shutdown cancels this task from
        the signal's callback, and so does the timeout (a timer that aborts the signal). Either way the handler sees
        ``CancelledError`` at its next ``await``, as it would have in a task of its own."""
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        armed = True

        def cancel() -> None:
            if armed:  # the handler may have returned between the abort and this callback
                task.cancel()

        def on_abort() -> None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                cancel()
            else:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to stop
                    loop.call_soon_threadsafe(cancel)

        signal.on_abort(on_abort)
        # The timeout is one timer that aborts the signal (whose callback cancels this task), not
        # an asyncio.timeout() per attempt: that context manager's bookkeeping (current_task, its
        # own state and reschedule) cost ~20% of a concurrency-100 drain's jobs/s in an A/B.
        timer = None if handle.timeout is None else loop.call_later(handle.timeout, signal.abort, TIMEOUT)
        failure: BaseException | None = None
        value: Any = None
        try:
            value = await self._invoke(handle, claimed, model, ctx, signal, None)
        except asyncio.CancelledError as cancelled:
            if not signal.aborted:
                raise  # the worker's own task is being cancelled: not this attempt's business
            failure = cancelled
        except BaseException as error:  # SuspendRun is a BaseException; the outcome sorts it
            failure = error
        finally:
            armed = False
            if timer is not None:
                timer.cancel()
        # The signal's cancel was delivered to the handler (or, disarmed, never requested): the
        # settle that follows must not see it counted.
        while task.cancelling():
            task.uncancel()
        if failure is None:
            return self._finished(handle, claimed, value)
        return self._failed(handle, claimed, failure, signal)

    def _outcome(self, handle: JobHandle[Any], claimed: ClaimedJob, task: asyncio.Future[Any],
                 signal: AbortSignal) -> Outcome:
        if task.done() and not task.cancelled():
            error = task.exception()
            if error is None:
                return self._finished(handle, claimed, task.result())
            return self._failed(handle, claimed, error, signal)
        return self._failed(handle, claimed, asyncio.CancelledError(), signal)

    def _finished(self, handle: JobHandle[Any], claimed: ClaimedJob, value: Any) -> Outcome:
        try:
            # Serialised once, here: what cannot be stored is refused now (a retry would
            # return it again), and the driver stores this text without dumping it again.
            result = _NULL if value is None else Serialized(strict_dumps(to_jsonable_python(value)))
        except Exception as bad:
            # The same handler would return the same value again: not worth a retry.
            refused = XError(f'job "{handle.name}" returned a value that cannot be stored as JSON: {bad}',
                             "return JSON data (str, finite numbers, bool, None, lists, dicts)",
                             code="X_JOB_RESULT")
            refused.retryable = False
            return self._failure(handle, claimed, refused, format_error(refused))
        return Outcome("done", result=result)

    def _failed(self, handle: JobHandle[Any], claimed: ClaimedJob, error: BaseException,
                signal: AbortSignal) -> Outcome:
        if isinstance(error, SuspendRun):
            return Outcome("suspended", delay=error.delay)
        interrupted = isinstance(error, JobAbortedError | asyncio.CancelledError) or (
            signal.reason == TIMEOUT and isinstance(error, TimeoutError))
        if not signal.aborted or not interrupted:
            if signal.aborted and signal.reason in LOST_REASONS:
                return Outcome("aborted", format_error(error))
            return self._failure(handle, claimed, error, format_error(error))
        reason = signal.reason or "aborted"
        if reason == TIMEOUT:
            text = f"X_JOB_TIMEOUT: attempt {claimed.job.attempt} exceeded its timeout of {handle.timeout}s"
            return self._failure(handle, claimed, TimeoutError(text), text)
        if reason == SHUTDOWN:
            return Outcome("released", "released at worker shutdown")
        return Outcome("aborted", f"aborted: {reason}")

    async def _invoke(self, handle: JobHandle[Any], claimed: ClaimedJob, model: Any, ctx: Ctx,
                      signal: AbortSignal, returned: asyncio.Event | None) -> Any:
        if handle.is_async:
            astep = AsyncStep(self.driver, claimed, signal, self.clock)
            with use_ctx(ctx):
                coroutine = cast("Callable[..., Awaitable[Any]]", handle.handler)
                return await (coroutine(model, ctx, astep) if handle.takes_step else coroutine(model, ctx))
        sstep = SyncStep(self.driver, claimed, signal, self.clock)
        loop = asyncio.get_running_loop()

        def call() -> Any:
            try:
                with use_ctx(ctx):
                    run = cast("Callable[..., Any]", handle.handler)
                    return run(model, ctx, sstep) if handle.takes_step else run(model, ctx)
            finally:
                if returned is not None:
                    with contextlib.suppress(RuntimeError):  # the loop is gone when nobody waits any more
                        loop.call_soon_threadsafe(returned.set)

        return await loop.run_in_executor(self.handler_pool, contextvars.copy_context().run, call)
