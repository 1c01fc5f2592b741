"""The CLI under test, against a fresh SQLite file and a fresh Postgres schema."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql

from ultimat3.cli import cli
from ultimat3.jobs.backfill_pass import dispose_engines

DEFAULT_TEST_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _postgres_schema_url() -> Iterator[str]:
    admin = os.environ.get("X_TEST_DATABASE_URL", DEFAULT_TEST_DATABASE_URL)
    try:
        psycopg.connect(admin, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {admin} is unreachable: {exc}")
        pytest.skip(f"PostgreSQL at {admin} is unreachable: {exc}")
    schema = f"x_cli_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield f"{admin}{'&' if '?' in admin else '?'}options=-csearch_path%3D{schema}"
    finally:
        dispose_engines()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``X_DATABASE_URL`` for one test, with the test app's table seeded."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'x.db'}"
        monkeypatch.setenv("X_DATABASE_URL", url)
        from tests.cli import cli_app

        cli_app.seed()
        yield url
        dispose_engines()
        return
    generator = _postgres_schema_url()
    url = next(generator)
    monkeypatch.setenv("X_DATABASE_URL", url)
    from tests.cli import cli_app

    cli_app.seed()
    try:
        yield url
    finally:
        generator.close()


class X:
    """Runs ``x --app tests.cli.cli_app ...`` in-process."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Result:
        return self.runner.invoke(cli, ["--app", "tests.cli.cli_app", *args], env=env, catch_exceptions=False)


@pytest.fixture
def x(database: str) -> X:
    """The CLI, pointed at this test's database."""
    return X()
