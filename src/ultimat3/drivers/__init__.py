"""Driver selection from a URL: ``memory://``, ``sqlite:///path`` (the default) or ``postgresql://...``."""

from __future__ import annotations

import os
import re

from ultimat3.core.clock import Clock
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver

#: URL schemes that name PostgreSQL (the SQLAlchemy driver suffixes included).
POSTGRES_SCHEMES = frozenset({
    "postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg2", "postgres+psycopg", "postgres+psycopg2",
})
# scheme://user:password@ — the password (up to the last @ before the host) is never shown.
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):(?P<secret>\S*)@")


def redact_urls(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('head')}:***@", text)


#: The embedded default: a SQLite file in the working directory, no server needed.
DEFAULT_DATABASE_URL = "sqlite:///x.db"


def database_url() -> str:
    """``X_DATABASE_URL`` from the environment, or the embedded SQLite default."""
    return os.environ.get("X_DATABASE_URL") or DEFAULT_DATABASE_URL


def _psycopg_url(url: str, scheme: str) -> str:
    """A PostgreSQL URL of any accepted spelling as psycopg reads it: the SQLAlchemy spellings name
    the same server, and psycopg 3 speaks to it either way."""
    return "postgresql" + url[len(scheme):]


def create_driver(url: str | None = None, *, clock: Clock | None = None, migrate: bool = True,
                  direct_url: str | None = None) -> JobDriver:
    """Build the driver a URL names, applying the library's migrations unless ``migrate=False``.

    ``url`` defaults to :func:`database_url`. ``direct_url`` (PostgreSQL): a connection that
    bypasses a transaction-mode pooler in front of ``url``, for LISTEN and worker liveness; it
    defaults to ``X_DATABASE_DIRECT_URL`` when ``url`` comes from ``X_DATABASE_URL`` too.
    """
    if url is None and direct_url is None:
        direct_url = os.environ.get("X_DATABASE_DIRECT_URL") or None
    url = url or database_url()
    scheme = url.split(":", 1)[0].lower()
    driver: JobDriver
    if scheme == "memory":
        from ultimat3.drivers.memory import MemoryDriver

        driver = MemoryDriver(clock=clock)
    elif scheme == "sqlite":
        from ultimat3.drivers.sqlite.driver import SqliteDriver, sqlite_path

        driver = SqliteDriver(sqlite_path(url), clock=clock)
    elif scheme in POSTGRES_SCHEMES:
        from ultimat3.drivers.postgres.driver import PostgresDriver

        direct = None
        if direct_url:
            direct_scheme = direct_url.split(":", 1)[0].lower()
            if direct_scheme not in POSTGRES_SCHEMES:
                raise XError(
                    f"direct database URL {redact_urls(direct_url)!r} is not a PostgreSQL URL",
                    "set X_DATABASE_DIRECT_URL (direct_url=) to postgresql://user@host:5432/db, the server itself",
                    code="X_DATABASE_URL",
                )
            direct = _psycopg_url(direct_url, direct_scheme)
        driver = PostgresDriver(_psycopg_url(url, scheme), clock=clock, direct_url=direct)
    else:
        raise XError(
            f"database URL {redact_urls(url)!r} names no driver (scheme {scheme!r})",
            "use memory://, sqlite:///path/to/x.db or postgresql://user@host:5432/db "
            "(postgresql+psycopg:// and postgresql+psycopg2:// are accepted too)",
            code="X_DATABASE_URL",
        )
    if migrate:
        driver.migrate()
    return driver
