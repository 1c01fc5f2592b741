"""The tenant guard for SQLAlchemy Core statements.

A table opts in with :func:`~ultimat3.tenancy.tables.tenanted`. :func:`scoped` then filters every
statement that reads or writes such a table to the acting org, at every level (joins, aliases at
any depth, tablesamples, subqueries, CTEs, ``IN``/``EXISTS`` subselects, ``UPDATE``/``DELETE``).

It fails closed: a FROM or a raw SQL fragment it cannot prove scoped (``text()`` as a FROM or a
subquery source, a ``literal_column`` or ``text`` criterion that could itself read a table, an
alias of a join, a table-valued function it does not know, and — when given a ``bind`` — a view
not declared tenanted) is refused with ``X_TENANCY_UNPROVEN``, unless the plan runs under a live
cross-tenant grant. With no org on the actor, a statement over a tenanted table is refused with
``X_TENANCY_CROSS_DENIED`` unless that grant is there — and only a ``backfill(tenant='none')``
pass holds one, for as long as the pass runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from sqlalchemy import column as sa_column
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql import visitors
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ClauseElement, ColumnClause, ColumnElement, TextClause
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.selectable import (
    AliasedReturnsRows,
    CompoundSelect,
    Exists,
    FromClause,
    Join,
    ScalarSelect,
    Select,
    TableClause,
    TextualSelect,
    Values,
)

from ultimat3.core.context import CROSS_TENANT_SCOPE, Ctx, current_ctx, use_ctx
from ultimat3.core.errors import XError, check
from ultimat3.tenancy.tables import base_of, registered_tenant_column, tenant_column
from ultimat3.tenancy.views import is_view
from ultimat3.tenancy.where import and_where_in_place

__all__ = [
    "NO_CROSS_TENANT_REASON",
    "SAFE_TABLE_FUNCTIONS",
    "TenancyError",
    "TenancyUnprovenError",
    "cross_tenant",
    "scoped",
]

#: The reason reported when a plan was built outside any cross-tenant scope.
NO_CROSS_TENANT_REASON = "no cross-tenant scope was opened"
#: Table-valued functions that produce rows from their arguments and read no table.
SAFE_TABLE_FUNCTIONS = frozenset({
    "generate_series", "unnest", "json_each", "json_tree", "jsonb_each", "jsonb_each_text", "json_each_text",
    "json_array_elements", "jsonb_array_elements", "json_array_elements_text", "jsonb_array_elements_text",
    "json_to_recordset", "jsonb_to_recordset", "json_populate_recordset", "jsonb_populate_recordset",
})
# Words that let a raw fragment read (or write) a table of its own. A fragment without any of them
# is a predicate or an expression over columns the guard already scopes; one with them is not
# something the guard can prove anything about. False positives (the word inside a quoted
# literal) are refused too: bind the literal as a parameter instead.
_READS_TABLES = re.compile(
    r"\b(select|from|join|table|union|intersect|except|with|into|update|delete|insert|values|copy|lateral)\b",
    re.IGNORECASE,
)

StmtT = TypeVar("StmtT", bound=ClauseElement)


class TenancyError(XError):
    """A plan would read (or was asked to read) across tenants without the capability."""

    code = "X_TENANCY_CROSS_DENIED"
    # Retrying cannot grant a capability: the run would fail the same way every attempt.
    retryable = False


class TenancyUnprovenError(TenancyError):
    """The guard met a FROM or a raw fragment it cannot prove scoped, and refused the statement."""

    code = "X_TENANCY_UNPROVEN"


def _unproven(what: str) -> TenancyUnprovenError:
    shown = what if len(what) <= 160 else what[:157] + "..."
    return TenancyUnprovenError(
        f"the tenant guard cannot prove this statement scoped: {shown}",
        "build it from tenanted Tables and SQLAlchemy constructs (bind literals as parameters), declare the "
        "view or table with tenanted(...), or run it in a cross-tenant scope: "
        "backfill(tenant='none') then cross_tenant(reason)",
    )


def _deny(ctx: Ctx, tables: list[str]) -> TenancyError:
    reason = ctx.cross_tenant_reason or NO_CROSS_TENANT_REASON
    return TenancyError(
        f"a statement over tenanted table(s) {', '.join(sorted(set(tables)))} was built for actor "
        f'"{ctx.actor.id}", which acts for no org and holds no live "{CROSS_TENANT_SCOPE}" grant '
        f"(plan built under: {reason})",
        "run it in a context whose actor has an org_id, or declare the sweep as "
        "backfill(tenant='none') — the only place the cross-tenant capability is granted",
    )


def _label(from_: FromClause) -> str:
    base = base_of(from_)
    name = getattr(base, "name", None) or str(base)
    alias = getattr(from_, "name", None)
    return f"{name} (as {alias})" if from_ is not base and alias and alias != name else str(name)


def _org_column(from_: FromClause, column: str) -> ColumnElement[Any]:
    found = from_.c.get(column)
    if found is not None:
        return found
    # A lightweight sa.table() that did not list the org column still names the real table.
    return sa_column(column, _selectable=from_)


class _Plan:
    """What one statement level reads: its tenanted surfaces, checked against the context."""

    def __init__(self, ctx: Ctx, bind: Engine | Connection | None) -> None:
        self.ctx = ctx
        self.bind = bind
        self.cross = ctx.holds(CROSS_TENANT_SCOPE)

    def refuse(self, what: str) -> None:
        if not self.cross:
            raise _unproven(what)

    def plain_table(self, table: TableClause) -> None:
        if self.bind is not None and is_view(self.bind, table.schema, table.name):
            self.refuse(f'view "{table.name}" is not declared tenanted')

    def surfaces(self, from_: Any, out: list[tuple[FromClause, str]]) -> None:
        """Collect (from, org column) for every tenanted table this level reads; refuse the unknown."""
        if isinstance(from_, Join):
            self.surfaces(from_.left, out)
            self.surfaces(from_.right, out)
            return
        if isinstance(from_, TableClause):
            column = registered_tenant_column(from_.schema, from_.name)
            if column is not None:
                out.append((from_, column))
            else:
                self.plain_table(from_)
            return
        if isinstance(from_, AliasedReturnsRows):
            base = base_of(from_)
            if isinstance(base, TableClause):
                column = tenant_column(from_)
                if column is not None:
                    out.append((from_, column))
                else:
                    self.plain_table(base)
            elif isinstance(base, Select | CompoundSelect | Values):
                pass  # a subquery/CTE/LATERAL: the select inside is scoped where its columns live
            elif isinstance(base, TextualSelect):
                self.refuse(f"a text() subquery: {str(base.element)!r}")
            elif isinstance(base, FunctionElement):
                self.function(base)
            else:
                self.refuse(f"an alias of {type(base).__name__} ({_label(from_)})")
            return
        if isinstance(from_, FunctionElement):
            self.function(from_)
            return
        if isinstance(from_, Values):
            return
        if isinstance(from_, TextClause):
            self.refuse(f"a text() FROM: {from_.text!r}")
            return
        self.refuse(f"a FROM of type {type(from_).__name__}")

    def function(self, fn: FunctionElement[Any]) -> None:
        name = str(getattr(fn, "name", "")).lower()
        if name not in SAFE_TABLE_FUNCTIONS:
            self.refuse(f"the table-valued function {name or type(fn).__name__}()")

    def filter(self, stmt: Any, surfaces: list[tuple[FromClause, str]]) -> None:
        """Add the org filter for ``surfaces`` to ``stmt`` (a clone this plan owns), or refuse."""
        if not surfaces:
            return
        org = self.ctx.actor.org_id
        if org is None:
            if self.cross:
                return
            raise _deny(self.ctx, [_label(f) for f, _ in surfaces])
        and_where_in_place(stmt, *(_org_column(f, c) == org for f, c in surfaces))


def _raw_fragments(stmt: ClauseElement, plan: _Plan) -> None:
    """Refuse raw SQL anywhere in the statement that could read a table of its own."""
    for element in visitors.iterate(stmt):
        if isinstance(element, TextualSelect):
            plan.refuse(f"a text() subquery: {str(element.element)!r}")
        elif isinstance(element, TextClause):
            if _READS_TABLES.search(element.text):
                plan.refuse(f"the raw fragment text({element.text!r})")
        elif isinstance(element, ColumnClause) and element.is_literal and _READS_TABLES.search(str(element.name)):
            plan.refuse(f"the raw fragment literal_column({element.name!r})")


def _correlated_tables(clause: ClauseElement | None) -> list[FromClause]:
    # The tables a DML WHERE reads at its own level (UPDATE ... FROM), not those of its subselects.
    found: list[FromClause] = []
    stack: list[Any] = [] if clause is None else [clause]
    while stack:
        element = stack.pop()
        if isinstance(element, Select | ScalarSelect | Exists | CompoundSelect):
            continue
        if isinstance(element, ColumnClause) and isinstance(element.table, FromClause):
            if element.table not in found:
                found.append(element.table)
            continue
        stack.extend(element.get_children())
    return found


def _scope_dml(stmt: Any, plan: _Plan) -> None:
    target = stmt.table
    surfaces: list[tuple[FromClause, str]] = []
    plan.surfaces(target, surfaces)
    if isinstance(stmt, Insert):
        if surfaces and plan.ctx.actor.org_id is None and not plan.cross:
            raise _deny(plan.ctx, [_label(target)])
        if surfaces and plan.ctx.actor.org_id is not None:
            _check_insert_org(stmt, surfaces[0][1], plan.ctx.actor.org_id, _label(target))
        return
    for table in _correlated_tables(stmt.whereclause):
        if table is not target:
            plan.surfaces(table, surfaces)
    plan.filter(stmt, surfaces)


def _check_insert_org(stmt: Insert, column: str, org: str, table: str) -> None:
    params = stmt.compile().params
    for key, value in params.items():
        if (key == column or re.fullmatch(re.escape(column) + r"_m\d+", key)) and value is not None and value != org:
            raise TenancyError(
                f'an insert into tenanted table {table} writes {column}={value!r} for an actor of org {org!r}',
                f"write rows of the acting org only ({column}={org!r}), or run it from that org's context",
                code="X_TENANCY_MISMATCH",
            )


def _scope_tree(stmt: StmtT, plan: _Plan) -> StmtT:
    # One cloning traversal of the whole statement: every element is cloned once (a recursive
    # CTE's reference to itself resolves to the same clone), and each select / DML clone gets the
    # filter for its own FROM list after its children were cloned. The caller's statement is
    # never modified.
    def on_select(select: Select[Any]) -> None:
        surfaces: list[tuple[FromClause, str]] = []
        for from_ in select.get_final_froms():
            plan.surfaces(from_, surfaces)
        plan.filter(select, surfaces)

    def on_dml(statement: Any) -> None:
        _scope_dml(statement, plan)

    visitors_by_name = {"select": on_select, "update": on_dml, "delete": on_dml, "insert": on_dml}
    return visitors.cloned_traverse(stmt, {}, visitors_by_name)


def scoped(stmt: StmtT, ctx: Ctx | None = None, *, bind: Engine | Connection | None = None) -> StmtT:
    """``stmt`` filtered to ``ctx.actor.org_id`` on every tenanted table it reads or writes.

    ``ctx`` defaults to the ambient context. Every select level is scoped, and ``UPDATE``/
    ``DELETE`` get the same filter on their target (an ``INSERT`` into a tenanted table must not
    name another org). With no org on the actor, a statement over a tenanted table comes back
    unchanged under a live cross-tenant grant and is refused otherwise (``X_TENANCY_CROSS_DENIED``,
    naming the tables and the reason the plan was built under). What the guard cannot classify
    is refused as ``X_TENANCY_UNPROVEN`` (see the module doc). ``bind`` (an Engine or Connection)
    lets it also refuse views not declared tenanted. A statement over no tenanted table comes back
    as it is (a copy).
    """
    plan = _Plan(ctx if ctx is not None else current_ctx(), bind)
    if isinstance(stmt, TextClause):
        plan.refuse(f"a whole text() statement: {stmt.text!r}")
        return stmt
    _raw_fragments(stmt, plan)
    return _scope_tree(stmt, plan)


@contextmanager
def cross_tenant(reason: str) -> Iterator[Ctx]:
    """Open a cross-tenant scope for the ``with`` block, recording ``reason`` on the context.

    The ambient context must already hold a live ``tenancy:cross`` grant: this records WHY plans
    skip the tenant filter, it never grants the capability. Refused with ``X_TENANCY_CROSS_DENIED``.
    """
    check(
        isinstance(reason, str) and reason.strip() != "",
        f"cross_tenant({reason!r}) — a cross-tenant scope needs a reason",
        'say why in words an auditor can read, e.g. cross_tenant("nightly usage rollup over every org")',
        code="X_TENANCY_REASON",
    )
    ctx = current_ctx()
    if not ctx.holds(CROSS_TENANT_SCOPE):
        raise TenancyError(
            f'cross_tenant("{reason}") was opened by actor "{ctx.actor.id}", which holds no live '
            f'"{CROSS_TENANT_SCOPE}" grant',
            "only a backfill(tenant='none') pass holds it, while it runs; read one org at a time, or "
            "move the cross-tenant work into such a backfill",
        )
    with use_ctx(replace(ctx, cross_tenant_reason=reason)) as inner:
        yield inner
