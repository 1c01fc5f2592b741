"""Prometheus metrics of a worker process (extra ``ultimat3[prometheus]``).

``x worker --metrics-port 9464`` serves them; in your own process::

    metrics = WorkerMetrics(driver)
    worker = Worker(driver, on_event=metrics.on_event)
    metrics.serve(9464)            # the HTTP endpoint, and the queue sampler thread

Metrics (prefix ``ultimat3_``):

- ``attempts_total{name, queue, outcome}``: settled attempts; outcome is ``done``, ``retry``,
  ``dead``, ``suspended``, ``released``, ``aborted`` or ``fenced``;
- ``attempt_duration_seconds{name, queue}``: a histogram of attempt durations;
- ``claimed_total``, ``rescued_total``, ``scheduled_total``: jobs this worker claimed, rescued from
  dead workers, and enqueued for schedule ticks;
- ``queue_jobs{queue, state}``, ``queue_due{queue}``, ``queue_oldest_due_seconds{queue}``,
  ``queue_paused{queue}``: sampled from the database every ``sample_interval`` seconds (15), one
  query per sample however often Prometheus scrapes;
- ``backfill_rows{name}``, ``backfill_batches{name}``: the current pass of each backfill that runs in
  this process, as of its last batch; ``backfill_batches_total{name}``: batches handled here;
  ``backfill_held{name}``: 1 while a database-health check holds the pass; ``backfill_failed_rows{name}``:
  rows the current pass quarantined.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ultimat3.backfill import BackfillProgress, add_progress_listener
from ultimat3.drivers.protocol import JOB_STATES, JobDriver
from ultimat3.jobs.worker import WorkerEvent

__all__ = ["WorkerMetrics"]

log = logging.getLogger("ultimat3.metrics")
_OUTCOMES = frozenset({"done", "retry", "dead", "suspended", "released", "aborted", "fenced"})


class WorkerMetrics:
    """The metrics of one worker process, in their own registry (see the module docstring)."""

    def __init__(self, driver: JobDriver, *, registry: CollectorRegistry | None = None,
                 sample_interval: float = 15.0) -> None:
        self.driver = driver
        self.registry = registry if registry is not None else CollectorRegistry()
        self.sample_interval = sample_interval
        r = self.registry
        self.attempts = Counter("ultimat3_attempts", "Settled attempts by job name, queue and outcome.",
                                ["name", "queue", "outcome"], registry=r)
        self.durations = Histogram("ultimat3_attempt_duration_seconds", "Attempt durations.", ["name", "queue"],
                                   buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                                   registry=r)
        self.claimed = Counter("ultimat3_claimed", "Jobs this worker claimed.", registry=r)
        self.rescued = Counter("ultimat3_rescued", "Running jobs of dead workers this worker put back.", registry=r)
        self.scheduled = Counter("ultimat3_scheduled", "Jobs this worker enqueued for schedule ticks.", registry=r)
        self.queue_jobs = Gauge("ultimat3_queue_jobs", "Jobs per queue and state (sampled).", ["queue", "state"],
                                registry=r)
        self.queue_due = Gauge("ultimat3_queue_due", "Waiting jobs whose time has come (sampled).", ["queue"],
                               registry=r)
        self.queue_oldest = Gauge("ultimat3_queue_oldest_due_seconds",
                                  "How long the longest-waiting due job has waited (sampled; 0: none due).",
                                  ["queue"], registry=r)
        self.queue_paused = Gauge("ultimat3_queue_paused", "1 when the queue is paused (sampled).", ["queue"],
                                  registry=r)
        self.backfill_rows = Gauge("ultimat3_backfill_rows", "Rows of the current pass, as of its last batch.",
                                   ["name"], registry=r)
        self.backfill_batches = Gauge("ultimat3_backfill_batches", "Batches of the current pass.", ["name"],
                                      registry=r)
        self.backfill_handled = Counter("ultimat3_backfill_batches_handled", "Backfill batches handled here.",
                                        ["name"], registry=r)
        self.backfill_held = Gauge("ultimat3_backfill_held",
                                   "1 while a database-health check holds the pass (its reason is in the ledger).",
                                   ["name"], registry=r)
        self.backfill_failed = Gauge("ultimat3_backfill_failed_rows", "Rows the current pass quarantined.",
                                     ["name"], registry=r)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._server: Any = None
        self._remove_listener = add_progress_listener(self.on_progress)

    def on_event(self, event: WorkerEvent) -> None:
        """The worker's ``on_event`` hook."""
        if event.kind in _OUTCOMES:
            labels = (event.name or "?", event.queue or "?")
            self.attempts.labels(*labels, event.kind).inc()
            if event.duration is not None:
                self.durations.labels(*labels).observe(event.duration)
        elif event.kind == "claimed":
            self.claimed.inc(event.count)
        elif event.kind == "rescued":
            self.rescued.inc()
        elif event.kind == "scheduled":
            self.scheduled.inc()

    def on_progress(self, event: BackfillProgress) -> None:
        """A backfill progress listener (installed by the constructor)."""
        self.backfill_rows.labels(event.name).set(event.rows)
        self.backfill_batches.labels(event.name).set(event.batches)
        self.backfill_failed.labels(event.name).set(event.failures)
        # A throttle event reports a wait, not a batch; the next batch's event clears the gauge.
        self.backfill_held.labels(event.name).set(0 if event.throttle is None else 1)
        if not event.replayed and event.throttle is None:
            self.backfill_handled.labels(event.name).inc()

    def sample(self) -> None:
        """Read the per-queue gauges from the database now (one query)."""
        for info in self.driver.queues.overview():
            for state in JOB_STATES:
                self.queue_jobs.labels(info.queue, state).set(info.counts.get(state, 0))
            self.queue_due.labels(info.queue).set(info.due)
            self.queue_oldest.labels(info.queue).set(info.oldest_due_age or 0.0)
            self.queue_paused.labels(info.queue).set(1 if info.paused else 0)

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as error:  # a database outage: the gauges keep their last values
                log.warning("metrics: could not sample the queues (%s)", error)
            self._stop.wait(self.sample_interval)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``addr:port`` (0: any free port) and start sampling; the port."""
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._sampler = threading.Thread(target=self._sample_loop, name="ultimat3-metrics-sampler", daemon=True)
        self._sampler.start()
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop the sampler and the HTTP server; detach from backfill progress."""
        self._stop.set()
        self._remove_listener()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._sampler is not None:
            self._sampler.join(timeout=5.0)
