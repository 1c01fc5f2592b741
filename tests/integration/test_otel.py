"""OpenTelemetry: a web request's trace runs through the enqueue, each attempt (a retry included)
and each step, with the messaging attributes, on the memory driver (the spans do not depend on it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ultimat3 import Ctx, operator_context
from ultimat3.contrib.otel import instrument, uninstrument
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import RetryPolicy, SyncStep, Worker, job


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        uninstrument()
        provider.shutdown()


def test_a_trace_runs_from_the_request_through_each_attempt_and_step(
        spans: tuple[TracerProvider, InMemorySpanExporter], memory: MemoryDriver) -> None:
    provider, exporter = spans
    attempts: list[int] = []

    @job(name="otel.flaky", tenant="none", queue="mail", retry=RetryPolicy(max_attempts=3, base=0.0, jitter=0.0))
    def flaky(input: Any, ctx: Ctx, step: SyncStep) -> str:
        attempts.append(1)
        step.run("render", lambda: "pdf")
        if len(attempts) == 1:
            raise RuntimeError("the mail server said no")
        return "sent"

    web = provider.get_tracer("web")
    with web.start_as_current_span("POST /invoices") as request_span, operator_context("web", "test"):
        result = flaky.enqueue(driver=memory)
    worker = Worker(memory, environment="test", liveness_interval=None)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()
    record = memory.introspect.get(result.id)
    assert record is not None and record.state == "done" and len(attempts) == 2

    finished = {span.name: [] for span in exporter.get_finished_spans()}
    for span in exporter.get_finished_spans():
        finished[span.name].append(span)
    [send] = finished["send mail"]
    first, second = sorted(finished["process mail"], key=lambda s: s.attributes["ultimat3.job.attempt"])
    [render] = finished["step render"]  # the retry replays the recorded step: no second span
    trace_id = request_span.get_span_context().trace_id
    assert {s.context.trace_id for s in (send, first, second, render)} == {trace_id}
    assert send.kind == SpanKind.PRODUCER and send.parent.span_id == request_span.get_span_context().span_id
    assert first.kind == second.kind == SpanKind.CONSUMER
    assert first.parent.span_id == second.parent.span_id == send.context.span_id
    assert render.parent.span_id == first.context.span_id
    assert dict(send.attributes) == {"messaging.system": "ultimat3", "messaging.operation.type": "send",
                                     "messaging.destination.name": "mail", "ultimat3.job.name": "otel.flaky"}
    assert first.attributes["messaging.message.id"] == result.id
    assert (first.attributes["ultimat3.job.outcome"], first.status.status_code) == ("retry", StatusCode.ERROR)
    assert "the mail server said no" in (first.status.description or "")
    assert [e.name for e in first.events] == ["exception"]
    assert (second.attributes["ultimat3.job.outcome"], second.status.status_code) == ("done", StatusCode.UNSET)
    assert record.traceparent is not None and f"{send.context.span_id:016x}" in record.traceparent


def test_a_batch_enqueue_is_one_span_and_no_tracer_means_no_spans(
        spans: tuple[TracerProvider, InMemorySpanExporter], memory: MemoryDriver) -> None:
    _, exporter = spans

    @job(name="otel.batch", tenant="none")
    def batch(input: Any, ctx: Ctx) -> None:
        return None

    with operator_context("test", "otel"):
        batch.enqueue_many([{}, {}, {}], driver=memory)
        [send] = exporter.get_finished_spans()
        assert send.attributes["messaging.batch.message_count"] == 3
        uninstrument()
        batch.enqueue(driver=memory)
    assert len(exporter.get_finished_spans()) == 1
