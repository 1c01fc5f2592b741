"""Driver-agnostic helpers for the contract suite."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.protocol import (
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    JobDriver,
    JobRecord,
    NackRequest,
)


def request(name: str = "task", payload: dict[str, Any] | None = None, **fields: Any) -> EnqueueRequest:
    """An :class:`EnqueueRequest` with an empty payload unless one is given."""
    return EnqueueRequest(name=name, payload={} if payload is None else payload, **fields)


def enqueue(
    driver: JobDriver, name: str = "task", payload: dict[str, Any] | None = None, **fields: Any
) -> EnqueueResult:
    """Enqueue one job built by :func:`request`."""
    return driver.enqueue(request(name, payload, **fields))


def claim(driver: JobDriver, worker: str = "w1", limit: int = 1, **fields: Any) -> list[ClaimedJob]:
    """Claim up to ``limit`` jobs for ``worker``."""
    return driver.claim(ClaimRequest(worker_id=worker, limit=limit, **fields))


def claim_one(driver: JobDriver, worker: str = "w1", **fields: Any) -> ClaimedJob:
    """Claim exactly one job, failing the test when none (or more) came back."""
    claimed = claim(driver, worker, limit=1, **fields)
    assert len(claimed) == 1, f"expected one claimable job, got {len(claimed)}"
    return claimed[0]


def enqueue_and_claim(
    driver: JobDriver, worker: str = "w1", *, visibility_timeout: float = 30.0, **fields: Any
) -> ClaimedJob:
    """Enqueue one job (``fields`` go to the request) and claim it; no other job may be runnable."""
    result = enqueue(driver, **fields)
    claimed = claim_one(driver, worker, visibility_timeout=visibility_timeout)
    assert claimed.job.id == result.id
    return claimed


def get(driver: JobDriver, job_id: str) -> JobRecord:
    """The job's record, failing the test when it does not exist."""
    record = driver.introspect.get(job_id)
    assert record is not None, f"job {job_id} is gone"
    return record


def at(seconds: float) -> datetime:
    """Epoch seconds as the aware UTC datetime records carry."""
    return to_datetime(seconds)


def is_uuid(value: str) -> bool:
    """Whether ``value`` is the canonical text of a UUID."""
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def retry_later(delay: float = 0.0, error: str | None = "boom") -> NackRequest:
    """A counted failure put back ``delay`` seconds from now."""
    return NackRequest(error=error, delay=delay)


def suspend(delay: float) -> NackRequest:
    """A suspension (``step.sleep``): does not burn an attempt."""
    return NackRequest(delay=delay, counts_as_attempt=False)


def dead_letter(error: str = "fatal") -> NackRequest:
    """End the job as ``dead``."""
    return NackRequest(error=error, dead_letter=True)


class Wakeups:
    """A subscriber that records the queues it was woken for and lets a test wait for one.

    Drivers with LISTEN/NOTIFY may deliver from another thread, so tests wait on an event
    (which returns at once for the synchronous memory driver) rather than sleeping.
    """

    def __init__(self) -> None:
        self.queues: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, queue: str) -> None:
        with self._cond:
            self.queues.append(queue)
            self._cond.notify_all()

    def wait_for(self, queue: str, timeout: float = 5.0) -> bool:
        """Whether ``queue`` was (or gets, within ``timeout`` real seconds) woken."""
        with self._cond:
            return self._cond.wait_for(lambda: queue in self.queues, timeout)

    def clear(self) -> None:
        """Forget what was seen so far."""
        with self._cond:
            self.queues.clear()


class Backdoor:
    """Writes the public API cannot make, for states the contract must survive anyway."""

    def __init__(self, driver: JobDriver, sqlite_path: Path) -> None:
        self._driver = driver
        self._sqlite_path = sqlite_path

    def set_attempt(self, job_id: str, attempt: int) -> None:
        """Force a job's ``attempt`` column."""
        self._set(job_id, "attempt", attempt)

    def set_run_at(self, job_id: str, run_at: datetime) -> None:
        """Move a job's ``run_at``, as a write the driver is not told of."""
        self._set(job_id, "run_at", run_at)

    def _set(self, job_id: str, column: str, value: Any) -> None:
        if self._driver.name == "memory":
            memory: Any = self._driver  # its private store, on purpose: no public API writes these
            store = memory._store
            with store.lock:
                record = store.jobs[job_id]
                setattr(record, column, value.timestamp() if isinstance(value, datetime) else value)
        elif self._driver.name == "sqlite":
            file = sqlite3.connect(self._sqlite_path)
            try:
                stored = value.timestamp() if isinstance(value, datetime) else value
                file.execute(f"UPDATE x_jobs SET {column} = ? WHERE id = ?", (stored, job_id))
                file.commit()
            finally:
                file.close()
        elif self._driver.name == "postgres":
            import psycopg
            from psycopg import sql

            with psycopg.connect(self._driver.url, autocommit=True) as conn:
                conn.execute(sql.SQL("UPDATE x_jobs SET {} = %s WHERE id = %s").format(sql.Identifier(column)),
                             (value, job_id))
        else:
            import pytest

            pytest.skip(f"no backdoor into a {self._driver.name!r} driver's storage: this test forces a state the "
                        "public API cannot make")
