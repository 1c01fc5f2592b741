"""OpenTelemetry traces of jobs (extra ``ultimat3[otel]``)::

    from ultimat3.contrib.otel import instrument
    instrument()            # the global TracerProvider; or instrument(tracer_provider=...)

Then a trace shows a web request -> ``send <queue>`` (a PRODUCER span around each enqueue call,
whose context the job rows carry as their ``traceparent``) -> ``process <queue>`` (a CONSUMER span
per attempt, child of the producer span, current while the handler runs so its own spans nest) ->
``step <name>`` (each step that runs). Attributes follow the OpenTelemetry messaging conventions:
``messaging.system`` (``ultimat3``), ``messaging.operation.type`` (``send``/``process``),
``messaging.destination.name`` (the queue), ``messaging.message.id`` (the job id),
``messaging.batch.message_count`` (a batch enqueue); ours: ``ultimat3.job.name``,
``ultimat3.job.attempt``, ``ultimat3.job.outcome``. A failed attempt records its error on the span
and sets the span's status to ERROR.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ultimat3.core.errors import first_line
from ultimat3.core.tracing import set_tracer

__all__ = ["OtelTracer", "instrument", "uninstrument"]

_SYSTEM = "ultimat3"
_FAILED = frozenset({"retry", "dead"})
_propagator = TraceContextTextMapPropagator()


class _Attempt:
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def outcome(self, kind: str, error: str | None) -> None:
        self._span.set_attribute("ultimat3.job.outcome", kind)
        if kind in _FAILED:
            message = first_line(error or kind)
            self._span.add_event("exception", {"exception.message": message, "exception.stacktrace": error or ""})
            self._span.set_status(Status(StatusCode.ERROR, message))


class OtelTracer:
    """The :class:`~ultimat3.core.tracing.Tracer` that speaks OpenTelemetry."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("ultimat3", tracer_provider=tracer_provider)

    @contextmanager
    def enqueue(self, name: str, queue: str, count: int, traceparent: str | None) -> Iterator[str | None]:
        """A PRODUCER span around one enqueue call; yields its traceparent for the rows."""
        attributes: dict[str, Any] = {"messaging.system": _SYSTEM, "messaging.operation.type": "send",
                                      "messaging.destination.name": queue, "ultimat3.job.name": name}
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        with self._tracer.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes):
            carrier: dict[str, str] = {}
            _propagator.inject(carrier)
            yield carrier.get("traceparent", traceparent)

    @contextmanager
    def attempt(self, name: str, queue: str, job_id: str, attempt: int,
                traceparent: str | None) -> Iterator[_Attempt]:
        """A CONSUMER span per attempt, child of the enqueue's span, current while the handler runs."""
        parent = _propagator.extract({"traceparent": traceparent}) if traceparent else None
        attributes: dict[str, Any] = {"messaging.system": _SYSTEM, "messaging.operation.type": "process",
                      "messaging.destination.name": queue, "messaging.message.id": job_id,
                      "ultimat3.job.name": name, "ultimat3.job.attempt": attempt}
        with self._tracer.start_as_current_span(f"process {queue}", context=parent, kind=SpanKind.CONSUMER,
                                                attributes=attributes, record_exception=True) as span:
            yield _Attempt(span)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A span around a step that runs."""
        with self._tracer.start_as_current_span(f"step {name}", attributes={"ultimat3.step.name": name}):
            yield


def instrument(tracer_provider: trace.TracerProvider | None = None) -> OtelTracer:
    """Trace every enqueue, attempt and step of this process from now on."""
    tracer = OtelTracer(tracer_provider)
    set_tracer(tracer)
    return tracer


def uninstrument() -> None:
    """Stop tracing jobs."""
    set_tracer(None)
