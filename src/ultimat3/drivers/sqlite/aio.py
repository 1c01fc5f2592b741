"""Async enqueue on SQLite: in a caller's ``sqlite+aiosqlite`` transaction, or through one writer.

A caller's SQLAlchemy ``AsyncConnection``/``AsyncSession`` over aiosqlite gets the jobs written on
its own connection (aiosqlite's thread), inside its transaction, with the same statements and
dedupe as the sync path; the driver's workers in this process are woken when that transaction
commits (SQLAlchemy's ``commit`` event), not before.

Without a connection, :class:`AsyncWriter` hands the calls of every event loop to one writer thread
per driver, which writes everything pending in ONE ``BEGIN IMMEDIATE`` transaction (each call under
its own savepoint, so one refused call fails alone) and resolves the callers' futures: no thread hop
per job, one commit for a burst of concurrent calls, and the loop is never blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ultimat3.drivers.errors import DriverError, JobDuplicateError
from ultimat3.drivers.protocol import EnqueueResult
from ultimat3.drivers.sqlite.rows import QUERIES
from ultimat3.drivers.staging import StagedJob

if TYPE_CHECKING:
    from ultimat3.drivers.sqlite.driver import SqliteDriver

__all__ = ["AsyncWriter", "enqueue_on_async"]

#: Calls written per transaction by the writer (the rest go in the next one, at once).
MAX_BATCH = 50
ACCEPTED = "a SQLAlchemy AsyncConnection or AsyncSession on a sqlite+aiosqlite engine over the driver's file"


async def enqueue_on_async(driver: SqliteDriver, connection: Any, jobs: Sequence[StagedJob]) -> list[EnqueueResult]:
    """Write ``jobs`` inside the caller's aiosqlite transaction (savepointed when several)."""
    module = type(connection).__module__
    raw: Any = None
    sync_connection: Any = None
    if module.startswith("sqlalchemy."):
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(connection, AsyncSession):
            connection = await connection.connection()
        if isinstance(connection, AsyncConnection):
            if not connection.in_transaction():
                await connection.begin()
            raw = (await connection.get_raw_connection()).driver_connection
            sync_connection = connection.sync_connection
    if raw is None or not type(raw).__module__.startswith("aiosqlite"):
        raise DriverError(
            f"the SQLite driver cannot enqueue inside a {type(connection).__module__}."
            f"{type(connection).__qualname__}",
            f"pass {ACCEPTED} (a sync sqlite3 or SQLAlchemy Connection goes to enqueue())",
            code="X_DRIVER_CONNECTION",
        )
    cursor = await raw.execute(QUERIES["database_file"])
    row = await cursor.fetchone()
    file = row[0] if row is not None else ""
    if not file or _resolved(file) != driver._file:
        raise DriverError(f"the connection is open on {file or 'an in-memory database'!r}, not on {driver._file!r}",
                          "open the engine on the driver's file so the job commits with your transaction",
                          code="X_DRIVER_CONNECTION")
    now = driver.clock.now()
    several = len(jobs) > 1
    if several:
        await raw.execute("SAVEPOINT x_enqueue_many")
    try:
        results = [await _insert_async(raw, job, now) for job in jobs]
    except BaseException:
        if several:
            await raw.execute("ROLLBACK TO SAVEPOINT x_enqueue_many")
            await raw.execute("RELEASE SAVEPOINT x_enqueue_many")
        raise
    if several:
        await raw.execute("RELEASE SAVEPOINT x_enqueue_many")
    queues = [job.request.queue for job, result in zip(jobs, results, strict=True) if not result.deduped]
    if queues and sync_connection is not None:
        from sqlalchemy import event

        # The workers of this process hear of the jobs when they can see them: at the commit.
        event.listen(sync_connection, "commit", lambda _conn: driver._notify(queues), once=True)
    return results


@functools.lru_cache(maxsize=64)
def _resolved(file: str) -> str:
    """``file`` with its symlinks resolved, once per path (a few stat calls, then from memory)."""
    return os.path.realpath(file)


async def _insert_async(raw: Any, job: StagedJob, now: float) -> EnqueueResult:
    cursor = await raw.execute(QUERIES["job_insert"], job.columns(now))
    key = job.request.idempotency_key
    if key is None or cursor.rowcount == 1:
        return EnqueueResult(job.id, job.run_id, False)
    cursor = await raw.execute(QUERIES["job_live_by_key"], {"name": job.request.name, "idempotency_key": key})
    live = await cursor.fetchone()
    if live is None:  # pragma: no cover - only a uuid4 primary-key collision gets here
        raise DriverError(f"job {job.id} could not be written", "enqueue it again", code="X_DRIVER")
    if job.request.on_conflict == "error":
        raise JobDuplicateError(job.request.name, key, live[0])
    return EnqueueResult(live[0], live[1], True)


@dataclass
class _Call:
    jobs: Sequence[StagedJob]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[EnqueueResult]]


class AsyncWriter:
    """One writer thread per driver for async enqueues without a connection (group commit)."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._pending: list[_Call] = []
        self._thread: threading.Thread | None = None
        self._closed = False

    async def submit(self, jobs: Sequence[StagedJob]) -> list[EnqueueResult]:
        """Queue ``jobs`` for the next group commit and wait for their results."""
        loop = asyncio.get_running_loop()
        call = _Call(jobs, loop, loop.create_future())
        with self._lock:
            if self._closed:
                # As the sync path reopens its connections after close(), a new call starts a new writer.
                self._closed = False
                self._thread = None
            self._pending.append(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ultimat3-sqlite-async-writer", daemon=True)
                self._thread.start()
            self._ready.notify()
        return await call.future

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending and self._closed:
                    return
                # Bounded: a long Python loop here holds the GIL the callers' event loop needs.
                calls, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self._write(calls)

    def _write(self, calls: list[_Call]) -> None:
        from ultimat3.drivers.sqlite.driver import _insert_jobs

        outcomes: list[list[EnqueueResult] | BaseException] = []

        def run(conn: sqlite3.Connection, now: float) -> None:
            outcomes.clear()
            for call in calls:
                conn.execute("SAVEPOINT x_async_call")
                try:
                    outcomes.append(_insert_jobs(conn, call.jobs, now))
                except Exception as error:  # this call fails alone; the others commit
                    conn.execute("ROLLBACK TO SAVEPOINT x_async_call")
                    outcomes.append(error)
                conn.execute("RELEASE SAVEPOINT x_async_call")

        try:
            self._driver._write(run)
        except BaseException as error:
            outcomes = [error] * len(calls)
        woken: list[str] = []
        for call, outcome in zip(calls, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                woken += [job.request.queue for job, result in zip(call.jobs, outcome, strict=True)
                          if not result.deduped]
            _resolve(call, outcome)
        if woken:
            self._driver._notify(woken)

    def close(self) -> None:
        """Finish what is pending, then stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._ready.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)


def _resolve(call: _Call, outcome: list[EnqueueResult] | BaseException) -> None:
    def settle() -> None:
        if call.future.done():
            return  # the caller was cancelled meanwhile; its jobs are written all the same
        if isinstance(outcome, BaseException):
            call.future.set_exception(outcome)
        else:
            call.future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the caller's loop ended meanwhile: nobody is waiting
        call.loop.call_soon_threadsafe(settle)
