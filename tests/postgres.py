"""The test PostgreSQL, shared by every test folder: its URL, the skip-or-fail rule, and isolation.

Postgres tests read ``X_TEST_DATABASE_URL``. When the server is unreachable they skip locally and
FAIL under ``CI=true``: a suite that silently skips its backend proves nothing. Each test (or
session) gets its own schema or database, so suites that truncate tables never meet.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

DEFAULT_TEST_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_test_url() -> str:
    """``X_TEST_DATABASE_URL``, or the local test database."""
    return os.environ.get("X_TEST_DATABASE_URL", DEFAULT_TEST_DATABASE_URL)


def unavailable(reason: str) -> NoReturn:
    """Skip locally, fail in CI (``CI=true``)."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def require_postgres() -> str:
    """The test database URL, or skip/fail when it is unreachable."""
    url = postgres_test_url()
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        unavailable(f"PostgreSQL at X_TEST_DATABASE_URL={url} is unreachable: {exc}")
    return url


def with_params(url: str, **params: str) -> str:
    """``url`` with libpq query parameters added (values URL-quoted)."""
    extra = "&".join(f"{key}={quote(value, safe='')}" for key, value in params.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}"


@contextmanager
def postgres_schema(prefix: str, *, application_name: str | None = None) -> Iterator[str]:
    """A fresh schema of the test database, dropped afterwards; yields a URL whose connections use it.

    Every connection opened from the URL (a driver's pool, its LISTEN thread, the app's engine)
    has ``search_path`` set to the schema.
    """
    base = require_postgres()
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    params = {"options": f"-csearch_path={schema}"}
    if application_name:
        params["application_name"] = application_name
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield with_params(base, **params)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            if application_name:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (application_name,),
                )
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def postgres_database(prefix: str) -> Iterator[str]:
    """A fresh database on the test server, dropped (with its connections) afterwards."""
    from sqlalchemy import make_url

    admin = require_postgres()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
