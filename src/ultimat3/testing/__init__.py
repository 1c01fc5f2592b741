"""A test kit for apps: test your own jobs without a database or a worker process.

- :class:`MemoryDriver` — the in-memory driver (it passes the same contract suite as SQLite and
  PostgreSQL), on a :class:`ManualClock` you move instead of sleeping;
- :func:`isolated_registry` — declare jobs inside a test without touching the app's registry;
- :func:`run_job` — enqueue one run and drive it to a final state inline, returning its row;
- :func:`drain` — run everything runnable now on a driver.

The driver contract suite for a third-party driver is :mod:`ultimat3.testing.contract` (needs
pytest: ``pip install ultimat3[testing]``). Nothing here imports pytest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from ultimat3.core.clock import ManualClock
from ultimat3.core.context import Environment
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.drivers.protocol import JobDriver, JobRecord
from ultimat3.jobs.job import JobHandle, isolated_registry
from ultimat3.jobs.worker import Worker
from ultimat3.tenancy.grants import operator_context

__all__ = ["ManualClock", "MemoryDriver", "drain", "isolated_registry", "memory_driver", "run_job"]

M = TypeVar("M", bound=BaseModel)


def memory_driver(clock: ManualClock | None = None) -> MemoryDriver:
    """A migrated, empty memory driver on ``clock`` (a fresh :class:`ManualClock` by default)."""
    driver = MemoryDriver(clock=clock or ManualClock())
    driver.migrate()
    return driver


def drain(driver: JobDriver, *, environment: Environment = "test", concurrency: int = 1,
          max_jobs: int | None = None) -> int:
    """Run every job runnable now (and what they enqueue, if runnable now) until none is left;
    returns how many attempts ran. Not inside a running event loop (it runs its own)."""
    worker = Worker(driver, environment=environment, concurrency=concurrency)
    try:
        return asyncio.run(worker.drain(max_jobs=max_jobs))
    finally:
        worker.close()


def run_job(handle: JobHandle[M], input: M | Mapping[str, Any] | None = None, *,
            driver: JobDriver | None = None, environment: Environment = "test") -> JobRecord:
    """Enqueue one run of ``handle`` (as an operator, so any org's job may be enqueued) and run it
    inline until nothing is runnable now; returns its row. A run that retries later, sleeps or
    waits is returned in that state: move the driver's clock and call :func:`drain` again."""
    target = driver if driver is not None else memory_driver()
    with operator_context("test", f"run_job({handle.name})"):
        queued = handle.enqueue(input, driver=target)
    drain(target, environment=environment)
    row = target.introspect.get(queued.id)
    assert row is not None, f"job {queued.id} vanished"
    return row
