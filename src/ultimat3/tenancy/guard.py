"""The tenant guard for SQLAlchemy Core selects.

A table opts in with :func:`tenanted`. :func:`scoped` then filters every select that reads such a
table to the acting org, at every level of the statement (joins, aliases, subqueries, CTEs,
``IN``/``EXISTS`` subselects). With no org on the actor the select is refused, unless the actor
carries :data:`~ultimat3.core.CROSS_TENANT_SCOPE` — which only a ``backfill(tenant='none')`` pass
grants, and only to itself (see ``ultimat3.jobs.backfill_scope``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from sqlalchemy import Table
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import ClauseElement, ColumnElement
from sqlalchemy.sql.selectable import Alias, FromClause, Join, Select

from ultimat3.core.context import CROSS_TENANT_SCOPE, Ctx, current_ctx, use_ctx
from ultimat3.core.errors import XError, check

__all__ = [
    "NO_CROSS_TENANT_REASON",
    "TENANT_COLUMN_KEY",
    "TenancyError",
    "cross_tenant",
    "scoped",
    "tenant_column",
    "tenanted",
]

#: Where :func:`tenanted` records the org column, in ``Table.info``.
TENANT_COLUMN_KEY = "ultimat3.tenant_column"
#: The reason reported when a plan was built outside any cross-tenant scope.
NO_CROSS_TENANT_REASON = "no cross-tenant scope was opened"

StmtT = TypeVar("StmtT", bound=ClauseElement)


class TenancyError(XError):
    """A plan would read (or was asked to read) across tenants without the capability."""

    code = "X_TENANCY_CROSS_DENIED"
    # Retrying cannot grant a capability: the run would fail the same way every attempt.
    retryable = False


def tenanted(table: Table, column: str = "org_id") -> Table:
    """Opt ``table`` into the guard: every select :func:`scoped` sees filters on ``column``.

    Returns the table, so ``posts = tenanted(Table("posts", ...))`` reads naturally.
    """
    check(
        isinstance(table, Table),
        f"tenanted({table!r}) — only a SQLAlchemy Table can be tenanted",
        'pass the Table object: tenanted(posts, column="org_id")',
        code="X_TENANCY_TABLE",
    )
    check(
        isinstance(column, str) and column in table.c,
        f'tenanted({table.name}, column={column!r}) — table "{table.name}" has no column {column!r}',
        f"name the column that holds the org id; {table.name} has: {', '.join(table.c.keys())}",
        code="X_TENANCY_COLUMN",
    )
    table.info[TENANT_COLUMN_KEY] = column
    return table


def tenant_column(table: FromClause) -> str | None:
    """The org column of a tenanted table (or of an alias of one); ``None`` when not tenanted."""
    base = table.element if isinstance(table, Alias) else table
    if not isinstance(base, Table):
        return None
    value = base.info.get(TENANT_COLUMN_KEY)
    return value if isinstance(value, str) else None


def _surfaces(from_: FromClause, out: list[FromClause]) -> None:
    # A join's two sides are both read by the select that owns the join. A subquery or CTE is
    # NOT expanded here: the select inside it is scoped on its own, where its columns live.
    if isinstance(from_, Join):
        _surfaces(from_.left, out)
        _surfaces(from_.right, out)
    elif tenant_column(from_) is not None:
        out.append(from_)


def _tenanted_froms(select: Select[Any]) -> list[FromClause]:
    found: list[FromClause] = []
    for from_ in select.get_final_froms():
        _surfaces(from_, found)
    return found


def _label(from_: FromClause) -> str:
    if isinstance(from_, Alias) and isinstance(from_.element, Table):
        return f"{from_.element.name} (as {from_.name})"
    return str(getattr(from_, "name", from_))


def _deny(ctx: Ctx, tables: list[str]) -> TenancyError:
    reason = ctx.cross_tenant_reason or NO_CROSS_TENANT_REASON
    return TenancyError(
        f"a select over tenanted table(s) {', '.join(sorted(set(tables)))} was built for actor "
        f'"{ctx.actor.id}", which acts for no org and lacks the "{CROSS_TENANT_SCOPE}" capability '
        f"(plan built under: {reason})",
        "run it in a context whose actor has an org_id, or declare the sweep as "
        "backfill(tenant='none') — the only place the cross-tenant capability is granted",
    )


def _scope_one(select: Select[Any], ctx: Ctx) -> Select[Any]:
    froms = _tenanted_froms(select)
    if not froms:
        return select
    org = ctx.actor.org_id
    if org is None:
        if CROSS_TENANT_SCOPE in ctx.actor.scopes:
            return select
        raise _deny(ctx, [_label(f) for f in froms])
    criteria: list[ColumnElement[bool]] = []
    for from_ in froms:
        column = tenant_column(from_)
        assert column is not None
        criteria.append(from_.c[column] == org)
    return select.where(*criteria)


def _scope_tree(stmt: StmtT, ctx: Ctx) -> StmtT:
    # Bottom-up: every nested select is replaced by its scoped copy first, then the filter for
    # this level's own FROM list is added. replacement_traverse clones what it walks, so the
    # caller's statement is never modified.
    def replace_nested(element: Any, **_: Any) -> Any:
        if element is stmt:
            return None
        if isinstance(element, Select):
            return _scope_tree(element, ctx)
        return None

    target: visitors.ExternallyTraversible = stmt
    rebuilt: Any = visitors.replacement_traverse(target, {}, replace_nested)
    if isinstance(rebuilt, Select):
        return _scope_one(rebuilt, ctx)  # type: ignore[return-value]
    return rebuilt  # type: ignore[no-any-return]


def scoped(stmt: StmtT, ctx: Ctx | None = None) -> StmtT:
    """``stmt`` filtered to ``ctx.actor.org_id`` on every tenanted table it reads.

    ``ctx`` defaults to the ambient context. Every select level is scoped (joins, aliases,
    subqueries, CTEs, ``IN``/``EXISTS``). When the actor has no org, the statement comes back
    unchanged if the actor holds ``tenancy:cross``, and is refused otherwise with
    ``X_TENANCY_CROSS_DENIED`` naming the tables and the reason the plan was built under. A
    statement that reads no tenanted table is returned as it is (a copy).
    """
    return _scope_tree(stmt, ctx if ctx is not None else current_ctx())


@contextmanager
def cross_tenant(reason: str) -> Iterator[Ctx]:
    """Open a cross-tenant scope for the ``with`` block, recording ``reason`` on the context.

    The ambient actor must already hold ``tenancy:cross``: this records WHY plans skip the
    tenant filter, it never grants the capability. Refused with ``X_TENANCY_CROSS_DENIED``.
    """
    check(
        isinstance(reason, str) and reason.strip() != "",
        f"cross_tenant({reason!r}) — a cross-tenant scope needs a reason",
        'say why in words an auditor can read, e.g. cross_tenant("nightly usage rollup over every org")',
        code="X_TENANCY_REASON",
    )
    ctx = current_ctx()
    if CROSS_TENANT_SCOPE not in ctx.actor.scopes:
        raise TenancyError(
            f'cross_tenant("{reason}") was opened by actor "{ctx.actor.id}", which lacks the '
            f'"{CROSS_TENANT_SCOPE}" capability',
            "only a backfill(tenant='none') pass holds it; read one org at a time, or move the "
            "cross-tenant work into such a backfill",
        )
    with use_ctx(replace(ctx, cross_tenant_reason=reason)) as inner:
        yield inner
