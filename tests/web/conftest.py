"""The dashboard under test: the CLI test app's declarations (jobs with limits, schedules,
backfills) over a fresh SQLite file or PostgreSQL schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.drivers import SHARED_KINDS, database_url
from ultimat3.backfill import dispose_engines
from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import JobDriver
from ultimat3.web import create_app

#: A token long enough to be accepted.
TOKEN = "test-token-0123456789abcdef"


@pytest.fixture(params=SHARED_KINDS)
def driver(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobDriver]:
    """A migrated driver on a fresh database, with the test app's table seeded and declared."""
    with database_url(request.param, tmp_path, prefix="x_web") as url:
        monkeypatch.setenv("X_DATABASE_URL", url)
        monkeypatch.delenv("X_WEB_TOKEN", raising=False)
        from tests.cli import cli_app

        cli_app.seed(200)
        opened = create_driver(url)
        opened.migrate()
        try:
            yield opened
        finally:
            opened.close()
            dispose_engines()


@pytest.fixture
def read_only(driver: JobDriver) -> Iterator[TestClient]:
    """The dashboard with no token."""
    with TestClient(create_app(driver, environment="test"), base_url="http://127.0.0.1:8080") as client:
        yield client


@pytest.fixture
def client(driver: JobDriver) -> Iterator[TestClient]:
    """The dashboard with a token configured, not signed in."""
    with TestClient(create_app(driver, token=TOKEN, environment="test"), base_url="http://127.0.0.1:8080") as c:
        yield c
