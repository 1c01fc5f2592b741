"""The job store URL a Django DATABASES entry names (no database is opened)."""

from __future__ import annotations

from typing import Any

import pytest

django = pytest.importorskip("django")

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402

from ultimat3.contrib.django.settings import DjangoSetupError  # noqa: E402
from ultimat3.contrib.django.store import database_url  # noqa: E402

DATABASES: dict[str, dict[str, Any]] = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/app/db.sqlite3"},
    "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "app", "PASSWORD": "p@ss/word",
           "HOST": "db.internal", "PORT": "6432", "OPTIONS": {"sslmode": "require", "pool": True}},
    "socket": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "app",
               "HOST": "/var/run/postgresql", "PORT": "5433"},
    "memory": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    "mysql": {"ENGINE": "django.db.backends.mysql", "NAME": "shop"},
}


@pytest.fixture(autouse=True, scope="module")
def configured() -> None:
    if not settings.configured:
        settings.configure(DATABASES=DATABASES, INSTALLED_APPS=[], USE_TZ=True)
        django.setup()
    connections.settings = connections.configure_settings(DATABASES)


@pytest.mark.parametrize(("alias", "url"), [
    ("default", "sqlite:////srv/app/db.sqlite3"),
    ("pg", "postgresql://app:p%40ss%2Fword@db.internal:6432/shop?sslmode=require"),
    ("socket", "postgresql://app@/shop?host=%2Fvar%2Frun%2Fpostgresql&port=5433"),
])
def test_the_store_url_is_the_django_database(alias: str, url: str) -> None:
    assert database_url(alias) == url


@pytest.mark.parametrize(("alias", "named"), [
    ("memory", "in-memory SQLite"),
    ("mysql", "django.db.backends.mysql"),
    ("nope", "'nope' is not a key of DATABASES"),
])
def test_databases_that_cannot_hold_jobs_are_refused(alias: str, named: str) -> None:
    with pytest.raises(DjangoSetupError, match=named) as refused:
        database_url(alias)
    assert refused.value.code == "X_DJANGO_SETTINGS" and refused.value.hint
