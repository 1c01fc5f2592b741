"""Fixtures the contract suite needs besides ``driver`` (which the caller provides)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver
from ultimat3.testing.contract.helpers import Backdoor

__all__ = ["FIRST_MIGRATE", "backdoor", "clock", "first_migrate", "record_first_migrate"]

#: Where a ``driver`` fixture records what its own first ``migrate()`` returned.
FIRST_MIGRATE = pytest.StashKey[list[str]]()


def record_first_migrate(request: pytest.FixtureRequest, applied: list[str]) -> None:
    """Call from your ``driver`` fixture with what ``driver.migrate()`` returned on a fresh store."""
    request.node.stash[FIRST_MIGRATE] = applied


@pytest.fixture
def clock() -> ManualClock:
    """The time every driver under test reads; tests move it with ``clock.advance``."""
    return ManualClock()


@pytest.fixture
def first_migrate(request: pytest.FixtureRequest, driver: JobDriver) -> list[str]:
    """What the ``driver`` fixture's own ``migrate()`` call returned (a fresh store)."""
    if FIRST_MIGRATE not in request.node.stash:
        pytest.fail("the driver fixture must call record_first_migrate(request, driver.migrate())")
    applied: list[str] = request.node.stash[FIRST_MIGRATE]
    return applied


@pytest.fixture
def backdoor(driver: JobDriver, tmp_path: Path) -> Backdoor:
    """Direct writes to the driver's storage (memory, SQLite, PostgreSQL); other drivers skip the
    few tests that need one."""
    return Backdoor(driver, tmp_path / "x.db")
