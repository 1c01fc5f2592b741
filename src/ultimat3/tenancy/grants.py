"""Granting a tenancy capability for a scope, and revoking it when the scope ends.

Three capabilities exist (constants in :mod:`ultimat3.core.context`):

- ``tenancy:cross`` — read every org's rows. Granted ONLY to a ``backfill(tenant='none')`` pass.
- ``tenancy:operator`` — enqueue work for any org, or for none. Granted by :func:`operator_context`
  (the ``x`` CLI opens one per command; a script that acts as an operator says so the same way).
- ``tenancy:system`` — the same, for the run of a ``tenant='none'`` job (fan-out to each org).

Each lives on a :class:`~ultimat3.core.context.Grant` that is revoked when its ``with`` block ends,
so a context kept past its scope keeps nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from ultimat3.core.context import OPERATOR_SCOPE, Actor, Ctx, Grant, current_ctx, use_ctx
from ultimat3.core.errors import check

__all__ = ["granted", "operator_context"]


@contextmanager
def granted(ctx: Ctx, scope: str, reason: str) -> Iterator[Ctx]:
    """A copy of ``ctx`` holding a live grant of ``scope``, installed as the ambient context for
    the block; the grant is revoked when the block ends, however it ends."""
    grant = Grant(scope, reason)
    inner = replace(ctx, grants=(*ctx.grants, grant))
    try:
        with use_ctx(inner):
            yield inner
    finally:
        grant.revoke()


@contextmanager
def operator_context(actor_id: str, reason: str) -> Iterator[Ctx]:
    """Act as an operator for the block: enqueue work for any org, or for none.

    ``actor_id`` is recorded as ``enqueued_by`` on what is enqueued; ``reason`` says why, for the
    audit trail. It grants no cross-tenant READS: those belong to ``backfill(tenant='none')``.
    """
    check(
        isinstance(actor_id, str) and actor_id.strip() != "" and isinstance(reason, str) and reason.strip() != "",
        f"operator_context({actor_id!r}, {reason!r}) — an operator context needs an actor id and a reason",
        'write operator_context("ops:alice", "re-run failed invoices after the outage")',
        code="X_TENANCY_REASON",
    )
    base = current_ctx()
    ctx = Ctx(actor=Actor(id=actor_id), environment=base.environment, traceparent=base.traceparent)
    with granted(ctx, OPERATOR_SCOPE, reason) as inner:
        yield inner
