"""The app database a pass reads: the backfill's ``engine=``, built lazily, or the job store's own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url

from ultimat3.backfill.definition import BackfillDefinition, BackfillError
from ultimat3.drivers.protocol import JobDriver

__all__ = [
    "LazyEngine",
    "definition_engine",
    "dispose_engines",
    "engine_for_url",
]

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def engine_for_url(url: str, *, backfill: str = "?") -> Engine:
    """A SQLAlchemy engine on the database a driver URL names (cached per URL).

    ``sqlite:///path`` is the same file; ``postgresql://...`` gets the psycopg 3 dialect.
    """
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        target = url
        options: dict[str, Any] = {"connect_args": {"timeout": 30}}
    elif scheme in ("postgres", "postgresql") or scheme.startswith("postgresql+"):
        parsed = make_url("postgresql" + url[len(scheme):] if scheme == "postgres" else url)
        target = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        # No named prepared statements: through a transaction-mode pooler (PgBouncer, Supavisor, RDS
        # Proxy) the server connection that holds one changes under us. A page query is planned
        # once per page of rows, which costs nothing next to the page.
        options = {"pool_pre_ping": True, "connect_args": {"prepare_threshold": None}}
    else:
        raise BackfillError(
            f'backfill "{backfill}" declares no engine= and the driver\'s URL {url!r} is not a SQL database',
            "pass engine=create_engine(...) (or a function returning one) for the tables its source reads",
            code="X_BACKFILL_ENGINE",
        )
    with _engines_lock:
        engine = _engines.get(target)
        if engine is None:
            engine = create_engine(target, **options)
            _engines[target] = engine
        return engine


def dispose_engines() -> None:
    """Close every engine :func:`engine_for_url` built (tests, process shutdown)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()


def definition_engine(definition: BackfillDefinition, driver: JobDriver) -> Callable[[], Engine]:
    """The backfill's app engine as a function: its ``engine=``, else the driver's database.
    Nothing is connected until it is called."""
    return LazyEngine(definition, driver)


class LazyEngine:
    """The backfill's app engine, built on first use and at most once per pass."""

    def __init__(self, definition: BackfillDefinition, driver: JobDriver) -> None:
        self._definition = definition
        self._driver = driver
        self._engine: Engine | None = None

    def __call__(self) -> Engine:
        if self._engine is None:
            source = self._definition.engine
            name = self._definition.name
            if source is None or isinstance(source, str):  # JOB_STORE: the declaration said so
                self._engine = engine_for_url(self._driver.url, backfill=name)
            elif isinstance(source, Engine):
                self._engine = source
            else:
                built = source()
                if not isinstance(built, Engine):
                    raise BackfillError(
                        f'backfill "{name}": its engine= function returned {type(built).__name__}, not an Engine',
                        "return sqlalchemy.create_engine(...) from it (build it once and return the same one)",
                        code="X_BACKFILL_ENGINE",
                    )
                self._engine = built
        return self._engine
