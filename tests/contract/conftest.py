"""Our three drivers under the contract suite (:mod:`ultimat3.testing.contract`): one ``driver``
fixture, parametrised over memory, SQLite and PostgreSQL, built exactly as a third-party driver's
fixture would be.

Postgres needs the server at ``X_TEST_DATABASE_URL``; when it is unreachable its tests skip
locally and fail in CI (``CI=true``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres import postgres_schema
from ultimat3.core.clock import ManualClock
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.drivers.postgres.driver import PostgresDriver
from ultimat3.drivers.protocol import JobDriver
from ultimat3.drivers.sqlite.driver import SqliteDriver
from ultimat3.testing.contract.fixtures import backdoor, clock, first_migrate, record_first_migrate

__all__ = ["backdoor", "clock", "driver", "first_migrate", "postgres_url"]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The test database, checked once per session, in a schema of the suite's own: its
    TRUNCATEs cannot disturb anything else using the same database, nor be disturbed."""
    with postgres_schema("x_contract") as url:
        yield url


def _reset_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs, x_job_steps, x_backfills, x_leases")
        # The library's own migration rows stay: they describe the schema that is really there.
        conn.execute("DELETE FROM x_migrations WHERE id NOT LIKE 'x:%'")


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
        built = MemoryDriver(clock=clock)
        record_first_migrate(request, built.migrate())
    elif kind == "sqlite":
        built = SqliteDriver(str(tmp_path / "x.db"), clock=clock)
        record_first_migrate(request, built.migrate())
    else:
        url = request.getfixturevalue("postgres_url")
        built = PostgresDriver(url, clock=clock)
        record_first_migrate(request, built.migrate())
        _reset_postgres(url)
    try:
        yield built
    finally:
        built.close()
