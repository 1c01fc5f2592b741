"""Transactional enqueue: a job written inside the caller's own transaction exists if and only if
that transaction commits — through a DB-API connection and through SQLAlchemy, on every driver
that says it can (``supports_transactional_enqueue``); a driver that cannot refuses, coded."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver

from .helpers import request

#: A transaction opened on the driver's own database, as the app would open it.
Transaction = Callable[[], AbstractContextManager[Any]]


def _dbapi(driver: JobDriver) -> Transaction:
    @contextmanager
    def open_transaction() -> Iterator[Any]:
        if driver.name == "sqlite":
            import sqlite3

            conn: Any = sqlite3.connect(driver.url[len("sqlite:///"):])
        else:
            import psycopg

            conn = psycopg.connect(driver.url)
        try:
            yield conn
        finally:
            conn.close()

    return open_transaction


def _sqlalchemy(driver: JobDriver) -> Transaction:
    import sqlalchemy as sa

    url = driver.url if driver.name == "sqlite" else "postgresql+psycopg" + driver.url[driver.url.index("://"):]

    @contextmanager
    def open_transaction() -> Iterator[Any]:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                conn.begin()
                yield conn
        finally:
            engine.dispose()

    return open_transaction


@pytest.fixture(params=["dbapi", "sqlalchemy"])
def transaction(request: pytest.FixtureRequest, driver: JobDriver) -> Transaction | None:
    """How the app opens a transaction on the driver's database (DB-API, then SQLAlchemy), or
    ``None`` for a driver that cannot join one. A third-party driver that can overrides this
    fixture with its own way to open a transaction."""
    if not driver.supports_transactional_enqueue:
        return None
    if driver.name not in ("sqlite", "postgres"):
        pytest.fail(f"override the `transaction` fixture: the contract cannot open a transaction on {driver.name!r}")
    factory: Callable[[JobDriver], Transaction] = _dbapi if request.param == "dbapi" else _sqlalchemy
    return factory(driver)


def _ids(driver: JobDriver) -> set[str]:
    return {job.id for job in driver.introspect.list()}


def _refused(driver: JobDriver) -> None:
    # A driver that keeps jobs outside any database the app could share must say so, coded.
    with pytest.raises(XError) as caught:
        driver.enqueue(request("tx.refused"), connection=object())
    assert caught.value.code.startswith("X_") and caught.value.hint
    assert _ids(driver) == set()


def test_a_committed_transaction_leaves_exactly_one_job(driver: JobDriver, transaction: Transaction | None) -> None:
    if transaction is None:
        return _refused(driver)
    with transaction() as conn:
        result = driver.enqueue(request("tx.commit"), connection=conn)
        assert result.id not in _ids(driver), "not visible to others before the commit"
        conn.commit()
    assert _ids(driver) == {result.id}
    return None


def test_a_rolled_back_transaction_leaves_no_job(driver: JobDriver, transaction: Transaction | None) -> None:
    if transaction is None:
        return _refused(driver)
    with transaction() as conn:
        driver.enqueue(request("tx.rollback"), connection=conn)
        driver.enqueue_many([request("tx.rollback"), request("tx.rollback")], connection=conn)
        conn.rollback()
    assert _ids(driver) == set()
    return None


def test_an_error_after_the_enqueue_leaves_no_job(driver: JobDriver, transaction: Transaction | None) -> None:
    if transaction is None:
        return _refused(driver)

    class AppFailure(Exception):
        pass

    with pytest.raises(AppFailure), transaction() as conn:
        driver.enqueue(request("tx.error"), connection=conn)
        raise AppFailure("the request failed after enqueueing")  # closed without a commit
    assert _ids(driver) == set()
    return None
