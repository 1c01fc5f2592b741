"""``x jobs why ID``: why a job that has not started has not started, from what the store knows.

Every answer is a fact read from the database, never a guess: the job's own ``run_at`` (enqueued
for later, a retry's backoff, a ``step.sleep``, a paused backfill pass), its queue or its schedule
paused (by whom, since when), its concurrency key's slots all held (by which jobs on which
workers), its rate key's bucket empty (and when the next token comes), no live worker serving its
queue, and how many due jobs its queue holds. A job that is due, in an active queue a live worker
serves, says exactly that: the next claim takes it in priority order, within the claim starvation
bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import XError
from ultimat3.drivers.flow import WHOLE_TOKEN
from ultimat3.drivers.protocol import CLAIM_STARVATION_BOUND, FINAL_STATES, JobDriver, JobRecord
from ultimat3.jobs.schedule import schedule_of

__all__ = ["WaitExplanation", "WaitReason", "why_waiting"]

WaitCode = Literal["finished", "running", "not-due", "backoff", "sleeping", "backfill-paused", "queue-paused",
                   "concurrency-limit", "rate-limit", "schedule-paused", "no-worker", "due"]


@dataclass(frozen=True)
class WaitReason:
    """One reason, coded so scripts can branch on it: ``code`` and a sentence for a person."""

    code: WaitCode
    text: str


@dataclass(frozen=True)
class WaitExplanation:
    """Why job ``job`` has (not) started; ``waiting`` is false once it runs or has finished."""

    job: JobRecord
    waiting: bool
    reasons: list[WaitReason] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (``x jobs why ID --json``)."""
        return {"id": self.job.id, "name": self.job.name, "queue": self.job.queue, "state": self.job.state,
                "waiting": self.waiting, "reasons": [{"code": r.code, "text": r.text} for r in self.reasons]}


def _seconds(value: float) -> str:
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


def _rate(per_second: float) -> str:
    for unit, span in (("s", 1.0), ("min", 60.0), ("h", 3600.0)):
        if per_second * span >= 1:
            return f"{per_second * span:.3g} starts/{unit}"
    return f"{per_second * 86400:.3g} starts/day"


def why_waiting(driver: JobDriver, job_id: str) -> WaitExplanation:
    """Explain job ``job_id`` (``X_JOB_NOT_FOUND`` when there is none)."""
    job = driver.introspect.get(job_id)
    if job is None:
        raise XError(f"no job {job_id}", "check the id (`x jobs ls` lists jobs)", code="X_JOB_NOT_FOUND")
    now = driver.clock.now()
    if job.state in FINAL_STATES:
        when = "" if job.finished_at is None else f" at {job.finished_at.isoformat(timespec='seconds')}"
        return WaitExplanation(job, False, [WaitReason("finished", f"it is not waiting: it ended {job.state}{when}")])
    if job.state == "running":
        return WaitExplanation(job, False, [WaitReason("running", f"it is running on {job.claimed_by or 'a worker'}")])
    reasons: list[WaitReason] = []
    run_at = job.run_at.timestamp()
    if run_at > now:
        at = to_datetime(run_at).isoformat(timespec="seconds")
        left = _seconds(run_at - now)
        ledger = driver.backfills.get(job.run_id)
        if ledger is not None and ledger.status == "paused":
            reasons.append(WaitReason("backfill-paused", f"its backfill pass was paused by {ledger.paused_by} "
                                                         f"after {ledger.batches} batches: `x db backfill resume "
                                                         f"{ledger.name}` goes on"))
        elif job.state == "suspended":
            reasons.append(WaitReason("sleeping", f"it sleeps (step.sleep) until {at}, in {left}"))
        elif job.state == "ready" and job.attempt > 0:
            reasons.append(WaitReason("backoff", f"attempt {job.attempt} failed; it retries at {at}, in {left}"
                                                 + (f" (last error: {job.last_error.splitlines()[0]})"
                                                    if job.last_error else "")))
        else:
            reasons.append(WaitReason("not-due", f"it was enqueued to run at {at}, in {left}"))
    queue = next((info for info in driver.queues.overview() if info.queue == job.queue), None)
    if queue is not None and queue.paused:
        since = "" if queue.changed_at is None else f" since {queue.changed_at.isoformat(timespec='seconds')}"
        reasons.append(WaitReason("queue-paused", f"its queue {job.queue!r} is paused by {queue.changed_by}{since}: "
                                                  f"`x queues resume {job.queue}` lets workers take it"))
    reasons += _flow_reasons(driver, job, now)
    serving = [w for w in driver.workers.list() if w.alive and (w.queues is None or job.queue in w.queues)]
    if not serving:
        reasons.append(WaitReason("no-worker", f"no live worker serves queue {job.queue!r} "
                                               f"(`x workers ls`; start one with `x worker --queue {job.queue}`)"))
    if not reasons:
        due = 0 if queue is None else queue.due
        busy = sum(len(w.running) for w in serving)
        slots = sum(w.concurrency for w in serving)
        reasons.append(WaitReason(
            "due", f"it is due, its queue is active and {len(serving)} live worker(s) serve it ({busy} of "
                   f"{slots} slots busy); {due} due job(s) wait in {job.queue!r}, taken by priority then "
                   f"run_at, each within {CLAIM_STARVATION_BOUND:g} s of a free slot"))
    schedule = _paused_schedule(driver, job)
    if schedule is not None:
        reasons.append(schedule)  # said last: it holds nothing back, but an operator wants to know
    return WaitExplanation(job, True, reasons)


def _paused_schedule(driver: JobDriver, job: JobRecord) -> WaitReason | None:
    """A run its schedule enqueued, while that schedule is paused: said, though it does not hold
    this run back (a pause stops the next ticks, not what a past tick enqueued)."""
    key = schedule_of(job.enqueued_by)
    if key is None:
        return None
    record = driver.schedules.get(key)
    if record is None or not record.paused:
        return None
    since = "" if record.changed_at is None else f" since {record.changed_at.isoformat(timespec='seconds')}"
    return WaitReason("schedule-paused", f"its schedule {key!r} is paused by {record.changed_by}{since}: this run "
                                         "was enqueued before and still runs, but no later tick fires until "
                                         f"`x schedules resume {key}`")


def _flow_reasons(driver: JobDriver, job: JobRecord, now: float) -> list[WaitReason]:
    """The job's flow control as it stands: a full concurrency key (and who holds it), an empty bucket."""
    reasons: list[WaitReason] = []
    if job.flow_key is not None and job.flow_max is not None:
        holders = driver.introspect.slot_holders(job.flow_key)
        if len(holders) >= job.flow_max:
            who = ", ".join(f"{h.id} ({h.name} on {h.claimed_by or '?'})" for h in holders[:5])
            more = f" and {len(holders) - 5} more" if len(holders) > 5 else ""
            reasons.append(WaitReason("concurrency-limit", f"its concurrency key {job.flow_key!r} allows "
                                                           f"{job.flow_max} at once and all are running: {who}{more}; "
                                                           "it starts when one of them ends"))
    if job.rate_key is not None:
        bucket = driver.introspect.rate_bucket(job.rate_key)
        if bucket is not None and bucket.level(now) < WHOLE_TOKEN:
            wait = bucket.next_token(now) - now
            at = to_datetime(now + wait).isoformat(timespec="milliseconds")
            reasons.append(WaitReason("rate-limit", f"its rate key {job.rate_key!r} allows {_rate(bucket.per_second)} "
                                                    f"(burst {bucket.burst}) and has no token now; the next comes "
                                                    f"at {at}, in {_seconds(wait) if wait >= 1 else f'{wait:.3f} s'}"))
    return reasons
