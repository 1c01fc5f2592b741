"""The operator's API: act on many jobs at once, pause and resume queues, see why jobs die.

The CLI's ``x jobs retry|cancel|delete`` (with filters), ``x queues`` and ``x jobs ls --group-by
error`` are thin layers over these functions, and scripts and the web dashboard call them the same
way. A bulk action:

- refuses a filter that selects nothing in particular (``X_BULK_NO_FILTER``) unless
  ``everything=True``, and a state the action cannot act on (``X_BULK_STATE``);
- works in bounded batches (:data:`DEFAULT_BATCH` jobs, one transaction each, SKIP LOCKED on
  PostgreSQL), so claims and settlements elsewhere keep flowing;
- records itself in the audit log before the first batch, and each batch adds to the entry's
  ``touched`` count in the batch's own transaction: an interrupted action shows what it did;
- can simply be run again after an interrupt: what it already did no longer matches.

Retry keeps each job's run (its recorded steps replay) and skips a job whose idempotency key a live
job holds; cancel reaches a running attempt through its claim (its next heartbeat fails and the
attempt is aborted); delete removes waiting and finished jobs, never a running one (cancel it first).
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import ConfigError
from ultimat3.drivers.filters import validate_filter
from ultimat3.drivers.protocol import (
    BULK_STATES,
    AuditAction,
    AuditEntry,
    BulkAction,
    BulkRequest,
    ErrorGroup,
    JobDriver,
    JobFilter,
    JobRecord,
    JobState,
    QueueInfo,
)

__all__ = [
    "BULK_CONFIRM_ABOVE",
    "DEFAULT_BATCH",
    "BulkOutcome",
    "BulkPreview",
    "action_states",
    "audit_log",
    "bulk",
    "default_actor",
    "error_groups",
    "filter_json",
    "pause_queue",
    "preview",
    "queue_overview",
    "resume_queue",
]

#: Jobs per batch (one transaction each).
DEFAULT_BATCH = 500
#: Above this many jobs the CLI asks before acting (``--yes`` skips the question).
BULK_CONFIRM_ABOVE = 100
#: What an action touches when no ``state`` is given: retry revives dead jobs (a cancelled one was
#: stopped on purpose: ask for ``state="cancelled"``), delete removes finished ones.
_DEFAULT_STATES: dict[BulkAction, tuple[JobState, ...]] = {
    "retry": ("dead",),
    "cancel": ("ready", "delayed", "running", "suspended"),
    "delete": ("done", "dead", "cancelled"),
}
# After the cursor reached the end, rows that were locked as it passed are looked for again this
# many times (a claim or a settlement holds a row for milliseconds).
_LOCKED_ROUNDS = 2
_LOCKED_WAIT = 0.2
# Ids given one by one are sent in chunks of this many.
_ID_CHUNK = 1000


def default_actor() -> str:
    """Who acts when no actor is given: ``cli:<OS login>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user database entry (containers): still an operator, just unnamed
        return "cli:unknown"


def action_states(action: BulkAction, flt: JobFilter) -> tuple[JobState, ...]:
    """The states ``action`` acts on under ``flt``: ``flt.state`` when it is one the action can
    act on (else ``X_BULK_STATE``), otherwise the action's default states."""
    if action not in BULK_STATES:
        raise ConfigError(f"unknown bulk action {action!r}", "use retry, cancel or delete", code="X_BULK_ACTION")
    if flt.state is None:
        return _DEFAULT_STATES[action]
    if flt.state not in BULK_STATES[action]:
        allowed = ", ".join(sorted(BULK_STATES[action]))
        hints = {"retry": "only a dead or cancelled job can be retried",
                 "cancel": "a finished job cannot be cancelled",
                 "delete": "a running job cannot be deleted: cancel it first"}
        raise ConfigError(f"{action} cannot act on {flt.state} jobs ({hints[action]})",
                          f"pick --state from: {allowed}", code="X_BULK_STATE")
    return (flt.state,)


def filter_json(flt: JobFilter) -> dict[str, Any]:
    """The filter as JSON (for the audit log, ``--dry-run`` and ``--json``): only the given fields."""
    out: dict[str, Any] = {}
    for field in ("queue", "name", "state", "tenant_id", "error"):
        value = getattr(flt, field)
        if value is not None:
            out[field] = value
    for field in ("since", "until"):
        value = getattr(flt, field)
        if value is not None:
            out[field] = to_datetime(value).isoformat()
    if flt.ids is not None:
        out["ids"] = len(flt.ids)
        out["ids_sample"] = list(flt.ids[:5])
    return out


def _is_unbounded(flt: JobFilter) -> bool:
    return all(getattr(flt, field) is None
               for field in ("queue", "name", "state", "tenant_id", "error", "since", "until", "ids"))


@dataclass(frozen=True)
class BulkPreview:
    """What a bulk action would do now: how many jobs, a sample of them, and the exact filter."""

    action: BulkAction
    filter: dict[str, Any]
    states: tuple[JobState, ...]
    count: int
    sample: list[JobRecord]


@dataclass(frozen=True)
class BulkOutcome:
    """What a bulk action did. ``matched``: jobs that matched when it started; ``touched``: jobs it
    changed; ``left``: jobs still matching at the end that it could not act on (a retry whose key a
    live job holds, a row locked throughout); ``status``: ``completed`` or ``interrupted``."""

    action: BulkAction
    filter: dict[str, Any]
    states: tuple[JobState, ...]
    matched: int
    touched: int
    left: int
    batches: int
    audit_id: str
    status: str

    def to_json(self) -> dict[str, Any]:
        """The outcome as plain JSON (``--json``)."""
        return {"action": self.action, "filter": self.filter, "states": list(self.states), "matched": self.matched,
                "touched": self.touched, "left": self.left, "batches": self.batches, "audit_id": self.audit_id,
                "status": self.status}


def _checked(action: BulkAction, flt: JobFilter, everything: bool) -> tuple[JobFilter, tuple[JobState, ...]]:
    validate_filter(flt)
    if _is_unbounded(flt) and not everything:
        raise ConfigError(f"{action} was given no filter: it would act on every job",
                          "narrow it (--queue, --name, --state, --error, --since, --ids ...) or say --all",
                          code="X_BULK_NO_FILTER")
    states = action_states(action, flt)
    return replace(flt, state=None), states


def preview(driver: JobDriver, action: BulkAction, flt: JobFilter, *, sample: int = 10,
            everything: bool = False) -> BulkPreview:
    """Count what ``action`` would touch under ``flt`` and show a sample; changes nothing."""
    checked, states = _checked(action, flt, everything)
    count = driver.introspect.count(checked, states)
    shown: list[JobRecord] = []
    for state in states:
        if len(shown) >= sample:
            break
        shown += driver.introspect.list(replace(checked, state=state, limit=sample - len(shown)))
    return BulkPreview(action=action, filter=filter_json(flt), states=states, count=count, sample=shown[:sample])


def bulk(driver: JobDriver, action: BulkAction, flt: JobFilter, *, actor: str | None = None,
         reason: str | None = None, batch_size: int = DEFAULT_BATCH, everything: bool = False,
         on_batch: Callable[[int, int], None] | None = None, sleep: Callable[[float], None] = time.sleep,
         ) -> BulkOutcome:
    """Run ``action`` (``retry``, ``cancel`` or ``delete``) over every job ``flt`` selects, in
    batches of ``batch_size``; ``on_batch(touched_so_far, matched)`` after each batch.

    ``reason`` is the ``last_error`` a cancel writes. An exception (Ctrl-C included) closes the
    audit entry as ``interrupted`` and propagates; running the same call again finishes the work.
    """
    if not 1 <= batch_size <= 10_000:
        raise ConfigError(f"batch size {batch_size!r} is outside 1..10000", "use a few hundred to a few thousand",
                          code="X_BULK_BATCH")
    checked, states = _checked(action, flt, everything)
    who = actor or default_actor()
    matched = driver.introspect.count(checked, states)
    entry = driver.audit.open(who, action, filter_json(flt))
    # A retried job that dies again while this runs must not be retried twice by it.
    as_of = driver.clock.now() if action == "retry" else None
    touched = batches = 0
    chunks: Sequence[JobFilter] = [checked]
    if checked.ids is not None:
        ids = checked.ids
        chunks = [replace(checked, ids=ids[i:i + _ID_CHUNK]) for i in range(0, len(ids), _ID_CHUNK)]
    left = 0
    try:
        for chunk in chunks:
            after, rounds = "", 0
            while True:
                batch = driver.bulk(BulkRequest(action=action, filter=chunk, states=states, limit=batch_size,
                                                after=after, as_of=as_of, audit_id=entry.id, reason=reason))
                batches += 1
                touched += len(batch.touched)
                if on_batch is not None:
                    on_batch(touched, max(matched, touched))
                if batch.last_id is not None:
                    after = batch.last_id
                    continue
                remaining = driver.introspect.count(chunk, states, as_of)
                if remaining == 0 or rounds >= _LOCKED_ROUNDS:
                    left += remaining
                    break
                rounds += 1
                after = ""
                sleep(_LOCKED_WAIT)
    except BaseException:
        driver.audit.close(entry.id, "interrupted")
        raise
    driver.audit.close(entry.id, "completed")
    return BulkOutcome(action=action, filter=filter_json(flt), states=states, matched=matched, touched=touched,
                       left=left, batches=batches, audit_id=entry.id, status="completed")


def error_groups(driver: JobDriver, flt: JobFilter) -> list[ErrorGroup]:
    """Jobs under ``flt`` grouped by error (code and first line), largest group first."""
    validate_filter(flt)
    return driver.introspect.error_groups(flt)


def pause_queue(driver: JobDriver, queue: str, *, actor: str | None = None) -> bool:
    """Pause ``queue`` (persisted; every worker stops claiming from it at its next claim); whether
    it changed. Running attempts finish; enqueue is still accepted."""
    return driver.queues.pause(_queue_name(queue), actor or default_actor())


def resume_queue(driver: JobDriver, queue: str, *, actor: str | None = None) -> bool:
    """Resume ``queue`` and wake the workers that serve it; whether it changed."""
    return driver.queues.resume(_queue_name(queue), actor or default_actor())


def queue_overview(driver: JobDriver, *, window: float = 3600.0) -> list[QueueInfo]:
    """Every queue: paused or not, counts, the oldest due job's age, the last ``window``'s outcomes."""
    return driver.queues.overview(window)


def _queue_name(queue: str) -> str:
    validate_filter(JobFilter(queue=queue))
    return queue


def audit_log(driver: JobDriver, *, limit: int = 100, action: str | None = None) -> list[AuditEntry]:
    """The newest ``limit`` audit entries (of ``action``)."""
    if action is not None and action not in ("retry", "cancel", "delete", "pause", "resume"):
        raise ConfigError(f"unknown audit action {action!r}", "use retry, cancel, delete, pause or resume",
                          code="X_AUDIT_ACTION")
    return driver.audit.list(limit, cast(AuditAction | None, action))
