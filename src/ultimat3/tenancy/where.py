"""Adding a criterion to a statement without letting the criteria already there change its meaning.

``select.where(x)`` ANDs ``x`` onto the existing criteria as they are. A raw ``text("a IS NULL OR
b LIKE 'x'")`` or ``literal_column`` criterion is not parenthesised by SQLAlchemy, so the result
reads ``a IS NULL OR b LIKE 'x' AND org_id = :org`` — and ``AND`` binds tighter than ``OR``: the
org filter would only apply to one side. Every existing criterion is grouped first.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from sqlalchemy.sql.elements import ColumnElement, Grouping

__all__ = ["and_where", "and_where_in_place"]

StmtT = TypeVar("StmtT")


def and_where(stmt: StmtT, *criteria: ColumnElement[bool]) -> StmtT:
    """``stmt`` (a select, update or delete) with ``criteria`` ANDed onto its WHERE, each existing
    criterion parenthesised first so no ``OR`` inside it can escape. Returns a copy."""
    generative: Any = stmt
    existing: tuple[Any, ...] = getattr(generative, "_where_criteria", ())
    # SQLAlchemy offers no public way to rewrite criteria already added, only to append; this is
    # the attribute `.where()` appends to (2.0 and 2.1). test_and_where_groups_existing_criteria in
    # tests/unit/test_tenancy_enqueue.py fails loudly if it ever stops being honoured.
    copy = generative._generate()
    copy._where_criteria = tuple(Grouping(criterion) for criterion in existing)
    return cast(StmtT, copy.where(*criteria))


def and_where_in_place(stmt: Any, *criteria: ColumnElement[bool]) -> None:
    """As :func:`and_where`, on a statement the caller owns (a clone made by a traversal)."""
    existing: tuple[Any, ...] = stmt._where_criteria
    stmt._where_criteria = tuple(Grouping(criterion) for criterion in existing) + tuple(criteria)
