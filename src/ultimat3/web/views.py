"""What each dashboard page shows, as plain JSON-able dicts: the JSON API returns them as they are
and the HTML pages render them (so a script sees exactly what a person sees)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any

from ultimat3.backfill.foreground import dry_run
from ultimat3.backfill.gate import backfill_status, pending_reason
from ultimat3.backfill.registry import get_backfill, registered_backfills
from ultimat3.core.context import Environment
from ultimat3.core.errors import XError, first_line
from ultimat3.drivers.protocol import (
    DEFAULT_QUEUE,
    JOB_STATES,
    BackfillRun,
    JobDriver,
    JobFilter,
    JobRecord,
)
from ultimat3.jobs.scheduler import declared_schedules, schedule_json
from ultimat3.jobs.why import why_waiting

__all__ = ["PAGE_SIZE", "Views"]

#: Jobs per page of the jobs list.
PAGE_SIZE = 50
#: The throughput chart: one bar per minute over the last hour.
CHART_MINUTES = 60
#: Failures of a backfill listed on its page (the CLI pages through the rest).
FAILURES_SHOWN = 50
#: Seconds a whole-table read (the overview) is shared between the pages that ask for it.
SHARED_FOR = 1.0
#: Running jobs looked at to find who holds concurrency slots and what rate keys are in use.
FLOW_SCAN = 500


def plain(value: Any) -> Any:
    """Datetimes as ISO text, recursively: what JSON can carry."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def job_json(job: JobRecord) -> dict[str, Any]:
    """Every field of the job row."""
    return {k: plain(v) for k, v in asdict(job).items()}


def run_json(run: BackfillRun | None) -> dict[str, Any] | None:
    """One ``x_backfills`` row."""
    return None if run is None else {k: plain(v) for k, v in asdict(run).items()}


class Views:
    """The dashboard's reads over one driver (thread-safe: every read is a driver call)."""

    def __init__(self, driver: JobDriver, environment: Environment) -> None:
        self.driver = driver
        self.environment = environment
        # A pass's total rows (its backfill's count=), asked once per pass: counting may be costly.
        self._totals: dict[str, int | None] = {}
        self._totals_lock = threading.Lock()
        self._shared_reads: dict[str, tuple[float, dict[str, Any]]] = {}

    def now(self) -> float:
        """The driver's clock (the fleet's clock on PostgreSQL)."""
        return self.driver.clock.now()

    def _shared(self, key: str, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``build()``, shared for :data:`SHARED_FOR` seconds by every open page: the overview counts
        the whole jobs table, and a dashboard left open in ten tabs must not count it ten times."""
        now = time.monotonic()
        with self._totals_lock:
            hit = self._shared_reads.get(key)
            if hit is not None and now - hit[0] < SHARED_FOR:
                return hit[1]
        value = build()
        with self._totals_lock:
            self._shared_reads[key] = (now, value)
        return value

    # ---------------------------------------------------------------- overview
    def overview(self) -> dict[str, Any]:
        """Per queue: counts by state, due jobs and the age of the oldest, paused; completions per
        minute over the last hour, per queue and in all (read at most once a second)."""
        return self._shared("overview", self._overview)

    def _overview(self) -> dict[str, Any]:
        now = self.now()
        start = (math.floor(now / 60) - CHART_MINUTES + 1) * 60
        minutes = [start + 60 * i for i in range(CHART_MINUTES)]
        per_queue: dict[str, list[int]] = {}
        for c in self.driver.introspect.completions(start, 60):
            index = int((c.at.timestamp() - start) // 60)
            if 0 <= index < CHART_MINUTES:
                per_queue.setdefault(c.queue, [0] * CHART_MINUTES)[index] += c.done
        total = [sum(series[i] for series in per_queue.values()) for i in range(CHART_MINUTES)]
        queues = []
        for info in self.driver.queues.overview(3600.0):
            queues.append({
                "queue": info.queue, "paused": info.paused, "counts": info.counts, "due": info.due,
                "oldest_due_age": info.oldest_due_age, "done_last_hour": info.done_recent,
                "failed_last_hour": info.failed_recent, "dead_last_hour": info.dead_recent,
                "completed_per_minute": per_queue.get(info.queue, [0] * CHART_MINUTES),
            })
        return {"now": plain(_at(now)), "minutes": [plain(_at(m)) for m in minutes],
                "completed_per_minute": total, "queues": queues}

    # ---------------------------------------------------------------- jobs
    def jobs(self, *, queue: str | None = None, name: str | None = None, state: str | None = None,
             tenant: str | None = None, error: str | None = None, before: str | None = None,
             limit: int = PAGE_SIZE) -> dict[str, Any]:
        """One page of jobs, newest first, and the cursor of the next page (``None``: last page).
        ``error`` is a code or any text of the last error, as ``x jobs ls --error``."""
        if state is not None and state not in JOB_STATES:
            raise XError(f"no job state is called {state!r}", f"use one of: {', '.join(JOB_STATES)}",
                         code="X_WEB_FILTER")
        if not 1 <= limit <= 500:
            raise XError(f"a page holds 1 to 500 jobs, not {limit}", "pass limit=50", code="X_WEB_FILTER")
        flt = JobFilter(queue=queue, name=name, state=state, tenant_id=tenant, error=error, before=before,
                        limit=limit + 1)
        rows = self.driver.introspect.list(flt)
        page = rows[:limit]
        return {"jobs": [job_json(job) for job in page],
                "next": page[-1].id if len(rows) > limit else None,
                "filter": {"queue": queue, "name": name, "state": state, "tenant": tenant, "error": error,
                           "before": before}}

    def job(self, job_id: str) -> dict[str, Any] | None:
        """One job: its row, every attempt, its recorded steps, its backfill pass, and why it waits."""
        job = self.driver.introspect.get(job_id)
        if job is None:
            return None
        steps = sorted(self.driver.steps.load(job.run_id).values(), key=lambda s: (s.created_at, s.name))
        reasons: list[dict[str, str]] = []
        if job.state in ("ready", "delayed", "suspended"):
            try:
                reasons = why_waiting(self.driver, job.id).to_json()["reasons"]
            except XError as error:  # the job moved on between the two reads
                reasons = [{"code": error.code, "text": error.message}]
        return {
            "job": job_json(job),
            "attempts": [plain(asdict(a)) for a in self.driver.introspect.attempts(job.id)],
            "steps": [{"name": s.name, "result": s.result, "created_at": plain(s.created_at)} for s in steps],
            "backfill": run_json(self.driver.backfills.get(job.run_id)),
            "why": reasons,
        }

    # ---------------------------------------------------------------- backfills
    def backfills(self) -> dict[str, Any]:
        """Every declared backfill: checksum, whether the deploy gate holds it (and why), its latest
        pass with progress, and any pass the ledger knows of that is still running."""
        rows = []
        for status in backfill_status(self.driver, allow_none=True):
            latest = status.latest
            rows.append({
                **status.declaration.to_json(),
                "pending": status.pending,
                "deciding": run_json(status.deciding),
                "latest": None if latest is None else self._pass(latest),
                "quarantined": self.driver.backfills.outstanding(status.declaration.name),
            })
        return {"backfills": rows}

    def backfill(self, name: str) -> dict[str, Any] | None:
        """One backfill: its declaration and gate, every pass in the ledger (newest first) with
        progress, and the rows quarantined now."""
        handle = get_backfill(name)
        runs = self.driver.backfills.list(name)
        if handle is None and not runs:
            return None
        declared = next((d for d in registered_backfills() if d.name == name), None)
        pending = None
        if declared is not None:
            pending, _ = pending_reason(self.driver, name, declared.checksum)
        failures = self.driver.backfills.failures(name, limit=FAILURES_SHOWN)
        return {
            "name": name,
            "declaration": None if declared is None else declared.to_json(),
            "pending": pending,
            "passes": [self._pass(run) for run in runs],
            "quarantined": self.driver.backfills.outstanding(name),
            "failures": [{**{k: plain(v) for k, v in asdict(f).items()}} for f in failures],
        }

    def _pass(self, run: BackfillRun) -> dict[str, Any]:
        """A ledger row with what a person wants of it: rate, total, percent and ETA."""
        end = run.finished_at.timestamp() if run.finished_at is not None else self.now()
        elapsed = max(0.0, end - run.started_at.timestamp())
        rate = run.rows / elapsed if elapsed > 0 and run.rows else None
        total = self._total(run) if run.status in ("running", "paused") else None
        if run.status == "completed":
            total = run.rows
        percent = None if not total else min(100.0, 100.0 * run.rows / total)
        eta = None
        if total and rate and run.status == "running" and total > run.rows:
            eta = (total - run.rows) / rate
        return {**(run_json(run) or {}), "elapsed": elapsed, "rate": rate, "total": total, "percent": percent,
                "eta": eta}

    def _total(self, run: BackfillRun) -> int | None:
        with self._totals_lock:
            if run.run_id in self._totals:
                return self._totals[run.run_id]
        handle = get_backfill(run.name)
        total: int | None = None
        if handle is not None:
            try:
                total = dry_run(handle, self.driver, self.environment).rows
            except Exception:  # a count that cannot run here: the bar shows rows without a total
                total = None
        with self._totals_lock:
            self._totals[run.run_id] = total
        return total

    # ---------------------------------------------------------------- workers
    def workers(self) -> dict[str, Any]:
        """Every registered worker: alive or not (and how that was decided), what it runs now,
        its last heartbeat and clock offset."""
        workers = []
        for w in self.driver.workers.list():
            running = []
            for job_id in w.running[:20]:
                job = self.driver.introspect.get(job_id)
                if job is not None:
                    running.append({"id": job.id, "name": job.name, "queue": job.queue,
                                    "started_at": plain(job.started_at)})
            workers.append({**{k: plain(v) for k, v in asdict(w).items() if k != "running"},
                            "running": running, "running_count": len(w.running)})
        return {"workers": workers}

    # ---------------------------------------------------------------- schedules
    def schedules(self) -> dict[str, Any]:
        """Declared and remembered schedules: next fire time, last tick and its job, paused."""
        now = self.now()
        declared = {d.key: d for d in declared_schedules()}
        rows = {row.key: row for row in self.driver.schedules.list()}
        return {"schedules": [schedule_json(key, declared.get(key), rows.get(key), now)
                              for key in sorted(set(declared) | set(rows))]}

    # ---------------------------------------------------------------- flow control
    def limits(self) -> dict[str, Any]:
        """Concurrency keys in use (who holds the slots, how many wait) and rate buckets."""
        running = self.driver.introspect.list(JobFilter(state="running", limit=FLOW_SCAN))
        waiting = [job for state in ("ready", "delayed", "suspended")
                   for job in self.driver.introspect.list(JobFilter(state=state, limit=FLOW_SCAN))]
        keys = sorted({j.flow_key for j in running + waiting if j.flow_key is not None})
        slots = []
        for key in keys:
            holders = self.driver.introspect.slot_holders(key)
            sample = next(j for j in running + waiting if j.flow_key == key)
            slots.append({"key": key, "max": sample.flow_max,
                          "holders": [{"id": j.id, "name": j.name, "worker": j.claimed_by,
                                       "started_at": plain(j.started_at)} for j in holders],
                          "waiting": sum(1 for j in waiting if j.flow_key == key)})
        rates = []
        for key in sorted({j.rate_key for j in running + waiting if j.rate_key is not None}):
            bucket = self.driver.introspect.rate_bucket(key)
            sample = next(j for j in running + waiting if j.rate_key == key)
            level = None if bucket is None else bucket.level(self.now())
            rates.append({"key": key, "per_second": sample.rate_per_second, "burst": sample.rate_burst,
                          "tokens": level, "waiting": sum(1 for j in waiting if j.rate_key == key)})
        return {"slots": slots, "rates": rates, "scanned": FLOW_SCAN}

    def queue_names(self) -> list[str]:
        """Queues for the filter menu."""
        names = {info.queue for info in self.driver.queues.overview(3600.0)}
        return sorted(names | {DEFAULT_QUEUE})


def _at(seconds: float) -> datetime:
    from ultimat3.core.clock import to_datetime

    return to_datetime(seconds)


def error_line(error: BaseException) -> str:
    """One line for a failed action, coded when it can be."""
    if isinstance(error, XError):
        return f"{error.code}: {error.message}"
    return first_line(f"{type(error).__name__}: {error}")
