"""The process's default driver, used by ``enqueue`` when no ``driver=`` is passed."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ultimat3.drivers.protocol import JobDriver

_lock = threading.Lock()
_driver: JobDriver | None = None
_factory: Callable[[], JobDriver] | None = None


def set_driver(driver: JobDriver | None) -> None:
    """Make ``driver`` the process default (``None`` forgets it; the next use re-creates it)."""
    global _driver
    with _lock:
        _driver = driver


def set_driver_factory(factory: Callable[[], JobDriver] | None) -> None:
    """Have the process default come from ``factory``, asked on every use that has no driver set
    (a framework integration whose database is only known once its settings are: the factory may
    return a different driver when they change, as a test runner's database swap does).
    ``None`` goes back to ``X_DATABASE_URL``."""
    global _factory
    with _lock:
        _factory = factory


def get_driver() -> JobDriver:
    """The driver set by :func:`set_driver`, else the factory's, else one created from
    ``X_DATABASE_URL`` on first use."""
    global _driver
    with _lock:
        if _driver is not None:
            return _driver
        factory = _factory
        if factory is None:
            from ultimat3.drivers import create_driver

            _driver = create_driver()
            return _driver
    # Outside the lock: the factory may open (and migrate) a database.
    return factory()
