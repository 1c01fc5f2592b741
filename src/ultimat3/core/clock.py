"""Injectable time. Every timestamp a driver writes and every due-ness a claim decides comes from
a :class:`Clock`; local durations (attempt timeouts, the pacer, heartbeat intervals, log throttles)
use the monotonic clock, which no wall-clock change can move.

A fleet needs ONE clock: :class:`ReferenceClock` follows another machine's wall clock (the
database server's) instead of this host's, so a host whose clock is off cannot shorten a claim's
visibility or start a delayed job early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

_log = logging.getLogger(__name__)


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


def _elapsed() -> float:
    """A reading for intervals that also counts time the machine spent suspended (Linux's
    ``CLOCK_BOOTTIME``; ``time.monotonic()`` elsewhere): a host that slept must not think less
    time passed than the database did."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


class ReferenceClock:
    """Another machine's wall clock, read here without a round trip per reading.

    ``sample()`` returns the reference's epoch seconds (e.g. ``clock_timestamp()`` on the
    database server). A measurement takes ``samples`` of them and keeps the one with the shortest
    round trip, pinned to the middle of that round trip, so its error is at most half of it. Between
    measurements the reading moves with this host's ``CLOCK_BOOTTIME`` from that anchor, never
    with its wall clock: a host whose wall clock is off, or is stepped by NTP, reads the reference's
    time all the same. :meth:`start` re-measures every ``refresh`` seconds (drift of the interval
    clock is parts per million, a few milliseconds a minute) and at once when this host's wall
    clock jumps against its interval clock (a step, or a VM resumed from a pause).

    ``on_measure(offset)`` is called after each measurement with :meth:`offset`.
    """

    def __init__(
        self,
        sample: Callable[[], float],
        *,
        samples: int = 3,
        refresh: float = 60.0,
        on_measure: Callable[[float], None] | None = None,
    ) -> None:
        self._sample = sample
        self._samples = max(1, samples)
        self.refresh_every = refresh
        self._on_measure = on_measure
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.round_trip = 0.0
        self._reference = 0.0
        self._tick = 0.0
        self._wall_minus_tick = 0.0
        self.measure()

    def measure(self) -> float:
        """Sample the reference now; returns the new :meth:`offset`. Raises what ``sample`` raises
        (the previous anchor stays in use)."""
        best: tuple[float, float, float] | None = None
        for _ in range(self._samples):
            before = _elapsed()
            reference = self._sample()
            after = _elapsed()
            trip = after - before
            if best is None or trip < best[0]:
                best = (trip, reference, (before + after) / 2)
        assert best is not None
        trip, reference, tick = best
        with self._lock:
            self.round_trip = trip
            self._reference = reference
            self._tick = tick
            self._wall_minus_tick = time.time() - _elapsed()
        offset = self.offset()
        if self._on_measure is not None:
            self._on_measure(offset)
        return offset

    def now(self) -> float:
        """The reference's epoch seconds, estimated from the last measurement."""
        tick = _elapsed()
        with self._lock:
            reading = self._reference + (tick - self._tick)
            jumped = abs((time.time() - tick) - self._wall_minus_tick) > 1.0
        if jumped and self._thread is not None:
            self._wake.set()  # this host's wall clock moved against its interval clock: re-measure
        return reading

    def monotonic(self) -> float:
        """``time.monotonic()``: local durations never depend on the reference."""
        return time.monotonic()

    def offset(self) -> float:
        """This host's wall clock minus the reference's, in seconds (positive: this host is ahead)."""
        return time.time() - self.now()

    def start(self, name: str = "ultimat3-clock") -> None:
        """Re-measure in a daemon thread every ``refresh`` seconds until :meth:`stop`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the re-measuring thread (the last anchor stays usable). Idempotent."""
        self._stopped.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.refresh_every)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self.measure()
            except Exception as exc:  # an unreachable reference: keep the anchor, try again later
                _log.debug("re-measuring the reference clock failed: %s", exc)


def to_datetime(seconds: float) -> datetime:
    """Epoch seconds as an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, UTC)


def to_seconds(value: datetime) -> float:
    """An aware (or naive-UTC) datetime as epoch seconds."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()
