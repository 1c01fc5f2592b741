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

from tests.drivers import KINDS, build, database_url
from ultimat3.core.clock import ManualClock
from ultimat3.drivers.postgres.driver import PostgresDriver
from ultimat3.drivers.protocol import JobDriver
from ultimat3.testing.contract.fixtures import backdoor, clock, first_migrate, record_first_migrate

__all__ = ["backdoor", "clock", "driver", "first_migrate", "pgbouncer_urls", "postgres_url"]

#: Every kind, plus PostgreSQL through PgBouncer in transaction mode: every SQL statement of the
#: driver goes through the pooler, but for what needs a real session (LISTEN, each worker's liveness
#: lock), which takes the direct URL, as a deployment behind a pooler is told to configure it.
CONTRACT_KINDS = [*KINDS, pytest.param("pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer])]


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test database, checked once per session, in a schema of the suite's own: its
    TRUNCATEs cannot disturb anything else using the same database, nor be disturbed."""
    with database_url("postgres", tmp_path_factory.mktemp("contract"), prefix="x_contract") as url:
        yield url


@pytest.fixture(scope="session")
def pgbouncer_urls() -> Iterator[tuple[str, str]]:
    """A database of the suite's own: (through a transaction-mode PgBouncer, direct)."""
    from tests.pgbouncer import pgbouncer, pgbouncer_database

    with pgbouncer() as bouncer, pgbouncer_database(bouncer, "x_contract_bouncer") as urls:
        yield urls


def _reset_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs, x_job_steps, x_backfills, x_backfill_failures, x_leases, x_workers, x_queues, "
                     "x_audit, x_schedules, x_rates, x_attempts")
        # The library's own migration rows stay: they describe the schema that is really there.
        conn.execute("DELETE FROM x_migrations WHERE id NOT LIKE 'x:%'")


@pytest.fixture(params=CONTRACT_KINDS)
def driver(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[JobDriver]:
    """A migrated, empty driver of each kind, on the test's :class:`ManualClock`."""
    kind: str = request.param
    # Postgres shares one session schema (emptied per test): a schema per test costs ~50 ms each.
    direct = None
    if kind == "postgres":
        url = request.getfixturevalue("postgres_url")
    elif kind == "pgbouncer":
        url, direct = request.getfixturevalue("pgbouncer_urls")
    else:
        url = f"sqlite:///{tmp_path / 'x.db'}"
    built = build("postgres" if kind == "pgbouncer" else kind, url, clock, direct_url=direct)
    if isinstance(built, PostgresDriver):
        # The contract judges liveness at once; the settling time after a server restart (a young
        # session rescues nobody) is PostgreSQL's own and tested in tests/integration.
        built.workers.settle = 0.0
    record_first_migrate(request, built.migrate())
    if kind in ("postgres", "pgbouncer"):
        _reset_postgres(url)
    try:
        yield built
    finally:
        built.close()
