"""What a pass checks before it reads a page: environment, ``requires``, its source's tables,
and — after the last page — ``count``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy import inspect as inspect_database
from sqlalchemy.engine import Engine
from sqlalchemy.sql import visitors
from sqlalchemy.sql.selectable import Select, TableClause

from ultimat3.backfill.awaiting import Awaiter
from ultimat3.backfill.definition import BackfillDefinition, BackfillError
from ultimat3.backfill.engines import LazyEngine, definition_engine
from ultimat3.backfill.registry import backfill_origin, get_backfill
from ultimat3.backfill.requires import MigrationError, MigrationRequirement, RequirementNotApplied, as_requirement
from ultimat3.core.context import Ctx, Environment
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver
from ultimat3.tenancy.guard import scoped

__all__ = [
    "check_environment",
    "check_requires",
    "check_source_tables",
    "count_remaining",
    "requirement_error",
    "source_statement",
    "tables_read",
]


def check_environment(definition: BackfillDefinition, environment: Environment) -> None:
    """Refuse with ``X_BACKFILL_ENVIRONMENT`` when ``environment`` is not one the backfill allows."""
    allowed = definition.environments
    if allowed is not None and environment not in allowed:
        raise BackfillError(
            f'backfill "{definition.name}" may run in {", ".join(allowed)}, not in "{environment}"',
            f'run it in one of those (X_ENV), or add "{environment}" to its environments=[...] '
            "if it belongs there too",
            code="X_BACKFILL_ENVIRONMENT",
        )


def check_requires(
    definition: BackfillDefinition, driver: JobDriver, engine: Callable[[], Engine] | None = None
) -> None:
    """Refuse with ``X_BACKFILL_REQUIRES`` when the declared migration is not applied."""
    if definition.requires is None:
        return
    error = requirement_error(
        driver, definition.name, definition.requires,
        engine if engine is not None else LazyEngine(definition, driver),
    )
    if error is not None:
        raise error


def count_remaining(definition: BackfillDefinition, ctx: Ctx, engine: Callable[[], Engine],
                    awaiter: Awaiter | None = None) -> int:
    """What the backfill's ``count(ctx)`` answers: an int, or a select whose rows are counted.

    A select is passed through :func:`~ultimat3.tenancy.scoped` first; an int is the author's
    own count, which they scope themselves.
    """
    assert definition.count is not None
    own = awaiter is None
    resolver = awaiter if awaiter is not None else Awaiter()
    try:
        value = resolver.resolve(definition.count(ctx))
    finally:
        if own:
            resolver.close()
    if isinstance(value, Select):
        statement = select(func.count()).select_from(scoped(value, ctx, bind=engine()).subquery())
        with engine().connect() as conn:
            value = conn.execute(statement).scalar_one()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackfillError(
            f'backfill "{definition.name}": count() returned {value!r}, not a number of rows',
            "return an int >= 0, or a select of the rows still to do (it is counted for you)",
            code="X_BACKFILL_COUNT",
        )
    return value


def source_statement(definition: BackfillDefinition, ctx: Ctx) -> Select[Any]:
    stmt = definition.source(ctx)
    if not isinstance(stmt, Select):
        raise BackfillError(
            f'backfill "{definition.name}": source(ctx) returned {type(stmt).__name__}, not a select',
            "return a sqlalchemy select, e.g. source=lambda ctx: select(posts).where(posts.c.slug.is_(None))",
            code="X_BACKFILL_SOURCE",
        )
    return stmt


def tables_read(stmt: Select[Any]) -> list[TableClause]:
    """Every table ``stmt`` reads, once each."""
    found: dict[tuple[str | None, str], TableClause] = {}
    for element in visitors.iterate(stmt):
        if isinstance(element, TableClause):
            found.setdefault((element.schema, element.name), element)
    return list(found.values())


def check_source_tables(definition: BackfillDefinition, statement: Select[Any], engine: Engine) -> None:
    """Refuse with ``X_BACKFILL_TABLE_MISSING`` when a table ``statement`` (the source's) reads is
    not in ``engine``.

    The engine a pass sweeps is a declaration, and a wrong one must not read as success: a table
    missing there means the pass is pointed at the wrong database.
    """
    inspector = inspect_database(engine)
    for table in tables_read(statement):
        if not inspector.has_table(table.name, schema=table.schema):
            where = engine.url.render_as_string(hide_password=True)
            qualified = f"{table.schema}.{table.name}" if table.schema else table.name
            raise BackfillError(
                f'backfill "{definition.name}" reads table "{qualified}", which does not exist in the database '
                f"its engine points at ({where})",
                f'pass engine= on backfill(name="{definition.name}") for the database that holds "{qualified}" '
                "(create_engine(...) or a function returning one)",
                code="X_BACKFILL_TABLE_MISSING",
            )


def requirement_error(
    driver: JobDriver,
    name: str,
    requires: str | MigrationRequirement | None = None,
    engine: Callable[[], Engine] | None = None,
) -> XError | None:
    """Why backfill ``name`` may not start for want of a migration, or ``None`` when it may.

    ``requires`` defaults to what the backfill declared. A string equal to the declared
    requirement's label (what ``registered_backfills()`` prints, e.g. ``alembic:<rev>``) means
    that declared requirement, so JSON from the registry can be checked; any other string is an
    ``x_migrations`` id. ``engine`` defaults to the backfill's app engine. Returns
    :class:`RequirementNotApplied` (``X_BACKFILL_REQUIRES``), or the :class:`MigrationError` that
    made the check impossible.
    """
    requirement: MigrationRequirement | None = None
    if requires is None or isinstance(requires, str):
        handle = get_backfill(name)
        definition = None if handle is None else backfill_origin(handle)
        declared = None if definition is None else definition.requires
        if declared is not None and (requires is None or requires == declared.label):
            requirement = declared
            if engine is None and definition is not None:
                engine = definition_engine(definition, driver)
    if requirement is None:
        if requires is None:
            return None
        requirement = as_requirement(requires)
    try:
        applied = requirement.is_applied(driver, engine)
    except MigrationError as error:
        return error
    if applied:
        return None
    return RequirementNotApplied(
        f'backfill "{name}" requires migration "{requirement.label}", which the {requirement.ledger} '
        "ledger does not show as applied",
        "apply the migration first (x db migrate, or alembic upgrade), then retry the job "
        "(x jobs retry ID) or enqueue the backfill again",
    )
