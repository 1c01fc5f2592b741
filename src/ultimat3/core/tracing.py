"""Tracing hooks: where a tracer (OpenTelemetry, through ``ultimat3.contrib.otel``) sees jobs.

The core imports no tracing library. It calls the installed :class:`Tracer` (none by default) at
three points: around every enqueue call (a producer span; the traceparent it returns is what the
job row carries, so the attempts join the enqueuer's trace), around every attempt (a consumer
span, made current so the handler's own spans nest under it) and around every step that runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

__all__ = ["AttemptSpan", "Tracer", "get_tracer", "set_tracer"]


class AttemptSpan(Protocol):
    """The span of one attempt, told how it ended."""

    def outcome(self, kind: str, error: str | None) -> None:
        """``kind``: done, retry, dead, suspended, released, aborted; ``error``: its text, if any."""
        ...


class Tracer(Protocol):
    """What a tracing integration implements."""

    def enqueue(self, name: str, queue: str, count: int, traceparent: str | None) -> AbstractContextManager[str | None]:
        """Around one enqueue call of ``count`` jobs; yields the traceparent the rows carry
        (``None``: keep ``traceparent``, the context's)."""
        ...

    def attempt(self, name: str, queue: str, job_id: str, attempt: int,
                traceparent: str | None) -> AbstractContextManager[AttemptSpan]:
        """Around one attempt of a job whose row carries ``traceparent``."""
        ...

    def step(self, name: str) -> AbstractContextManager[None]:
        """Around one step that runs (a replayed step is not run, and gets no span)."""
        ...


_tracer: Tracer | None = None


def set_tracer(tracer: Tracer | None) -> None:
    """Install ``tracer`` for this process (``None``: no tracing)."""
    global _tracer
    _tracer = tracer


def get_tracer() -> Tracer | None:
    """The installed tracer, if any."""
    return _tracer


class _NoSpan:
    def outcome(self, kind: str, error: str | None) -> None:
        return None


@contextmanager
def enqueue_span(name: str, queue: str, count: int, traceparent: str | None) -> Iterator[str | None]:
    """The installed tracer's enqueue span, or nothing; yields the traceparent to store."""
    tracer = _tracer
    if tracer is None:
        yield traceparent
        return
    with tracer.enqueue(name, queue, count, traceparent) as produced:
        yield produced if produced is not None else traceparent


class _NoAttemptSpan:
    """The context of an attempt with no tracer installed: one shared object, no generator per
    attempt (the generator-based context manager cost a worker ~2 us per job for nothing)."""

    __slots__ = ()

    def __enter__(self) -> AttemptSpan:
        return _NO_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()
_NO_ATTEMPT_SPAN = _NoAttemptSpan()


def attempt_span(name: str, queue: str, job_id: str, attempt: int,
                 traceparent: str | None) -> AbstractContextManager[AttemptSpan]:
    """The installed tracer's attempt span, or a no-op one."""
    tracer = _tracer
    if tracer is None:
        return _NO_ATTEMPT_SPAN
    return tracer.attempt(name, queue, job_id, attempt, traceparent)


@contextmanager
def step_span(name: str) -> Iterator[None]:
    """The installed tracer's step span, or nothing."""
    tracer = _tracer
    if tracer is None:
        yield
        return
    with tracer.step(name):
        yield
