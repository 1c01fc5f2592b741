"""Async enqueue on PostgreSQL: in a caller's async transaction, or on the driver's async pool.

A caller's connection may be a ``psycopg.AsyncConnection``, an ``asyncpg.Connection``, or a
SQLAlchemy ``AsyncConnection``/``AsyncSession`` on ``postgresql+psycopg`` or ``postgresql+asyncpg``.
Each job is one ``enqueue`` statement (the same SQL as the sync path; for asyncpg its named
parameters are turned into ``$n`` once, at import), so dedupe, the NOTIFY and its timing (delivered
at the caller's commit, never before) are exactly the sync form's. Several jobs are atomic under a
savepoint, so a failure undoes only ours and the caller's transaction stays theirs.

Without a connection the driver uses a ``psycopg_pool.AsyncConnectionPool`` of its own, one per
event loop (a pool belongs to the loop that opened it): no thread hop, no blocked loop. Single-job
calls are group-committed (:class:`AsyncBatcher`): the calls that arrive while one batch is being
written go together in the next, one ``enqueue_many`` statement and one commit for all of them.
``await driver.aclose()`` closes the pool of the running loop; ``close()`` closes the others whose
loop can still run them.
"""

from __future__ import annotations

import asyncio
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.postgres.batch import batch_steps, drive_async, race_lost
from ultimat3.drivers.postgres.rows import _Q, _RACE_RETRIES
from ultimat3.drivers.protocol import EnqueueResult

if TYPE_CHECKING:
    from ultimat3.drivers.postgres.driver import PostgresDriver, _Staged

__all__ = ["AsyncBatcher", "AsyncPools", "dollar_query", "enqueue_on_async"]

_NAMED = re.compile(r"%\((\w+)\)s")
ACCEPTED = ("a psycopg.AsyncConnection, an asyncpg.Connection, or a SQLAlchemy AsyncConnection / AsyncSession on a "
            "postgresql+psycopg or postgresql+asyncpg engine")


def dollar_query(sql: str) -> tuple[str, list[str]]:
    """``sql`` with psycopg's ``%(name)s`` turned into asyncpg's ``$n``, and the names in ``$n`` order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _NAMED.sub(number, sql), names


_ENQUEUE_DOLLAR, _ENQUEUE_NAMES = dollar_query(_Q["enqueue"])


async def _raw(connection: Any) -> Any:
    """The DB-API (async) connection behind ``connection``, in a transaction the caller ends."""
    module = type(connection).__module__
    if module.startswith("sqlalchemy."):
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(connection, AsyncSession):
            connection = await connection.connection()  # begins the session's transaction
        if isinstance(connection, AsyncConnection):
            if not connection.in_transaction():
                # What its first execute would do: the caller's commit() then covers the job.
                await connection.begin()
            driver_connection: Any = (await connection.get_raw_connection()).driver_connection
            if type(driver_connection).__module__.startswith("asyncpg") and not driver_connection.is_in_transaction():
                # SQLAlchemy's asyncpg adapter opens the server transaction at its first statement;
                # without one, ours would commit on its own instead of with the caller's.
                await connection.exec_driver_sql("SELECT 1")
            return driver_connection
    return connection


async def enqueue_on_async(driver: PostgresDriver, connection: Any, staged: Sequence[_Staged]) -> list[EnqueueResult]:
    """Write ``staged`` inside the caller's async transaction (savepointed when several)."""
    raw = await _raw(connection)
    if isinstance(raw, psycopg.AsyncConnection):
        return await _on_psycopg(raw, staged, driver.channel)
    if type(raw).__module__.startswith("asyncpg"):
        return await _on_asyncpg(raw, staged, driver.channel)
    raise DriverError(
        f"cannot enqueue inside a {type(connection).__module__}.{type(connection).__qualname__}",
        f"pass {ACCEPTED}, in the transaction the job must commit with (a sync connection goes to enqueue())",
        code="X_DRIVER_CONNECTION",
    )


def _result(row: Sequence[Any] | None, staged: _Staged) -> EnqueueResult | None:
    if row is None:
        return None
    job_id, run_id, deduped = row[0], row[1], row[2]
    if deduped and staged.request.on_conflict == "error":
        raise staged.duplicate(job_id)
    return EnqueueResult(id=job_id, run_id=run_id, deduped=deduped)


async def _on_psycopg(conn: psycopg.AsyncConnection[Any], staged: Sequence[_Staged],
                      channel: str) -> list[EnqueueResult]:
    async def write() -> list[EnqueueResult]:
        # The sync enqueue_many's statements (batch_steps), never prepared on a caller's connection.
        async with conn.cursor() as cur:
            return await drive_async(cur, batch_steps(staged, channel, retrying=False))

    if conn.autocommit:
        async with conn.transaction():
            return await write()
    if len(staged) == 1:
        return await write()
    async with conn.cursor() as cur:
        await cur.execute("SAVEPOINT x_enqueue")
    try:
        results = await write()
    except BaseException:
        async with conn.cursor() as cur:
            await cur.execute("ROLLBACK TO SAVEPOINT x_enqueue")
            await cur.execute("RELEASE SAVEPOINT x_enqueue")
        raise
    async with conn.cursor() as cur:
        await cur.execute("RELEASE SAVEPOINT x_enqueue")
    return results


async def _on_asyncpg(conn: Any, staged: Sequence[_Staged], channel: str) -> list[EnqueueResult]:
    out = []
    # asyncpg nests transaction() as a savepoint inside the caller's, or opens one when there is none.
    async with conn.transaction():
        for item in staged:
            values = {**item.params, "payload": item.staged.payload, "channel": channel}
            args = [values[name] for name in _ENQUEUE_NAMES]
            for _ in range(_RACE_RETRIES):
                result = _result(await conn.fetchrow(_ENQUEUE_DOLLAR, *args), item)
                if result is not None:
                    out.append(result)
                    break
            else:
                raise race_lost(item.request)
    return out


class AsyncPools:
    """One ``AsyncConnectionPool`` per event loop, opened on first use."""

    def __init__(self, conninfo: str, *, max_size: int, name: str) -> None:
        self._conninfo = conninfo
        self._max_size = max_size
        self._name = name
        self._lock = threading.Lock()
        self._pools: dict[asyncio.AbstractEventLoop, AsyncConnectionPool[Any]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    async def get(self) -> AsyncConnectionPool[Any]:
        """The running loop's pool."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._pools.get(loop)
            if pool is None:
                pool = AsyncConnectionPool(self._conninfo, min_size=1, max_size=self._max_size, open=False,
                                           kwargs={"autocommit": True, "prepare_threshold": None},
                                           name=f"{self._name}-async", timeout=10.0)
                self._pools[loop] = pool
        if pool.closed:
            await pool.open(wait=False)
        return pool

    async def aclose(self) -> None:
        """Close the running loop's pool."""
        with self._lock:
            pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    def close(self) -> None:
        """Close every pool whose loop can still run its close (the others went with their loop)."""
        with self._lock:
            pools, self._pools = self._pools, {}
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, pool in pools.items():
            if loop.is_closed():
                continue
            if loop is current:
                # Called from async code without aclose(): we cannot wait here, so close in the loop.
                self._closing.add(task := loop.create_task(pool.close()))
                task.add_done_callback(self._closing.discard)
            elif loop.is_running():
                future = asyncio.run_coroutine_threadsafe(pool.close(), loop)
                try:
                    future.result(timeout=5.0)
                except Exception:  # the loop is the caller's: never wait on it forever
                    continue
            else:
                loop.run_until_complete(pool.close())


@dataclass
class _Call:
    staged: Sequence[_Staged]
    future: asyncio.Future[list[EnqueueResult]]


@dataclass
class _LoopBatches:
    pending: list[_Call] = field(default_factory=list)
    writing: bool = False
    #: The flush running now (held here: the loop keeps only a weak reference to its tasks).
    task: asyncio.Task[None] | None = None


class AsyncBatcher:
    """Group commit of async enqueues on the driver's pool, per event loop (see the module docstring).

    A call of several jobs, or one that must raise on a duplicate, is written alone (its own
    transaction: all or nothing, its own error); the others share batches of up to ``max_batch``.
    """

    def __init__(self, pools: AsyncPools, channel: str, *, max_batch: int = 50) -> None:
        self._pools = pools
        self._channel = channel
        self._max_batch = max_batch
        # Weak: a loop that ended takes its (empty) batch state with it.
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopBatches] = weakref.WeakKeyDictionary()

    async def submit(self, staged: Sequence[_Staged]) -> list[EnqueueResult]:
        """Write ``staged``; resolves once its transaction has committed."""
        if len(staged) != 1 or staged[0].request.on_conflict == "error":
            return await self._write(staged)
        loop = asyncio.get_running_loop()
        state = self._loops.setdefault(loop, _LoopBatches())
        call = _Call(staged, loop.create_future())
        state.pending.append(call)
        if not state.writing:
            state.writing = True
            state.task = loop.create_task(self._flush(state))
        return await call.future

    async def _flush(self, state: _LoopBatches) -> None:
        try:
            while state.pending:
                calls, state.pending = state.pending[: self._max_batch], state.pending[self._max_batch:]
                try:
                    results = await self._write([call.staged[0] for call in calls])
                except BaseException as error:  # every call of the batch learns why
                    for call in calls:
                        if not call.future.done():
                            call.future.set_exception(error)
                    if not isinstance(error, Exception):
                        raise
                    continue
                for call, result in zip(calls, results, strict=True):
                    if not call.future.done():
                        call.future.set_result([result])
        finally:
            state.writing = False

    async def _write(self, staged: Sequence[_Staged]) -> list[EnqueueResult]:
        pool = await self._pools.get()
        try:
            async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                return await drive_async(cur, batch_steps(staged, self._channel, retrying=False))
        except psycopg.OperationalError:
            # The connection died (a restart): once more on a fresh one; the steps look up first
            # whether the lost try committed.
            async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                return await drive_async(cur, batch_steps(staged, self._channel, retrying=True))
