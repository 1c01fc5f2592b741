"""Fair claims across tenants (``ClaimRequest.fair``), the rule every driver follows.

A fair claim serves tenants in turn instead of taking one claim order across all of them: from
the claimer's cursor (just after the last tenant it served, in byte order; no tenant is ``''``) it
chooses up to ``limit`` tenants that have due jobs, wrapping to the first tenant when it runs out,
and takes from each its first ``ceil(limit / tenants)`` jobs in claim order -- every chosen
tenant's first job, then every tenant's second, and so on, by priority within a turn. A tenant
with ten jobs queued behind another's hundred thousand starts them in the first claims.

PostgreSQL does it in one statement per pass (a skip scan over ``x_jobs_fair_idx`` finds the
tenants with one probe each); SQLite and memory follow :func:`fair_order` over the same choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

__all__ = ["PASSES", "choose_tenants", "fair_claim", "fair_order", "fair_start_after", "share"]

T = TypeVar("T")
#: Passes one fair claim makes at most: from the cursor, then from the first tenant while tenants
#: with fewer due jobs than their share left room (each pass serves every tenant it chose).
PASSES = 3


def fair_start_after(tenants: Iterable[str | None]) -> str:
    """Where the next fair claim starts: just after the highest tenant this claim served (every
    tenant a fair claim chooses gets its first turn, so that is the last one served). ``chr(1)``
    appended is the least text above it in byte order (tenant ids hold no NUL)."""
    return max(tenant or "" for tenant in tenants) + "\x01"


def choose_tenants(tenants: Iterable[str], start: str, limit: int) -> list[str]:
    """Up to ``limit`` of ``tenants`` (those with due jobs, ``''`` for none) in byte order from
    ``start`` (inclusive); without wrapping (the caller runs a second pass from ``''``)."""
    return sorted(t for t in set(tenants) if t >= start)[:limit]


def share(limit: int, tenants: int) -> int:
    """How many jobs each chosen tenant offers: enough for ``limit`` between them."""
    return max(1, math.ceil(limit / max(tenants, 1)))


def fair_order(heads: Sequence[Sequence[T]], key: Callable[[T], tuple[object, ...]], limit: int) -> list[T]:
    """Interleave each tenant's jobs (already in claim order): every tenant's first, then every
    second...; within a turn by ``key`` (the claim order); at most ``limit``."""
    ranked = [(turn, key(job), job) for jobs in heads for turn, job in enumerate(jobs)]
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [job for _, _, job in ranked[:limit]]


def fair_claim(tenants_from: Callable[[str, int], list[str]], jobs_of: Callable[[str, int], list[T]],
               claim: Callable[[list[T]], list[T]], key: Callable[[T], tuple[object, ...]], start: str,
               limit: int) -> tuple[list[T], str | None]:
    """One fair claim as SQLite and memory run it, inside the caller's lock: a pass from ``start``
    and, while that leaves room, passes from the first tenant (at most :data:`PASSES` in all).
    ``tenants_from(start, n)``: up to ``n`` tenants with due jobs from ``start`` in byte order;
    ``jobs_of(tenant, n)``: its first ``n`` due jobs in claim order; ``claim(jobs)``: move them to
    running (so a later pass does not see them again) and return them as claimed. Returns the
    claimed jobs and the next start (``None``: nothing was claimed, keep the cursor)."""
    claimed: list[T] = []
    next_start: str | None = None
    begin = start
    for _ in range(PASSES):
        left = limit - len(claimed)
        if left <= 0:
            break
        tenants = tenants_from(begin, left)
        picked = fair_order([jobs_of(tenant, share(left, len(tenants))) for tenant in tenants], key, left)
        if picked:
            claimed += claim(picked)
            next_start = max(tenants) + "\x01"
        elif not begin:
            break  # from the first tenant on, nothing is due
        begin = ""
    return claimed, next_start
