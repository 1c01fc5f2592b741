"""A worker inside an ASGI app's own process and event loop (FastAPI, Starlette), for small
deployments that do not want a second process::

    @asynccontextmanager
    async def lifespan(app):
        async with run_worker(driver, concurrency=4):
            yield

    app = FastAPI(lifespan=lifespan)

The worker claims and runs jobs while the app serves requests; at shutdown it stops claiming and
gives running attempts ``grace_period`` seconds, exactly as ``x worker`` does on SIGTERM. Async
handlers share the app's loop (keep them non-blocking); sync handlers run in the worker's threads.
Nothing here imports a web framework.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ultimat3.drivers.protocol import JobDriver
from ultimat3.jobs.worker import Worker

__all__ = ["run_worker"]


@asynccontextmanager
async def run_worker(driver: JobDriver, **options: Any) -> AsyncIterator[Worker]:
    """Run a :class:`~ultimat3.jobs.Worker` (``options`` as its keyword arguments) on the running
    loop for the block; on exit stop it gracefully and wait for it. A worker that fails on its own
    (its id taken by a live worker, say) re-raises here at exit."""
    worker = Worker(driver, **options)
    task = asyncio.ensure_future(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await task
