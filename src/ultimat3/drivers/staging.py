"""An enqueue request turned into the column values of its row, written once for every driver.

Staging validates the request (:func:`~ultimat3.drivers.values.check_request`: every rule and
limit, the payload serialised ONCE) and mints the ids before any lock is taken; the time-dependent
half (``state``, ``run_at``, ``now``) is filled in under the lock, from the driver's clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ultimat3.drivers.errors import JobDuplicateError
from ultimat3.drivers.protocol import EnqueueRequest
from ultimat3.drivers.values import check_request

__all__ = ["StagedJob", "new_ids", "stage", "stage_many"]


@dataclass(frozen=True, slots=True)
class StagedJob:
    """A validated request with its ids and its payload as JSON text."""

    request: EnqueueRequest
    id: str
    run_id: str
    payload: str

    def run_at(self, now: float) -> float:
        """When it may first run (epoch seconds), staged at ``now``: its own ``run_at`` or now."""
        return now if self.request.run_at is None else self.request.run_at

    def state(self, now: float) -> str:
        """Its first state, staged at ``now``: ``delayed`` until its ``run_at``, else ``ready``."""
        return "delayed" if self.run_at(now) > now else "ready"

    def columns(self, now: float) -> dict[str, Any]:
        """The row's values at ``now`` (epoch seconds), by the parameter names every dialect's
        ``job_insert`` uses. Times are epoch seconds; a dialect converts what it stores otherwise."""
        request = self.request
        return {
            "id": self.id,
            "run_id": self.run_id,
            "name": request.name,
            "queue": request.queue,
            "payload": self.payload,
            "state": self.state(now),
            "priority": request.priority,
            "max_attempts": request.max_attempts,
            "run_at": self.run_at(now),
            "idempotency_key": request.idempotency_key,
            "tenant_id": request.tenant_id,
            "traceparent": request.traceparent,
            "enqueued_by": request.enqueued_by,
            "flow_key": request.flow_key,
            "flow_max": request.flow_max,
            "rate_key": request.rate_key,
            "rate_per_second": request.rate_per_second,
            "rate_burst": request.rate_burst,
            "now": now,
        }

    def duplicate(self, existing_id: str) -> JobDuplicateError:
        """The error for ``on_conflict='error'`` when ``existing_id`` holds this job's key."""
        assert self.request.idempotency_key is not None
        return JobDuplicateError(self.request.name, self.request.idempotency_key, existing_id)


def new_ids(count: int, *, millis: int | None = None) -> list[str]:
    """``count`` time-ordered (version 7, RFC 9562) UUIDs as text, ascending within the call.

    48 bits of Unix milliseconds, then a 12-bit sequence that orders a batch (a batch past 4,096
    ids steps the millisecond), then 62 random bits from one read of the OS's random source. Time
    order is what the indexes need: a job's id and run id land beside the ones written just
    before them, at the right edge of each btree, instead of on a random page of an index that
    grows with every job kept (and the jobs a claim takes together sit on the same pages). They
    name rows; they are not secrets (claim tokens are, and stay fully random). ``millis``: the
    timestamp to use instead of the wall clock's (ids order rows, not events; no driver clock).
    """
    if millis is None:
        millis = time.time_ns() // 1_000_000
    raw = bytearray(os.urandom(16 * count))
    ids = []
    for index, start in enumerate(range(0, 16 * count, 16)):
        step, sequence = divmod(index, 4096)
        raw[start:start + 6] = (millis + step).to_bytes(6, "big")
        raw[start + 6] = 0x70 | sequence >> 8  # version 7, then the sequence's high 4 bits
        raw[start + 7] = sequence & 0xFF
        raw[start + 8] = raw[start + 8] & 0x3F | 0x80  # RFC variant
        h = raw[start:start + 16].hex()
        ids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return ids


def stage(request: EnqueueRequest) -> StagedJob:
    """Validate ``request`` and mint its ids; refused (coded) before anything is written."""
    return stage_many([request])[0]


def stage_many(requests: Sequence[EnqueueRequest]) -> list[StagedJob]:
    """:func:`stage` for a batch, every request validated before any is written, ids minted in bulk."""
    ids = new_ids(2 * len(requests))
    storable: set[Any] = set()  # what the batch's requests share is checked once
    return [StagedJob(request, ids[2 * i], ids[2 * i + 1], check_request(request, storable))
            for i, request in enumerate(requests)]
