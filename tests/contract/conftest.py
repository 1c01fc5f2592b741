"""One ``driver`` fixture, parametrised over every driver: the whole suite runs against each.

Postgres needs the server at ``X_TEST_DATABASE_URL``; when it is unreachable its tests skip
locally and fail in CI (``CI=true``). A driver module that does not exist yet skips the same way.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from psycopg import sql

from ultimat3.core.clock import ManualClock
from ultimat3.jobs.driver import JobDriver

from .helpers import Backdoor, postgres_test_url

FIRST_MIGRATE = pytest.StashKey[list[str]]()


def _in_ci() -> bool:
    return os.environ.get("CI") == "true"


def _unavailable(reason: str) -> NoReturn:
    # Locally a missing backend is a skip; in CI it must be loud, or the suite proves nothing.
    if _in_ci():
        pytest.fail(reason)
    pytest.skip(reason)


def _driver_class(module: str, name: str) -> Any:
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # Only the driver module itself being absent is "not built yet"; a broken import inside
        # an existing driver is an error and surfaces as one.
        if exc.name != module:
            raise
        _unavailable(f"driver not built yet: {module} does not exist")
    return getattr(loaded, name)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The test database URL, checked for reachability once per session, with its own schema.

    The schema keeps the suite's TRUNCATEs away from anything else using the same database
    (another test session, a benchmark, a developer's worker).
    """
    url = postgres_test_url()
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=3).close()
    except Exception as exc:
        _unavailable(f"PostgreSQL at X_TEST_DATABASE_URL={url} is unreachable: {exc}")
    schema = f"x_contract_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    separator = "&" if "?" in url else "?"
    try:
        yield f"{url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def _reset_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs, x_job_steps, x_backfills, x_leases")
        # The library's own migration rows stay: they describe the schema that is really there.
        conn.execute("DELETE FROM x_migrations WHERE id NOT LIKE 'x:%'")


@pytest.fixture
def clock() -> ManualClock:
    """The time every driver under test reads; tests move it with ``clock.advance``."""
    return ManualClock()


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def driver(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[JobDriver]:
    """A migrated, empty driver of each kind, on the test's :class:`ManualClock`."""
    kind: str = request.param
    built: JobDriver
    if kind == "memory":
        cls = _driver_class("ultimat3.jobs.drivers.memory", "MemoryDriver")
        built = cls(clock=clock)
        request.node.stash[FIRST_MIGRATE] = built.migrate()
    elif kind == "sqlite":
        cls = _driver_class("ultimat3.jobs.drivers.sqlite.driver", "SqliteDriver")
        built = cls(str(tmp_path / "x.db"), clock=clock)
        request.node.stash[FIRST_MIGRATE] = built.migrate()
    else:
        url = request.getfixturevalue("postgres_url")
        cls = _driver_class("ultimat3.jobs.drivers.postgres.driver", "PostgresDriver")
        built = cls(url, clock=clock)
        request.node.stash[FIRST_MIGRATE] = built.migrate()
        _reset_postgres(url)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
def first_migrate(request: pytest.FixtureRequest, driver: JobDriver) -> list[str]:
    """What the fixture's own ``migrate()`` call returned (a fresh store for memory/sqlite)."""
    return request.node.stash[FIRST_MIGRATE]


@pytest.fixture
def backdoor(driver: JobDriver, tmp_path: Path) -> Backdoor:
    """Direct writes to the driver's storage (the sqlite file is the fixture's ``x.db``)."""
    return Backdoor(driver, tmp_path / "x.db")
