"""Which database tables are tenanted: a property of the table (schema + name), not of one Python object.

A second ``Table`` for the same table (reflected, or declared in another ``MetaData``), a
lightweight ``sa.table("customers", ...)`` and an alias of any of them at any depth all resolve to
the same registration, so none of them is a way around the guard.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Table
from sqlalchemy.sql.selectable import AliasedReturnsRows, FromClause, TableClause

from ultimat3.core.errors import check

__all__ = ["TENANT_COLUMN_KEY", "base_of", "registered_tenant_column", "tenant_column", "tenanted"]

#: Where :func:`tenanted` also records the org column, in ``Table.info`` (for people reading a table).
TENANT_COLUMN_KEY = "ultimat3.tenant_column"

# (schema, name) -> org column. Schema ``None`` means "whatever the search path finds".
_registry: dict[tuple[str | None, str], str] = {}
_lock = threading.Lock()


def tenanted(table: TableClause, column: str = "org_id") -> TableClause:
    """Opt the database table behind ``table`` into the guard: every statement :func:`scoped`
    sees over it — through this object or any other naming the same table — filters on ``column``.

    A view over tenanted rows is declared the same way (its org column named). Returns the table,
    so ``posts = tenanted(Table("posts", ...))`` reads naturally.
    """
    check(
        isinstance(table, TableClause),
        f"tenanted({table!r}) — only a SQLAlchemy Table (or sa.table) can be tenanted",
        'pass the Table object: tenanted(posts, column="org_id")',
        code="X_TENANCY_TABLE",
    )
    check(
        isinstance(column, str) and column in table.c,
        f'tenanted({table.name}, column={column!r}) — table "{table.name}" has no column {column!r}',
        f"name the column that holds the org id; {table.name} has: {', '.join(table.c.keys())}",
        code="X_TENANCY_COLUMN",
    )
    key = (table.schema, table.name)
    with _lock:
        known = _registry.get(key)
        check(
            known is None or known == column,
            f'tenanted({table.name}, column={column!r}) — table "{table.name}" is already tenanted on {known!r}',
            "a table has one org column: declare it once, with the same column everywhere",
            code="X_TENANCY_COLUMN",
        )
        _registry[key] = column
    if isinstance(table, Table):  # a lightweight sa.table() has no .info to annotate
        table.info[TENANT_COLUMN_KEY] = column
    return table


def registered_tenant_column(schema: str | None, name: str) -> str | None:
    """The org column registered for the table ``schema.name``, or ``None``.

    An unqualified name on either side matches any schema: the guard cannot know the search path,
    so it treats a possible match as a match (fail closed).
    """
    with _lock:
        exact = _registry.get((schema, name))
        if exact is not None:
            return exact
        for (registered_schema, registered_name), column in _registry.items():
            if registered_name == name and (registered_schema is None or schema is None):
                return column
    return None


def base_of(from_: Any) -> Any:
    """What an alias (of an alias, of a tablesample, ...) finally names: a table, a select, a
    function, a join — whatever is under every layer of aliasing."""
    for _ in range(1000):  # a cycle cannot be built, but a guard never loops forever
        if not isinstance(from_, AliasedReturnsRows):
            return from_
        from_ = from_.element
    return from_


def tenant_column(from_: FromClause) -> str | None:
    """The org column of a tenanted table, or of an alias of one at any depth; ``None`` otherwise."""
    base = base_of(from_)
    if not isinstance(base, TableClause):
        return None
    return registered_tenant_column(base.schema, base.name)
