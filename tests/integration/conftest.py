"""Fixtures for integration tests: a fresh job registry per test and a manual clock (and a memory
driver for tests that pair it with a real app database)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ultimat3.core import ManualClock
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import isolated_registry


@pytest.fixture(autouse=True)
def _registry() -> Iterator[None]:
    with isolated_registry():
        yield


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def memory(clock: ManualClock) -> Iterator[MemoryDriver]:
    driver = MemoryDriver(clock=clock)
    driver.migrate()
    yield driver
    driver.close()
