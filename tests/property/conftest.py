"""One ``driver`` per kind (memory, sqlite, postgres) shared by a module's examples, and helpers.

Drivers are module-scoped: hypothesis runs many examples per test, so each example counts the
rows before and after itself instead of starting from an empty store. Postgres runs in a schema of
its own, so other suites truncating the shared tables cannot interfere.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.drivers import KINDS, SHARED_KINDS, database_url
from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import JobDriver

DRIVERS = KINDS
SHARED_DRIVERS = SHARED_KINDS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``driver_url`` over every kind, or only the shareable ones for a module that
    sets ``SHARED_ONLY = True`` (its tests reach the store through a separate CLI invocation)."""
    if "driver_url" in metafunc.fixturenames:
        shared_only = getattr(metafunc.module, "SHARED_ONLY", False)
        metafunc.parametrize("driver_url", SHARED_DRIVERS if shared_only else DRIVERS, indirect=True,
                             scope="module")


@pytest.fixture(scope="module")
def driver_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database URL of each kind (a fresh SQLite file, a fresh Postgres schema)."""
    with database_url(request.param, tmp_path_factory.mktemp("prop"), prefix="x_prop") as url:
        yield url


@pytest.fixture(scope="module")
def driver(driver_url: str) -> Iterator[JobDriver]:
    """A migrated driver on ``driver_url``."""
    built = create_driver(driver_url)
    try:
        yield built
    finally:
        built.close()
