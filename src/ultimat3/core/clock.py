"""Injectable time. Every timestamp a driver writes and every due-ness a claim decides comes from
a :class:`Clock`; local durations (attempt timeouts, the pacer, heartbeat intervals, log throttles)
use the monotonic clock, which no wall-clock change can move."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Source of time: epoch seconds for timestamps, a monotonic reading for durations."""

    def now(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for measuring intervals."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to: tests advance it instead of sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        """The current fake epoch seconds."""
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        """The current fake monotonic reading."""
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        """Move both readings forward by ``seconds``."""
        with self._lock:
            self._now += seconds
            self._mono += seconds


system_clock = SystemClock()


def to_datetime(seconds: float) -> datetime:
    """Epoch seconds as an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, UTC)


def to_seconds(value: datetime) -> float:
    """An aware (or naive-UTC) datetime as epoch seconds."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()
