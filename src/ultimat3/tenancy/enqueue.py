"""Who may enqueue what: the check every enqueue passes before anything is written.

Losing the request's context must never widen what code can do. A thread or executor started
from a request falls back to an ambient context with no org and no grant, and that context may
enqueue nothing tenanted — it is refused, not treated as "the system".
"""

from __future__ import annotations

from ultimat3.core.context import CROSS_TENANT_SCOPE, OPERATOR_SCOPE, SYSTEM_SCOPE, Ctx
from ultimat3.tenancy.guard import TenancyError

__all__ = ["ENQUEUE_ANY_SCOPES", "check_enqueue", "check_stored_tenant"]

#: Live grants that let a context enqueue work for any org, or for none.
ENQUEUE_ANY_SCOPES = (OPERATOR_SCOPE, SYSTEM_SCOPE, CROSS_TENANT_SCOPE)


def check_enqueue(ctx: Ctx, job_name: str, tenant_id: str | None) -> None:
    """Refuse an enqueue the acting context may not make (coded, before any write).

    - work for org X: the actor acts for X, or holds a live operator/system/cross grant;
    - work for no org (``tenant='none'``, a cross-tenant backfill included): only with such a grant.
    """
    actor = ctx.actor
    if ctx.holds(*ENQUEUE_ANY_SCOPES):
        return
    if tenant_id is None:
        raise TenancyError(
            f'job "{job_name}" belongs to no org (tenant=\'none\') and actor "{actor.id}" holds no live '
            f"operator, system or cross-tenant grant to enqueue it",
            "enqueue it from the x CLI, from inside operator_context(actor_id, reason), or from a run of "
            "another tenant='none' job — an org's request may not start work over every org",
            code="X_TENANCY_ENQUEUE_DENIED",
        )
    if actor.org_id == tenant_id:
        return
    if actor.org_id is not None:
        raise TenancyError(
            f'job "{job_name}" resolves to org {tenant_id!r} but the current actor acts for org {actor.org_id!r}',
            "enqueue it from a context of that org, or from an operator context",
            code="X_TENANCY_MISMATCH",
        )
    raise TenancyError(
        f'job "{job_name}" resolves to org {tenant_id!r} but actor "{actor.id}" acts for no org and holds no '
        "live operator or system grant (a thread or executor that lost its request's context looks like this)",
        "install the request's context in the thread (contextvars.copy_context().run, asyncio.to_thread), "
        "or enqueue from inside operator_context(actor_id, reason)",
        code="X_TENANCY_NO_ACTOR",
    )


def check_stored_tenant(job_name: str, stored: str | None, computed: str | None) -> TenancyError | None:
    """At claim: the org a row says it belongs to must be the org its input resolves to."""
    if stored == computed:
        return None
    return TenancyError(
        f'job "{job_name}" is stored for org {stored!r} but its input resolves to org {computed!r}; '
        "it was not enqueued through its declaration, so it is not run",
        "enqueue jobs through their handle (job.enqueue), never by writing rows with another tenant_id",
        code="X_TENANCY_MISMATCH",
    )
