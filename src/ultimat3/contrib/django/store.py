"""The job store of a Django project: by default Django's own database, one driver per URL."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ultimat3.contrib.django.settings import DjangoSetupError, load_settings
from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import JobDriver

if TYPE_CHECKING:
    from django.db.models import Model
    from sqlalchemy import Table
    from sqlalchemy.engine import Engine

__all__ = ["close_drivers", "database_url", "engine", "get_driver", "job_store_alias", "table"]

_SQLITE_ENGINES = frozenset({"django.db.backends.sqlite3", "django.contrib.gis.db.backends.spatialite"})
_POSTGRES_ENGINES = frozenset({"django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis"})
#: libpq parameters a Django ``OPTIONS`` may carry that name the same server session.
_LIBPQ_OPTIONS = frozenset({"sslmode", "sslrootcert", "sslcert", "sslkey", "application_name", "options",
                            "connect_timeout", "target_session_attrs", "service", "passfile"})

_lock = threading.Lock()
_drivers: dict[str, JobDriver] = {}


def job_store_alias() -> str | None:
    """The Django alias whose database is the job store, or ``None`` when ``DATABASE_URL`` names
    a database of its own."""
    loaded = load_settings()
    return None if loaded.database_url is not None else loaded.database


def database_url(alias: str | None = None) -> str:
    """The job store's URL: ``settings.ULTIMAT3["DATABASE_URL"]``, else the Django database
    ``alias`` (default ``ULTIMAT3["DATABASE"]``) as the connection uses it now (a test runner's
    test database included)."""
    loaded = load_settings()
    if alias is None and loaded.database_url is not None:
        return loaded.database_url
    return _url_of(alias or loaded.database)


def _url_of(alias: str) -> str:
    from django.db import connections

    if alias not in connections.settings:
        raise DjangoSetupError(
            f"settings.ULTIMAT3['DATABASE'] = {alias!r} is not a key of DATABASES",
            f"use one of {', '.join(sorted(connections.settings))}, or set ULTIMAT3['DATABASE_URL']",
        )
    # The settings dict itself, not connections[alias]: that would load the backend's DB-API
    # module. A test runner's swap to the test database writes into this same dict.
    config: dict[str, Any] = connections.settings[alias]
    engine = str(config.get("ENGINE", ""))
    name = str(config.get("NAME") or "")
    if engine in _SQLITE_ENGINES:
        if not name or name == ":memory:" or "mode=memory" in name:
            raise DjangoSetupError(
                f"the Django database {alias!r} is an in-memory SQLite database, which no other "
                "connection (a worker, the CLI) can open",
                "give it a file NAME (for tests: DATABASES[...]['TEST']['NAME'] = 'test.sqlite3'), or "
                "set ULTIMAT3['DATABASE_URL']",
            )
        return "sqlite:///" + os.path.abspath(name)
    if engine in _POSTGRES_ENGINES:
        user = quote(str(config.get("USER") or ""), safe="")
        password = quote(str(config.get("PASSWORD") or ""), safe="")
        credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = str(config.get("HOST") or "")
        port = str(config.get("PORT") or "")
        options = {key: str(value) for key, value in (config.get("OPTIONS") or {}).items()
                   if key in _LIBPQ_OPTIONS}
        if host.startswith("/"):  # a Unix socket directory goes in the query, as libpq reads it
            options["host"] = host
            host = ""
        netloc = credentials + host + (f":{port}" if port and host else "")
        query = ("?" + urlencode(options)) if options else ""
        if port and not host:
            query += ("&" if query else "?") + f"port={port}"
        return f"postgresql://{netloc}/{quote(name, safe='')}{query}"
    raise DjangoSetupError(
        f"the Django database {alias!r} uses {engine or 'no ENGINE'}, which ultimat3 cannot store jobs in",
        "use PostgreSQL or SQLite for it, or point ULTIMAT3['DATABASE_URL'] at one",
    )


def get_driver() -> JobDriver:
    """The driver on the job store (opened and migrated on first use, then kept per URL)."""
    url = database_url()
    with _lock:
        driver = _drivers.get(url)
        if driver is None:
            driver = create_driver(url)
            _drivers[url] = driver
        return driver


def close_drivers() -> None:
    """Close every driver :func:`get_driver` opened (process shutdown, tests)."""
    with _lock:
        drivers = list(_drivers.values())
        _drivers.clear()
    for driver in drivers:
        driver.close()


def engine(alias: str | None = None) -> Callable[[], Engine]:
    """For a backfill's ``engine=``: a SQLAlchemy engine on the Django database ``alias`` (default:
    the job store's), built when a pass first needs it, so declaring connects to nothing."""

    def build() -> Engine:
        from ultimat3.backfill.engines import engine_for_url

        return engine_for_url(database_url(alias))

    return build


def table(model: type[Model]) -> Table:
    """A SQLAlchemy ``Table`` for a Django model's table (its concrete columns, its primary key),
    for a backfill's ``source``: ``select(table(Order)).where(...)``. Column types are left
    generic: a pass reads values, it does not create the table."""
    from sqlalchemy import Column, MetaData, Table
    from sqlalchemy.types import NullType

    meta = model._meta
    columns = [Column(field.column, NullType(), primary_key=field.primary_key) for field in meta.concrete_fields]
    return Table(meta.db_table, MetaData(), *columns)
