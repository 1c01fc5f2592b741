"""Log lines that repeat during an outage, at most once per interval each.

While PostgreSQL restarts, every claim, heartbeat and LISTEN reconnect fails several times a second;
one line per failure (with a traceback each) buries the one line that says what is wrong. A
throttled logger writes the first occurrence of each kind at once, then at most one per interval,
saying how many it held back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["ThrottledLog"]


class ThrottledLog:
    """Warnings by key, each at most once per ``every`` seconds (monotonic), with a count of the
    ones suppressed in between. Thread-safe."""

    def __init__(self, logger: logging.Logger, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object, **extra: object) -> bool:
        """Log ``message % args`` under ``key`` unless one was logged less than ``every`` seconds
        ago; returns whether it was written."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            held = self._held.pop(key, 0)
            self._last[key] = now
        suffix = f" ({held} similar in the last {self.every:g}s not shown)" if held else ""
        self.logger.warning(message + suffix, *args, extra=extra or None)
        return True

    def recovered(self, key: str, message: str, *args: object) -> None:
        """Log ``message`` once when ``key`` had warned and now works again; forget the key."""
        with self._lock:
            had = self._last.pop(key, None)
            self._held.pop(key, None)
        if had is not None:
            self.logger.info(message, *args)
