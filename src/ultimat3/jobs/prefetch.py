"""How many jobs a worker holds claimed ahead of its free slots: fixed, or grown while handlers
are quick next to a claim's round trip."""

from __future__ import annotations

import math

#: How many claim round trips a job claimed ahead should wait, at most, before its slot frees.
#: One would be enough if every round trip took as long as the average; two absorbs the spread.
HORIZON = 2.0

#: The most an adaptive prefetch grows to, in multiples of ``concurrency``: it bounds one claim's
#: size (and what a stop gives back). With instant handlers the depth sits here; at concurrency 10
#: on PostgreSQL, 8 drained faster than 4 in each of four alternating runs.
CEILING = 8

#: And at most this many jobs ahead, whatever the concurrency: past it a worker's own Python (the
#: claimed rows, the ahead queue, heartbeats) costs more per job than the round trips it saves. At
#: concurrency 100, 200 ahead drained as fast as 800 with 10-25% less client CPU per job.
MOST = 200

# Weight of the newest sample in each moving average: about the last ten samples count.
_ALPHA = 0.2


class Prefetch:
    """The number of jobs a worker may hold claimed ahead of its free slots (``depth``).

    Fixed (``Prefetch.fixed(n)``): always ``n``. Adaptive (the worker's default): ``concurrency``
    (the floor) until it has measured both a handler and a claim, then as many as the slots free
    in :data:`HORIZON` claim round trips, ``concurrency × HORIZON × round trip / handler time``,
    kept between the floor and :data:`CEILING` × ``concurrency`` (at most :data:`MOST`, never
    below the floor). So a worker whose handlers take about as long as a round trip or longer
    keeps the floor, and one whose handlers are much quicker claims bigger batches, each of which
    starts within about two round trips.

    Handler time is a moving average of handler durations, pulled up by the mean age of the
    handlers still running (a long handler counts before it returns: its slot is not free). The
    worker calls :meth:`started`/:meth:`finished` around each handler and :meth:`claimed` after
    each claim; all are a few float operations, once per attempt or claim.
    """

    __slots__ = (
        "_handler",
        "_round_trip",
        "_running",
        "_started_sum",
        "adaptive",
        "ceiling",
        "concurrency",
        "floor",
    )

    def __init__(self, concurrency: int, *, floor: int | None = None, ceiling: int | None = None,
                 adaptive: bool = True) -> None:
        self.concurrency = concurrency
        #: The fewest jobs held ahead (adaptive), or the only number (fixed).
        self.floor = concurrency if floor is None else floor
        #: The most jobs held ahead.
        self.ceiling = max(self.floor, min(CEILING * concurrency, MOST) if ceiling is None else ceiling)
        #: Whether the depth follows the measurements (``False``: always ``floor``).
        self.adaptive = adaptive
        self._handler: float | None = None
        self._round_trip: float | None = None
        self._running = 0
        self._started_sum = 0.0

    @classmethod
    def fixed(cls, depth: int) -> Prefetch:
        """A prefetch of exactly ``depth`` jobs, whatever the handlers take."""
        return cls(max(1, depth), floor=depth, ceiling=depth, adaptive=False)

    def started(self, at: float) -> None:
        """A handler started at monotonic time ``at``."""
        self._running += 1
        self._started_sum += at

    def finished(self, started: float, now: float) -> None:
        """The handler started at ``started`` returned at ``now``."""
        self._running -= 1
        self._started_sum -= started
        if self._running == 0:
            self._started_sum = 0.0  # no float drift left over from many additions
        seconds = now - started
        previous = self._handler
        self._handler = seconds if previous is None else previous + _ALPHA * (seconds - previous)

    def claimed(self, seconds: float) -> None:
        """A claim's round trip took ``seconds``."""
        previous = self._round_trip
        self._round_trip = seconds if previous is None else previous + _ALPHA * (seconds - previous)

    def depth(self, now: float) -> int:
        """How many jobs to hold claimed ahead now."""
        if not self.adaptive or self._handler is None or self._round_trip is None:
            return self.floor
        handler = self._handler
        if self._running:
            handler = max(handler, now - self._started_sum / self._running)
        if handler <= 0.0:
            return self.ceiling
        want = math.ceil(self.concurrency * HORIZON * self._round_trip / handler)
        return self.floor if want <= self.floor else min(want, self.ceiling)
