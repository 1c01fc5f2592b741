"""The contract suite as a third-party driver runs it: one star import and a ``driver`` fixture.

The "third-party" driver here is a subclass of the memory driver, so the few tests that force a
state through a backdoor still reach its storage; what this proves is the entry point itself:
every concern's tests and fixtures arrive with one import, and pass.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ultimat3.testing.contract as contract
from ultimat3.core import ManualClock
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.drivers.protocol import JobDriver
from ultimat3.testing.contract import *  # noqa: F403
from ultimat3.testing.contract.fixtures import record_first_migrate


class ThirdPartyDriver(MemoryDriver):
    """Stands in for a driver written outside this package."""


@pytest.fixture
def driver(request: pytest.FixtureRequest, clock: ManualClock) -> Iterator[JobDriver]:
    built = ThirdPartyDriver(clock=clock)
    record_first_migrate(request, built.migrate())
    yield built
    built.close()


def test_the_entry_point_carries_every_concern() -> None:
    exported = [name for name in contract.__all__ if name.startswith("test_")]
    assert len(exported) >= 120
    assert set(contract.CONCERNS) >= {"enqueue", "claim", "fencing", "settle", "cancel_retry", "steps"}
