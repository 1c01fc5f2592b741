"""The pacer a backfill sweeps under: ``rate`` batches per second, spent as a wait between batches.

A pass reads through the same database the app is serving requests from; a sweep that ran as
fast as it could would starve those requests. Pacing is therefore not optional: there is no
unthrottled setting, only a higher rate.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable

from ultimat3.core.clock import Clock, system_clock
from ultimat3.core.errors import check
from ultimat3.jobs.errors import JobAbortedError
from ultimat3.jobs.signal import AbortSignal

__all__ = [
    "DEFAULT_BACKFILL_RATE",
    "RESOLUTION",
    "Pacer",
    "Sleep",
    "is_valid_rate",
]

#: Batches per second when a backfill declares none: at the default batch that is 5,000 rows/s,
#: a statement every 200 ms, slow enough to leave the pool to the app.
DEFAULT_BACKFILL_RATE = 5
#: Seconds. A remaining wait shorter than this is skipped: no timer is that precise, and
#: oversleeping would make the pass slower than the rate it declared.
RESOLUTION = 0.001

#: ``sleep(seconds, signal)``: block up to ``seconds``, returning early once ``signal`` aborts.
Sleep = Callable[[float, AbortSignal], object]


def is_valid_rate(rate: object) -> bool:
    """Whether ``rate`` is a usable batches-per-second value: a finite real number above zero."""
    # bool is an int subclass; rate=True reading as "one batch a second" would hide a typo.
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real):
        return False
    value = float(rate)
    return math.isfinite(value) and value > 0


def _signal_sleep(seconds: float, signal: AbortSignal) -> None:
    signal.wait(seconds)


class Pacer:
    """Holds a pass to ``rate`` batches per second.

    Built once per backfill declaration and shared by every attempt of it in this process: the
    pace belongs to the table and the pool being swept, not to whichever attempt holds the run.
    ``clock`` (its monotonic reading) and ``sleep`` are injectable so tests assert the waits that
    were asked for instead of spending them.
    """

    def __init__(
        self,
        rate: float,
        job: str,
        clock: Clock | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        # Checked here too, not only in backfill(): a zero rate would give an infinite interval
        # and a negative one a negative wait — both would quietly mean "no pacing at all".
        check(
            is_valid_rate(rate),
            f'Pacer(rate={rate!r}) for backfill "{job}" — a rate is batches per second, '
            "a finite number greater than zero",
            f"pass rate={DEFAULT_BACKFILL_RATE} (fractions such as 0.5 are fine); to sweep faster "
            "raise the number — there is no unthrottled mode",
            code="X_BACKFILL_RATE",
        )
        self._rate = float(rate)
        self._interval = 1.0 / self._rate
        self._job = job
        self._clock = clock if clock is not None else system_clock
        self._sleep: Sleep = sleep if sleep is not None else _signal_sleep
        self._last: float | None = None
        self._lock = threading.Lock()

    def sleep(self, seconds: float, signal: AbortSignal) -> None:
        """Block up to ``seconds`` with the pacer's (injectable) sleeper, returning early once
        ``signal`` aborts: the health throttle's waits go through here too."""
        self._sleep(seconds, signal)

    def monotonic(self) -> float:
        """The pacer's clock (injectable), for timing what a pass does between its waits."""
        return self._clock.monotonic()

    @property
    def rate(self) -> float:
        """Batches per second."""
        return self._rate

    @property
    def interval(self) -> float:
        """Seconds from the start of one batch to the start of the next."""
        return self._interval

    def _aborted(self, signal: AbortSignal, step: str | None) -> JobAbortedError:
        return JobAbortedError(self._job, signal.reason or "aborted", step)

    def wait(self, signal: AbortSignal, step: str | None = None) -> None:
        """Block until the next batch's slot, or raise :class:`JobAbortedError` once ``signal``
        aborts — before the wait or during it, never after sitting it out.

        The first call never waits. Time spent since the previous slot (the batch's own work)
        counts toward the interval. A remainder under :data:`RESOLUTION` is no wait, but it is
        not forgiven: the slot stays where it was, so the next wait is that much longer.
        """
        if signal.aborted:
            raise self._aborted(signal, step)
        at = self._clock.monotonic()
        with self._lock:
            last = self._last
            remaining = 0.0 if last is None else self._interval - (at - last)
            if remaining < RESOLUTION:
                # A batch on time or late starts the schedule afresh; one a hair early keeps its
                # slot. Restarting from `at` there forgave the remainder on every batch: at rate
                # 500 with batches of ~1.1 ms each wait (~0.9 ms) was skipped and the pass ran at
                # ~630 batches a second, above the rate it declared.
                self._last = at if last is None or remaining <= 0 else last + self._interval
                return
        self._sleep(remaining, signal)
        # The sleeper returns early on abort, so returning only means "the wait is over": an
        # aborted attempt no longer owns the run and must not read another page.
        if signal.aborted:
            raise self._aborted(signal, step)
        with self._lock:
            # The slot waited for, not the moment the sleeper returned: timers overshoot, and
            # charging each overshoot to the next interval made a pass at rate 500 run at ~400.
            # A late wake shortens only the next wait; a batch past its slot resets the schedule
            # above, so there is never more than one interval of catching up.
            assert last is not None  # the first call returned above without waiting
            self._last = max(last + self._interval, self._clock.monotonic() - self._interval)
