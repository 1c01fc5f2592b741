"""What every driver's worker registry shares: its errors, and the text a rescued job carries."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.protocol import WORKER_LOST

__all__ = ["LOST_PREFIX", "LOST_SUFFIX", "id_taken", "liveness_key", "lost_error", "running_by_worker",
           "unknown_worker"]


#: ``last_error`` of a rescued job is ``LOST_PREFIX + worker id + LOST_SUFFIX`` (SQL builds it too).
LOST_PREFIX = f"{WORKER_LOST} ("
LOST_SUFFIX = "); the attempt counts and the job is ready again"


def lost_error(worker_id: str) -> str:
    """``last_error`` of a job rescued from dead worker ``worker_id``."""
    return f"{LOST_PREFIX}{worker_id}{LOST_SUFFIX}"


def running_by_worker(pairs: Iterable[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    """``(claimed_by, job id)`` pairs of running jobs, in order, as job ids per worker."""
    grouped: dict[str, list[str]] = {}
    for worker_id, job_id in pairs:
        grouped.setdefault(worker_id, []).append(job_id)
    return {worker_id: tuple(ids) for worker_id, ids in grouped.items()}


def liveness_key(worker_id: str) -> str:
    """A short, file-name-safe key for ``worker_id`` (lock file names)."""
    return hashlib.sha256(worker_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def id_taken(worker_id: str) -> DriverError:
    """A live worker already holds ``worker_id``."""
    return DriverError(
        f"worker id {worker_id!r} is held by a live worker",
        "give each worker process its own id (leave worker_id out and one is made up)",
        code="X_WORKER_ID_TAKEN",
    )


def unknown_worker(worker_id: str) -> DriverError:
    """``beat`` for a worker this registry never registered."""
    return DriverError(
        f"worker {worker_id!r} was not registered through this driver",
        "call driver.workers.register(info) first",
        code="X_WORKER_UNKNOWN",
    )
