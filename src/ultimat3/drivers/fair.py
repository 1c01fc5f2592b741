"""Fair claims across tenants (``ClaimRequest.fair``), the rule every driver follows.

A fair claim serves tenants in turn instead of taking one claim order across all of them: from
the claimer's cursor (just after the last tenant it served, in byte order; no tenant is ``''``) it
chooses up to ``limit`` tenants that have due jobs, wrapping to the first tenant when it runs out,
and takes from each its part of ``limit`` in claim order -- every chosen tenant's first turn, then
every tenant's second, and so on, by priority within a turn. A turn is one job, or ``w`` jobs for
a tenant given weight ``w`` (``ClaimRequest.weights``: a paying customer's share, say). A tenant
with ten jobs queued behind another's hundred thousand starts them in the first claims.

PostgreSQL does it in one statement per pass (a skip scan over ``x_jobs_fair_idx`` finds the
tenants with one probe each); SQLite and memory follow :func:`fair_order` over the same choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from ultimat3.core.errors import ConfigError
from ultimat3.drivers.values import is_storable_text

__all__ = ["MAX_WEIGHT", "PASSES", "check_weights", "choose_tenants", "fair_claim", "fair_order", "fair_passes",
           "fair_start_after", "share", "weight_arrays", "weight_of"]

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


def share(limit: int, weight: int, total: int) -> int:
    """How many jobs a chosen tenant of ``weight`` offers when the chosen weigh ``total``: its part
    of ``limit``, rounded up, and at least one turn's worth."""
    return max(weight, math.ceil(limit * weight / max(total, 1)))


def fair_order(heads: Sequence[tuple[int, Sequence[T]]], key: Callable[[T], tuple[object, ...]],
               limit: int) -> list[T]:
    """Interleave each tenant's jobs (``(weight, jobs in claim order)``): every tenant's first turn,
    then every second...; a tenant of weight ``w`` has ``w`` jobs in each turn; within a turn by
    ``key`` (the claim order); at most ``limit``."""
    ranked = [(index // weight, key(job), job) for weight, jobs in heads for index, job in enumerate(jobs)]
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [job for _, _, job in ranked[:limit]]


def fair_passes(run_pass: Callable[[str, int], tuple[list[T], list[str | None]]], start: str,
                limit: int) -> tuple[list[T], str | None]:
    """The passes of one fair claim, as every driver runs them: one from ``start`` and, while that
    leaves room, from the first tenant (at most :data:`PASSES` in all). ``run_pass(begin, left)``
    claims up to ``left`` jobs from tenant ``begin`` on and returns them with the tenants it served.
    Returns the claimed jobs and the next start (``None``: nothing was claimed, keep the cursor)."""
    claimed: list[T] = []
    next_start: str | None = None
    begin = start
    for _ in range(PASSES):
        left = limit - len(claimed)
        if left <= 0:
            break
        got, served = run_pass(begin, left)
        if got:
            claimed += got
            next_start = fair_start_after(served)
        elif not begin:
            break  # from the first tenant on, nothing is due
        begin = ""
    return claimed, next_start


def fair_claim(tenants_from: Callable[[str, int], list[str]], jobs_of: Callable[[str, int], list[T]],
               claim: Callable[[list[T]], list[T]], key: Callable[[T], tuple[object, ...]], start: str,
               limit: int, weights: Mapping[str, int] | None = None) -> tuple[list[T], str | None]:
    """One fair claim as SQLite and memory run it, inside the caller's lock (:func:`fair_passes`
    with a pass made of these steps). ``tenants_from(start, n)``: up to ``n`` tenants with due jobs
    from ``start`` in byte order; ``jobs_of(tenant, n)``: its first ``n`` due jobs in claim order;
    ``claim(jobs)``: move them to running (so a later pass does not see them again) and return them
    as claimed; ``weights``: jobs per turn by tenant (1 for the others; checked by the claim)."""

    def run_pass(begin: str, left: int) -> tuple[list[T], list[str | None]]:
        tenants = tenants_from(begin, left)
        weight = {tenant: weight_of(weights, tenant) for tenant in tenants}
        total = sum(weight.values())
        picked = fair_order([(weight[t], jobs_of(t, share(left, weight[t], total))) for t in tenants], key, left)
        # Every chosen tenant gets its first turn (there are at most ``left`` of them).
        return (claim(picked), list(tenants)) if picked else ([], [])

    return fair_passes(run_pass, start, limit)


def weight_of(weights: Mapping[str, int] | None, tenant: str | None) -> int:
    """A tenant's turns per round: its weight, else 1 (no tenant is ``''``)."""
    return 1 if weights is None else weights.get(tenant or "", 1)


#: The largest weight a tenant can be given (a turn of that many jobs).
MAX_WEIGHT = 1000


def check_weights(weights: Mapping[str, int] | None) -> None:
    """Refuse weights no claim can use, coded ``X_FAIR_WEIGHT`` and naming the tenant."""
    if weights is None:
        return
    if not isinstance(weights, Mapping):
        raise ConfigError(f"fair weights {weights!r} are not a mapping of tenant to weight",
                          'pass e.g. {"acme": 3} (acme gets 3 jobs per turn, every other tenant 1)',
                          code="X_FAIR_WEIGHT")
    for tenant, weight in weights.items():
        if not is_storable_text(tenant):
            raise ConfigError(f"fair weight for tenant {tenant!r}: not a tenant id",
                              "key the weights by tenant id (plain text; '' for jobs with no tenant)",
                              code="X_FAIR_WEIGHT")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise ConfigError(f"fair weight {weight!r} for tenant {tenant!r} is not a whole number in 1..{MAX_WEIGHT}",
                              f"give {tenant!r} a weight such as 3 (3 jobs per turn; 1 is everyone's default)",
                              code="X_FAIR_WEIGHT")


def weight_arrays(weights: Mapping[str, int] | None) -> tuple[list[str], list[int]]:
    """The weights as two parallel arrays (tenants, weights) for a SQL parameter."""
    items = sorted((weights or {}).items())
    return [tenant for tenant, _ in items], [weight for _, weight in items]
