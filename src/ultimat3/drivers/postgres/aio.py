"""Async enqueue on PostgreSQL: in a caller's async transaction, or on the driver's async pool.

A caller's connection may be a ``psycopg.AsyncConnection``, an ``asyncpg.Connection``, or a
SQLAlchemy ``AsyncConnection``/``AsyncSession`` on ``postgresql+psycopg`` or ``postgresql+asyncpg``.
Each job is one ``enqueue`` statement (the same SQL as the sync path; for asyncpg its named
parameters are turned into ``$n`` once, at import), so dedupe, the NOTIFY and its timing (delivered
at the caller's commit, never before) are exactly the sync form's. Several jobs are atomic under a
savepoint, so a failure undoes only ours and the caller's transaction stays theirs.

Without a connection the driver uses a ``psycopg_pool.AsyncConnectionPool`` of its own, one per
event loop (a pool belongs to the loop that opened it): no thread hop, no blocked loop.
``await driver.aclose()`` closes the pool of the running loop; ``close()`` closes the others whose
loop can still run them.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.postgres.rows import _Q, _RACE_RETRIES
from ultimat3.drivers.protocol import EnqueueResult

if TYPE_CHECKING:
    from ultimat3.drivers.postgres.driver import PostgresDriver, _Staged

__all__ = ["AsyncPools", "dollar_query", "enqueue_on_async", "enqueue_on_pooled"]

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


async def enqueue_on_pooled(conn: psycopg.AsyncConnection[Any], staged: Sequence[_Staged], channel: str, *,
                            retrying: bool = False) -> list[EnqueueResult]:
    """Write ``staged`` in one transaction on a connection of the driver's own async pool. With
    ``retrying`` (the last try lost its connection) the jobs are looked up first: a commit whose
    reply was lost left all of them there, and they are not written twice."""
    if retrying:
        async with conn.cursor() as cur:
            await cur.execute(_Q["jobs_by_ids"], {"ids": [item.id for item in staged]}, prepare=False)
            found = {row[0]: row[1] for row in await cur.fetchall()}
        if found:
            return [EnqueueResult(id=item.id, run_id=found.get(item.id, item.run_id), deduped=False)
                    for item in staged]
    return await _on_psycopg(conn, staged, channel)


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
        out = []
        async with conn.cursor() as cur:
            for item in staged:
                params = {**item.params, "channel": channel}
                for _ in range(_RACE_RETRIES):
                    # Never a named prepared statement on a caller's connection (it may be pooled).
                    await cur.execute(_Q["enqueue"], params, prepare=False)
                    result = _result(await cur.fetchone(), item)
                    if result is not None:
                        out.append(result)
                        break
                else:
                    raise _race_lost(item)
        return out

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
                raise _race_lost(item)
    return out


def _race_lost(item: _Staged) -> DriverError:
    return DriverError(
        f'enqueue of "{item.request.name}" kept colliding with live jobs that finished before they could be read',
        "enqueue it again", code="X_DRIVER_RACE")


class AsyncPools:
    """One ``AsyncConnectionPool`` per event loop, opened on first use."""

    def __init__(self, conninfo: str, *, max_size: int, name: str) -> None:
        self._conninfo = conninfo
        self._max_size = max_size
        self._name = name
        self._lock = threading.Lock()
        self._pools: dict[asyncio.AbstractEventLoop, AsyncConnectionPool[Any]] = {}

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
                loop.create_task(pool.close())
            elif loop.is_running():
                future = asyncio.run_coroutine_threadsafe(pool.close(), loop)
                try:
                    future.result(timeout=5.0)
                except Exception:  # the loop is the caller's: never wait on it forever
                    continue
            else:
                loop.run_until_complete(pool.close())
