"""A job store and an app database of one kind (SQLite files, or one PostgreSQL schema) for the
process tests that run worker fleets against either, with a way to read what a worker process
cannot hide (its claim token, the write lock) and the marks its jobs leave."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.process import chaos_app
from tests.process.harness import postgres_schema
from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import JobDriver


class Backend:
    def __init__(self, kind: str, url: str, app_url: str, root: Path) -> None:
        self.kind, self.url, self.app_url, self.root = kind, url, app_url, root
        self.app = chaos_app.AppDb(app_url)
        self.app.create_tables()
        self.driver = create_driver(url)

    def claim_token(self, job_id: str) -> str | None:
        """The token the current claim holds (read behind the driver's back, as an attacker would)."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            try:
                row = conn.execute("SELECT claim_token FROM x_jobs WHERE id = ?", (job_id,)).fetchone()
            finally:
                conn.close()
        else:
            import psycopg

            with psycopg.connect(self.url) as pg:
                row = pg.execute("SELECT claim_token FROM x_jobs WHERE id = %s", (job_id,)).fetchone()
        return None if row is None else row[0]

    def writable(self) -> bool:
        """Whether a write can start now (on SQLite: nobody holds the file's write lock)."""
        if self.kind != "sqlite":
            return True  # a stopped client holds no server-side lock past its own autocommit statement
        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=0.5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    def marks(self, tag: str) -> list[tuple[str, str, int, float]]:
        return [(kind, worker, attempt, at) for kind, worker, attempt, at in self.app.rows(
            "SELECT kind, worker, attempt, at FROM chaos_marks WHERE tag = ? ORDER BY id", (tag,))]

    def close(self) -> None:
        self.driver.close()
        self.app.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        built = Backend("sqlite", f"sqlite:///{tmp_path / 'x.db'}", f"sqlite:///{tmp_path / 'app.db'}",
                        tmp_path / "fleet")
        try:
            yield built
        finally:
            built.close()
        return
    with postgres_schema("x_fence") as url:
        built = Backend("postgres", url, url, tmp_path / "fleet")
        try:
            yield built
        finally:
            built.close()


def get(driver: JobDriver, job_id: str) -> Any:
    row = driver.introspect.get(job_id)
    assert row is not None
    return row
