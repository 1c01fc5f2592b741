"""Async enqueue: on the event loop without a connection, and inside the caller's ASYNC transaction
(SQLAlchemy async on every dialect the driver's database has, psycopg async, asyncpg): the jobs
exist if and only if that transaction commits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from ultimat3.core.errors import XError
from ultimat3.drivers.errors import JobDuplicateError
from ultimat3.drivers.protocol import JobDriver, JobFilter

from .helpers import Wakeups, request

#: Opens an async transaction on the driver's database as an app would, yielding what it passes
#: as ``connection=`` and a ``commit`` coroutine function.
AsyncTransaction = Callable[[], AbstractAsyncContextManager[tuple[Any, Callable[[], Any]]]]
KINDS = {
    "sqlite": ("sqlalchemy-aiosqlite", "sqlalchemy-aiosqlite-session"),
    "postgres": ("psycopg-async", "asyncpg", "sqlalchemy-psycopg", "sqlalchemy-asyncpg", "sqlalchemy-asyncpg-session"),
}


def _asyncpg_url(url: str) -> tuple[str, dict[str, str]]:
    """asyncpg takes no libpq ``options=``: ``-c name=value`` pairs become its ``server_settings``."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    settings: dict[str, str] = {}
    query = []
    for key, value in parse_qsl(parts.query):
        if key != "options":
            query.append((key, value))
            continue
        for item in value.split():
            name, _, setting = item.removeprefix("-c").partition("=")
            settings[name] = setting
    return urlunsplit(parts._replace(query=urlencode(query))), settings


def _sqlalchemy(url: str, *, session: bool) -> AsyncTransaction:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    connect_args: dict[str, Any] = {}
    if url.startswith("postgresql+asyncpg"):
        url, settings = _asyncpg_url(url)
        connect_args = {"server_settings": settings}

    @asynccontextmanager
    async def open_transaction() -> AsyncIterator[tuple[Any, Callable[[], Any]]]:
        engine = create_async_engine(url, connect_args=connect_args)
        try:
            if session:
                async with AsyncSession(engine) as s:
                    yield s, s.commit
            else:
                async with engine.connect() as conn:
                    await conn.begin()
                    yield conn, conn.commit
        finally:
            await engine.dispose()

    return open_transaction


def _psycopg(url: str) -> AsyncTransaction:
    import psycopg

    @asynccontextmanager
    async def open_transaction() -> AsyncIterator[tuple[Any, Callable[[], Any]]]:
        conn = await psycopg.AsyncConnection.connect(url)
        try:
            yield conn, conn.commit
        finally:
            await conn.close()

    return open_transaction


def _asyncpg(url: str) -> AsyncTransaction:
    asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is the extra ultimat3[asyncpg]")

    dsn, settings = _asyncpg_url(url)

    @asynccontextmanager
    async def open_transaction() -> AsyncIterator[tuple[Any, Callable[[], Any]]]:
        conn = await asyncpg.connect(dsn, server_settings=settings)
        tx = conn.transaction()
        await tx.start()
        done = False

        async def commit() -> None:
            nonlocal done
            await tx.commit()
            done = True

        try:
            yield conn, commit
        finally:
            if not done:
                await tx.rollback()
            await conn.close()

    return open_transaction


def _open(driver: JobDriver, kind: str) -> AsyncTransaction:
    if driver.name == "sqlite":
        return _sqlalchemy("sqlite+aiosqlite:///" + driver.url[len("sqlite:///"):], session=kind.endswith("session"))
    rest = driver.url[driver.url.index("://"):]
    if kind == "psycopg-async":
        return _psycopg(driver.url)
    if kind == "asyncpg":
        return _asyncpg("postgresql" + rest)
    dialect = "postgresql+psycopg" if kind == "sqlalchemy-psycopg" else "postgresql+asyncpg"
    return _sqlalchemy(dialect + rest, session=kind.endswith("session"))


@pytest.fixture
def async_transactions(driver: JobDriver) -> list[tuple[str, AsyncTransaction]]:
    """Every way an async app opens a transaction on the driver's database (by name), or an empty
    list for a driver that cannot join one. A third-party driver that can overrides this fixture."""
    if not driver.supports_transactional_enqueue:
        return []
    kinds = KINDS.get(driver.name)
    if kinds is None:
        pytest.fail(f"override `async_transactions`: the contract cannot open one on {driver.name!r}")
    return [(kind, _open(driver, kind)) for kind in kinds]


def _ids(driver: JobDriver) -> set[str]:
    return {job.id for job in driver.introspect.list()}


def _run(driver: JobDriver, coroutine: Any) -> Any:
    async def closed() -> Any:
        try:
            return await coroutine
        finally:
            await driver.aclose()

    return asyncio.run(closed())


def _refused(driver: JobDriver) -> None:
    with pytest.raises(XError) as caught:
        _run(driver, driver.aenqueue_many([request("atx.refused")], connection=object()))
    assert caught.value.code == "X_DRIVER_CONNECTION" and caught.value.hint
    assert _ids(driver) == set()


def test_async_commit_leaves_exactly_one_job(driver: JobDriver,
                                             async_transactions: list[tuple[str, AsyncTransaction]]) -> None:
    if not async_transactions:
        return _refused(driver)
    for kind, transaction in async_transactions:
        before = _ids(driver)

        async def body(transaction: AsyncTransaction = transaction, kind: str = kind) -> str:
            async with transaction() as (conn, commit):
                [result] = await driver.aenqueue_many([request("atx.commit")], connection=conn)
                assert result.id not in _ids(driver), f"{kind}: visible to others before the commit"
                await commit()
            return result.id

        job_id = _run(driver, body())
        assert _ids(driver) == before | {job_id}, kind
    return None


def test_async_rollback_leaves_no_job(driver: JobDriver,
                                      async_transactions: list[tuple[str, AsyncTransaction]]) -> None:
    if not async_transactions:
        return _refused(driver)
    for kind, transaction in async_transactions:

        async def body(transaction: AsyncTransaction = transaction) -> None:
            async with transaction() as (conn, _commit):
                await driver.aenqueue_many([request("atx.rollback")], connection=conn)
                await driver.aenqueue_many([request("atx.rollback"), request("atx.rollback")], connection=conn)
            # Leaving without commit() rolls back.

        _run(driver, body())
        assert _ids(driver) == set(), kind
    return None


def test_an_error_after_the_async_enqueue_leaves_no_job(
        driver: JobDriver, async_transactions: list[tuple[str, AsyncTransaction]]) -> None:
    if not async_transactions:
        return _refused(driver)

    class AppFailure(Exception):
        pass

    for kind, transaction in async_transactions:

        async def body(transaction: AsyncTransaction = transaction) -> None:
            async with transaction() as (conn, _commit):
                await driver.aenqueue_many([request("atx.error")], connection=conn)
                raise AppFailure("the request failed after enqueueing")

        with pytest.raises(AppFailure):
            _run(driver, body())
        assert _ids(driver) == set(), kind
    return None


def test_async_dedupe_in_a_transaction_is_the_sync_forms(
        driver: JobDriver, async_transactions: list[tuple[str, AsyncTransaction]]) -> None:
    if not async_transactions:
        return _refused(driver)
    live = driver.enqueue(request("atx.key", idempotency_key="k"))
    for kind, transaction in async_transactions:

        async def body(transaction: AsyncTransaction = transaction, kind: str = kind) -> None:
            async with transaction() as (conn, commit):
                [again] = await driver.aenqueue_many([request("atx.key", idempotency_key="k")], connection=conn)
                assert (again.id, again.deduped) == (live.id, True), kind
                with pytest.raises(JobDuplicateError):
                    await driver.aenqueue_many([request("atx.other"), request(
                        "atx.key", idempotency_key="k", on_conflict="error")], connection=conn)
                await commit()  # the refused batch left nothing: its savepoint was rolled back

        _run(driver, body())
        assert _ids(driver) == {live.id}, kind
    return None


def test_workers_are_woken_at_the_async_commit_not_before(
        driver: JobDriver, async_transactions: list[tuple[str, AsyncTransaction]]) -> None:
    if not async_transactions:
        return _refused(driver)
    for kind, transaction in async_transactions:
        seen = Wakeups()
        unsubscribe = driver.subscribe(seen)
        try:
            queue = f"q-{kind}"

            async def body(transaction: AsyncTransaction = transaction, queue: str = queue,
                           kind: str = kind, seen: Wakeups = seen) -> None:
                async with transaction() as (conn, commit):
                    await driver.aenqueue_many([request("atx.wake", queue=queue)], connection=conn)
                    await asyncio.sleep(0.05)  # a NOTIFY sent early would be here by now
                    assert queue not in seen.queues, f"{kind}: woken before the commit"
                    await commit()

            _run(driver, body())
            assert seen.wait_for(queue), f"{kind}: not woken after the commit"
        finally:
            unsubscribe()
    return None


def test_an_unknown_async_connection_is_refused_coded(driver: JobDriver) -> None:
    _refused(driver)


def test_async_enqueue_without_a_connection_writes_a_burst_and_fails_a_refused_call_alone(
        driver: JobDriver) -> None:
    taken = driver.enqueue(request("aburst.key", idempotency_key="taken"))

    async def body() -> list[Any]:
        calls = [driver.aenqueue_many([request("aburst", payload={"i": i})]) for i in range(200)]
        calls.append(driver.aenqueue_many([request("aburst.key", idempotency_key="taken", on_conflict="error")]))
        calls.append(driver.aenqueue_many([request("aburst.pair"), request("aburst.pair")]))
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = _run(driver, body())
    assert isinstance(outcomes[200], JobDuplicateError)
    written = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(written) == 201 and all(len(o) in (1, 2) for o in written)
    assert driver.introspect.count(JobFilter()) == 1 + 200 + 2
    assert driver.introspect.get(taken.id) is not None
