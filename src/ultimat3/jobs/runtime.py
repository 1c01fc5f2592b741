"""The process's default driver, used by ``enqueue`` when no ``driver=`` is passed."""

from __future__ import annotations

import threading

from ultimat3.drivers.protocol import JobDriver

_lock = threading.Lock()
_driver: JobDriver | None = None


def set_driver(driver: JobDriver | None) -> None:
    """Make ``driver`` the process default (``None`` forgets it; the next use re-creates it)."""
    global _driver
    with _lock:
        _driver = driver


def get_driver() -> JobDriver:
    """The process default driver, created from ``X_DATABASE_URL`` on first use."""
    global _driver
    with _lock:
        if _driver is None:
            from ultimat3.drivers import create_driver

            _driver = create_driver()
        return _driver
