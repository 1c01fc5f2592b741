"""Flow control as a declared property of a job: per-key concurrency, rate limits and singletons.

``@job(..., concurrency=limit(max=2, key=lambda i: i.org_id))`` lets at most two attempts of the job
run at once per org across every worker and process; ``rate=rate_limit("14/s", burst=14)`` keeps
the job's starts under 14 a second (per key when one is given) across the fleet;
``singleton=True`` is a global limit of one (``"skip"``: a second enqueue while one is live
returns that one; ``"replace"``: it cancels that one and takes its place).

Nothing here touches storage: the enqueue computes the keys (:meth:`FlowControl.fields`) and stores
them on the job's row, and every driver's claim enforces them (see
:mod:`ultimat3.drivers.flow`), so the limits hold whoever enqueues and whoever claims.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from ultimat3.core.errors import ConfigError, check
from ultimat3.drivers.values import INT32_MAX, text_problem
from ultimat3.jobs.errors import JobInputError

__all__ = ["FlowControl", "Limit", "RateLimit", "SingletonMode", "limit", "rate_limit"]

#: What a second enqueue of a singleton does while one is live: wait its turn (``True``), be
#: dropped in favour of the live one (``"skip"``) or cancel the live one (``"replace"``).
SingletonMode = Literal[True, "skip", "replace"]
#: The idempotency key every live run of a ``skip``/``replace`` singleton holds.
SINGLETON_KEY = "x:singleton"
_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-/]{0,199}$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|sec|second|m|min|minute|h|hour|d|day)s?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
KeyFn = Callable[[Any], Any]


@dataclass(frozen=True)
class Problem:
    """Why a declaration cannot work, reported by :func:`ultimat3.jobs.job` with the job's name."""

    message: str
    hint: str
    code: str


@dataclass(frozen=True)
class Limit:
    """At most ``max`` attempts at once per key (build it with :func:`limit`)."""

    max: int
    key: KeyFn | None = None
    group: str | None = None
    invalid: Problem | None = None


@dataclass(frozen=True)
class RateLimit:
    """At most ``per_second`` starts a second per key, ``burst`` of them at once (:func:`rate_limit`)."""

    text: str
    per_second: float
    burst: int
    key: KeyFn | None = None
    group: str | None = None
    invalid: Problem | None = None


def limit(max: int, *, key: KeyFn | None = None, group: str | None = None) -> Limit:
    """At most ``max`` attempts of the job running at once across the fleet, per ``key(input)``
    (one global limit when ``key`` is omitted). ``group`` shares the limit between jobs that
    declare the same group (the key is then counted across all of them)."""
    invalid = None
    if isinstance(max, bool) or not isinstance(max, int) or not 1 <= max <= INT32_MAX:
        invalid = Problem(f"concurrency=limit(max={max!r}); a limit lets at least one attempt run",
                          "write limit(max=2) (an integer of 1 or more)", "X_FLOW_LIMIT")
    else:
        invalid = _key_and_group_problem("limit", key, group)
    return Limit(max=max if invalid is None else 1, key=key, group=group, invalid=invalid)


def rate_limit(rate: str, *, burst: int = 1, key: KeyFn | None = None, group: str | None = None) -> RateLimit:
    """Starts of the job stay under ``rate`` (``"14/s"``, ``"100/m"``, ``"5/10s"``, ``"1000/h"``)
    across the fleet, per ``key(input)`` when given. ``burst`` is how many may start at once after a
    quiet spell (a token bucket of that size, refilled at the rate); the default, 1, spaces every
    start evenly. ``group`` shares the bucket between jobs that declare the same group."""
    per_second = 0.0
    invalid = None
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None:
        invalid = Problem(f"rate=rate_limit({rate!r}) is not a rate",
                          'write a count per period: "14/s", "100/m", "5/10s" or "1000/h"', "X_FLOW_RATE")
    else:
        count, span = float(match.group(1)), float(match.group(2) or 1)
        per_second = count / (span * _UNITS[match.group(3)]) if span > 0 else math.inf
        if not (math.isfinite(per_second) and per_second > 0):
            invalid = Problem(f"rate=rate_limit({rate!r}) allows no start at all (or unbounded ones)",
                              'write a positive count over a positive period, e.g. "14/s"', "X_FLOW_RATE")
    if invalid is None and (isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= INT32_MAX):
        invalid = Problem(f"rate=rate_limit({rate!r}, burst={burst!r}); a burst is 1 or more starts",
                          "write burst=14 to let 14 start at once after a quiet spell (1: evenly spaced)",
                          "X_FLOW_RATE")
    if invalid is None:
        invalid = _key_and_group_problem("rate_limit", key, group)
    return RateLimit(text=str(rate), per_second=per_second, burst=burst if invalid is None else 1, key=key,
                     group=group, invalid=invalid)


def _key_and_group_problem(what: str, key: object, group: object) -> Problem | None:
    if key is not None and not callable(key):
        return Problem(f"{what}(key={key!r}) is not a function of the input",
                       f"write {what}(..., key=lambda input: input.org_id)", "X_FLOW_KEY")
    if group is not None and not (isinstance(group, str) and _GROUP.match(group)):
        return Problem(f"{what}(group={group!r}) is not a group name",
                       f'write {what}(..., group="smtp"): letters, digits and _ . : - /', "X_FLOW_KEY")
    return None


@dataclass(frozen=True)
class FlowFields:
    """What one enqueue stores on the job's row for the claim to enforce."""

    flow_key: str | None = None
    flow_max: int | None = None
    rate_key: str | None = None
    rate_per_second: float | None = None
    rate_burst: int | None = None


@dataclass(frozen=True)
class FlowControl:
    """A job's declared flow control, checked when the job is declared."""

    job: str
    concurrency: Limit | None = None
    rate: RateLimit | None = None
    singleton: SingletonMode | None = None

    @classmethod
    def declare(cls, job: str, concurrency: object, rate: object, singleton: object) -> FlowControl | None:
        """The job's flow control, or a coded :class:`ConfigError` naming the job."""
        where = f'job "{job}"'
        check(concurrency is None or isinstance(concurrency, Limit), f"{where} declares concurrency={concurrency!r}",
              "write concurrency=limit(max=2, key=lambda input: input.org_id)", code="X_FLOW_LIMIT")
        check(rate is None or isinstance(rate, RateLimit), f"{where} declares rate={rate!r}",
              'write rate=rate_limit("14/s", key=lambda input: input.org_id)', code="X_FLOW_RATE")
        check(singleton in (None, False, True, "skip", "replace"), f"{where} declares singleton={singleton!r}",
              'write singleton=True (one at a time), "skip" or "replace"', code="X_FLOW_SINGLETON")
        for declared in (concurrency, rate):
            problem = getattr(declared, "invalid", None)
            if problem is not None:
                raise ConfigError(f"{where} declares {problem.message}", problem.hint, code=problem.code)
        mode = None if singleton in (None, False) else cast(SingletonMode, singleton)
        if mode is not None:
            check(concurrency is None, f"{where} declares both singleton={singleton!r} and concurrency=",
                  "keep one: singleton=True is concurrency=limit(max=1) with no key", code="X_FLOW_SINGLETON")
            concurrency = Limit(max=1)
        if concurrency is None and rate is None:
            return None
        return cls(job=job, concurrency=cast(Limit | None, concurrency), rate=cast(RateLimit | None, rate),
                   singleton=mode)

    def fields(self, value: Any) -> FlowFields:
        """The keys this input's run is counted under (``X_JOB_INPUT`` when a key function fails)."""
        flow_key = flow_max = rate_key = rate_burst = None
        rate_per_second = None
        if self.concurrency is not None:
            flow_key = self._key("concurrency", self.concurrency.key, self.concurrency.group, value)
            flow_max = self.concurrency.max
        if self.rate is not None:
            rate_key = self._key("rate", self.rate.key, self.rate.group, value)
            rate_per_second, rate_burst = self.rate.per_second, self.rate.burst
        return FlowFields(flow_key, flow_max, rate_key, rate_per_second, rate_burst)

    def _key(self, what: str, key: KeyFn | None, group: str | None, value: Any) -> str:
        scope = group or self.job
        if key is None:
            return scope
        try:
            part = key(value)
        except Exception as error:
            raise JobInputError(
                f'job "{self.job}": its {what} key function raised {type(error).__name__}: {error}',
                f"make the {what} key a function every valid input answers (e.g. lambda input: input.org_id)",
                field="(input)") from None
        if isinstance(part, bool) or not isinstance(part, str | int) or part == "" or (
                isinstance(part, str) and text_problem(part) is not None):
            raise JobInputError(
                f'job "{self.job}": its {what} key function returned {part!r}, not a key',
                f"return a non-empty string or an int from the {what} key (e.g. the org id)", field="(input)")
        return f"{scope}|{part}"
