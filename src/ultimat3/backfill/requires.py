"""What a backfill's ``requires=`` is checked against: "is migration M applied?".

Two ledgers can answer. The library's own ``x_migrations`` table (through ``driver.migrations``),
which a plain string names; and an app's alembic history, through :func:`alembic_revision`, which
asks whether a revision is at or below one of the database's current heads. alembic is an
optional dependency and is imported only when such a requirement is checked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from ultimat3.core.errors import XError, check
from ultimat3.drivers.protocol import JobDriver

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = [
    "AlembicRevision",
    "MigrationError",
    "MigrationRequirement",
    "RequirementNotApplied",
    "XMigration",
    "alembic_revision",
    "as_requirement",
    "x_migration",
]


class MigrationError(XError):
    """A requirement could not be checked at all (unknown revision, alembic missing)."""

    code = "X_MIGRATION"
    # A revision the script directory does not know stays unknown on every retry.
    retryable = False


class RequirementNotApplied(XError):
    """A backfill's ``requires`` migration is not applied, so its pass may not start."""

    code = "X_BACKFILL_REQUIRES"
    # Not retryable: a migration is applied by a deploy, not by waiting out a backoff, and a dead
    # job carrying this message is the clearest signal an operator gets. Retry it by hand after.
    retryable = False


@runtime_checkable
class MigrationRequirement(Protocol):
    """One migration a backfill needs applied before its pass may start."""

    @property
    def label(self) -> str:
        """How registries and the CLI print it (``x_migrations`` ids bare, alembic as ``alembic:<rev>``)."""
        ...

    @property
    def ledger(self) -> str:
        """Which ledger answers, for messages (``x_migrations``, ``alembic``)."""
        ...

    def is_applied(self, driver: JobDriver, engine: Callable[[], Engine] | None = None) -> bool:
        """Whether it is applied. ``engine`` is the app database, for ledgers that live there."""
        ...


@dataclass(frozen=True)
class XMigration:
    """A migration id in the library's ``x_migrations`` ledger."""

    id: str

    @property
    def label(self) -> str:
        """The id itself."""
        return self.id

    @property
    def ledger(self) -> str:
        """``x_migrations``."""
        return "x_migrations"

    def is_applied(self, driver: JobDriver, engine: Callable[[], Engine] | None = None) -> bool:
        """Whether ``driver.migrations`` records the id."""
        return driver.migrations.is_applied(self.id)


def x_migration(migration_id: str) -> XMigration:
    """A requirement on the ``x_migrations`` ledger (what a plain ``requires="..."`` means)."""
    check(
        isinstance(migration_id, str) and migration_id.strip() != "",
        f"x_migration({migration_id!r}) — a migration id is a non-empty string",
        'write the id x_migrations records, e.g. "20260814120000_add_publish_at"',
        code="X_MIGRATION",
    )
    return XMigration(migration_id)


@dataclass(frozen=True)
class AlembicRevision:
    """A revision in an alembic history, applied when it is an ancestor of (or is) a current head.

    The script directory comes from ``config`` (an ``alembic.ini`` path or an
    ``alembic.config.Config``) or ``script_location``; the current heads are read from
    ``version_table`` through ``engine`` (default: the backfill's own app engine).
    """

    revision: str
    script_location: str | None = None
    config: Any = None
    engine: Any = field(default=None, compare=False)
    version_table: str = "alembic_version"
    version_table_schema: str | None = None

    @property
    def label(self) -> str:
        """``alembic:<revision>``."""
        return f"alembic:{self.revision}"

    @property
    def ledger(self) -> str:
        """``alembic``."""
        return "alembic"

    def _script(self) -> Any:
        try:
            from alembic.config import Config
            from alembic.script import ScriptDirectory
        except ImportError as error:  # pragma: no cover - depends on the install
            raise MigrationError(
                f'requires=alembic_revision("{self.revision}") but alembic is not installed',
                "pip install 'ultimat3[alembic]', or require an x_migrations id instead",
            ) from error
        config = self.config
        if isinstance(config, str | os.PathLike):
            config = Config(os.fspath(config))
        if config is not None:
            return ScriptDirectory.from_config(config)
        assert self.script_location is not None
        return ScriptDirectory(self.script_location)

    def _engine(self, fallback: Callable[[], Engine] | None) -> Engine:
        source = self.engine
        if source is None:
            if fallback is None:
                raise MigrationError(
                    f'alembic revision "{self.revision}": no database to read {self.version_table} from',
                    "pass alembic_revision(..., engine=engine) or give the backfill an engine=",
                )
            return fallback()
        return cast("Engine", source() if callable(source) else source)

    def is_applied(self, driver: JobDriver, engine: Callable[[], Engine] | None = None) -> bool:
        """Walk the history down from the database's current heads, looking for the revision."""
        from alembic.runtime.migration import MigrationContext
        from alembic.script.revision import RevisionError
        from alembic.util import CommandError

        unknown = (RevisionError, CommandError)

        script = self._script()
        try:
            target = script.get_revision(self.revision)
        except unknown as error:
            raise MigrationError(
                f'alembic revision "{self.revision}" is not in the script directory '
                f"{script.dir}: {error}",
                "require a revision id that `alembic history` lists",
            ) from error
        if target is None:
            raise MigrationError(
                f'alembic revision "{self.revision}" resolves to no revision in {script.dir}',
                "require a concrete revision id, not base",
            )
        opts: dict[str, Any] = {"version_table": self.version_table}
        if self.version_table_schema is not None:
            opts["version_table_schema"] = self.version_table_schema
        with self._engine(engine).connect() as conn:
            heads = MigrationContext.configure(conn, opts=opts).get_current_heads()
        if not heads:
            return False
        try:
            return any(rev.revision == target.revision for rev in script.iterate_revisions(heads, "base"))
        except unknown as error:
            raise MigrationError(
                f"the database's alembic heads {list(heads)} are not all in {script.dir}: {error}",
                "deploy the code that holds those revisions, or fix the alembic_version table",
            ) from error


def alembic_revision(
    revision: str,
    *,
    config: Any = None,
    script_location: str | os.PathLike[str] | None = None,
    engine: Engine | Callable[[], Engine] | None = None,
    version_table: str = "alembic_version",
    version_table_schema: str | None = None,
) -> AlembicRevision:
    """A requirement on an alembic history: ``requires=alembic_revision("ae1027a6acf")``.

    Name the script directory with ``config`` (``alembic.ini`` path or ``Config``) or
    ``script_location``. ``engine`` defaults to the backfill's app engine.
    """
    check(
        isinstance(revision, str) and revision.strip() != "",
        f"alembic_revision({revision!r}) — a revision id is a non-empty string",
        'write the id alembic generated, e.g. alembic_revision("ae1027a6acf", config="alembic.ini")',
        code="X_MIGRATION",
    )
    check(
        (config is None) != (script_location is None),
        f'alembic_revision("{revision}") needs exactly one of config= and script_location=',
        'write alembic_revision("...", config="alembic.ini") or script_location="migrations"',
        code="X_MIGRATION",
    )
    return AlembicRevision(
        revision=revision,
        script_location=None if script_location is None else os.fspath(script_location),
        config=config,
        engine=engine,
        version_table=version_table,
        version_table_schema=version_table_schema,
    )


def as_requirement(value: str | MigrationRequirement) -> MigrationRequirement:
    """A plain string names an ``x_migrations`` id; a requirement object is used as it is."""
    if isinstance(value, str):
        return x_migration(value)
    return value
