"""The CLI under test, against a fresh SQLite file and a fresh Postgres schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.drivers import SHARED_KINDS, database_url
from ultimat3.backfill import dispose_engines
from ultimat3.cli import cli


@pytest.fixture(params=SHARED_KINDS)
def database(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``X_DATABASE_URL`` for one test, with the test app's table seeded."""
    with database_url(request.param, tmp_path, prefix="x_cli") as url:
        monkeypatch.setenv("X_DATABASE_URL", url)
        from tests.cli import cli_app

        cli_app.seed()
        try:
            yield url
        finally:
            dispose_engines()


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
