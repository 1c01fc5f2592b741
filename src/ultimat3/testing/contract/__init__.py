"""The driver contract suite: ONE set of tests every :class:`~ultimat3.drivers.protocol.JobDriver`
must pass — ours (memory, SQLite, PostgreSQL) and yours.

A third-party driver proves itself with one test module::

    # tests/test_my_driver.py
    import pytest
    from ultimat3.testing.contract import *  # noqa: F403 — every contract test and its fixtures
    from ultimat3.testing.contract.fixtures import record_first_migrate

    @pytest.fixture
    def driver(request, clock):
        built = MyDriver(clock=clock)           # every timestamp from the injected ManualClock
        record_first_migrate(request, built.migrate())
        yield built
        built.close()

Split by concern (``async_enqueue``, ``enqueue``, ``claim``, ``fair``, ``fencing``, ``flow``, ``settle``,
``cancel_retry``, ``introspect``, ``steps``, ``backfill_ledger``, ``leases``, ``migrations``,
``operator``, ``prune``, ``queues``, ``schedules``, ``starvation``, ``subscribe``, ``transactions``,
``workers``): a module per concern, importable on its own. Needs pytest (``pip install ultimat3[testing]``).
"""

from __future__ import annotations

import importlib
from typing import Any

from ultimat3.testing.contract.fixtures import backdoor, clock, first_migrate

#: The concerns, one module each.
CONCERNS = (
    "async_enqueue",
    "attempts",
    "backfill_ledger",
    "cancel_retry",
    "claim",
    "enqueue",
    "fair",
    "fencing",
    "flow",
    "introspect",
    "leases",
    "migrations",
    "operator",
    "prune",
    "queues",
    "schedules",
    "settle",
    "starvation",
    "steps",
    "subscribe",
    "transactions",
    "workers",
)


def _is_fixture(value: object) -> bool:
    return type(value).__name__ == "FixtureFunctionDefinition" or hasattr(value, "_pytestfixturefunction")


def _collect() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for concern in CONCERNS:
        module = importlib.import_module(f"{__name__}.{concern}")
        for name, value in vars(module).items():
            # The tests, and the fixtures a concern defines for itself (pytest finds fixtures in
            # the namespace of the module it collects, so they must travel with the tests).
            if name.startswith("test_") or _is_fixture(value):
                found[name] = value
    return found


_TESTS = _collect()
globals().update(_TESTS)

__all__ = ["CONCERNS", "backdoor", "clock", "first_migrate", *sorted(_TESTS)]
