"""The cross-tenant grant: ONLY a backfill declared ``tenant='none'``, only for its own pass.

It has to be granted inside the pass: ``source`` is lazy, so the pages' statements are built (and
scoped) inside the pass, long after the declaring code returned — an author has nothing to
wrap in ``cross_tenant()`` themselves.

Why not give the worker's identity the capability instead: that would hand it to every job the
worker claims, including a plain ``job(tenant='none')`` that declared no sweep, and put the
decision in deployment config where no reviewer sees it. Here it is bounded four ways: only
``backfill()``, only ``tenant='none'``, only during the pass, only on a context that dies with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ultimat3.core.context import CROSS_TENANT_SCOPE, Ctx
from ultimat3.jobs.job import NO_TENANT
from ultimat3.tenancy.grants import granted
from ultimat3.tenancy.guard import cross_tenant

__all__ = [
    "backfill_scope",
    "cross_tenant_reason",
]


def cross_tenant_reason(name: str) -> str:
    """The audit reason a ``tenant='none'`` pass runs under; it names the backfill."""
    # Specific on purpose: it is rendered in X_TENANCY_CROSS_DENIED and read by whoever asks why a
    # plan skipped its tenant, so "backfill" alone would name every sweep the same.
    return f"backfill \"{name}\" declared tenant='none', so its pass reads every tenant's rows"


@contextmanager
def backfill_scope(name: str, tenant: Any, ctx: Ctx) -> Iterator[Ctx]:
    """The context a backfill's pass runs in.

    A tenanted backfill gets ``ctx`` untouched (its actor already acts for the run's org). A
    ``tenant='none'`` backfill gets a copy holding a live ``tenancy:cross`` grant, inside a
    ``cross_tenant`` scope whose reason names the backfill. The grant is revoked when the block
    ends: a ``batch.ctx`` a handler kept is refused by the guard after the pass.
    """
    if tenant != NO_TENANT:
        yield ctx
        return
    reason = cross_tenant_reason(name)
    # The granted context is installed FIRST: cross_tenant() checks the ambient context.
    with granted(ctx, CROSS_TENANT_SCOPE, reason), cross_tenant(reason) as inner:
        yield inner
