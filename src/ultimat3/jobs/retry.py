"""Retry policy: how many attempts, and how long to wait between them."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from ultimat3.core.errors import check

#: ``max_attempts`` is stored in a 32-bit integer column (Postgres ``integer``).
MAX_ATTEMPTS_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``max_attempts`` attempts; attempt ``n`` failing waits ``base * factor**(n-1)``
    seconds (capped at ``cap``), spread by ``±jitter`` (a fraction) so a burst of failures does
    not come back as a burst of retries."""

    max_attempts: int = 5
    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        check(
            isinstance(self.max_attempts, int) and not isinstance(self.max_attempts, bool)
            and 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT,
            f"RetryPolicy(max_attempts={self.max_attempts!r}) — attempts are a whole number, "
            f"at least 1 (at most {MAX_ATTEMPTS_LIMIT})",
            "write RetryPolicy(max_attempts=5); 1 means no retry",
            code="X_RETRY_POLICY",
        )
        for field_name in ("base", "factor", "cap", "jitter"):
            value = getattr(self, field_name)
            check(
                isinstance(value, int | float) and math.isfinite(value) and value >= 0,
                f"RetryPolicy({field_name}={value!r}) — must be a finite number >= 0",
                f"write e.g. RetryPolicy({field_name}={getattr(RetryPolicy, field_name)})",
                code="X_RETRY_POLICY",
            )
        check(self.jitter <= 1, f"RetryPolicy(jitter={self.jitter!r}) — jitter is a fraction of the delay",
              "write a value between 0 and 1, e.g. jitter=0.2", code="X_RETRY_POLICY")

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        try:
            raw = min(self.cap, self.base * self.factor ** max(0, attempt - 1))
        except OverflowError:
            # factor**n outgrew a float (attempt ~1025 at factor 2): the cap is what applies.
            raw = 0.0 if self.base == 0 else self.cap
        spread = raw * self.jitter * (2 * rand() - 1)
        return max(0.0, min(self.cap, raw + spread))


DEFAULT_RETRY = RetryPolicy()
