"""The one place tests get a driver: which kinds exist, how each one's database is made (a fresh
SQLite file, a fresh PostgreSQL schema through :mod:`tests.postgres` and its skip-or-fail rule),
and how a driver of each kind is built on a test's clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.postgres import postgres_schema
from ultimat3.core.clock import Clock
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.drivers.postgres.driver import PostgresDriver
from ultimat3.drivers.protocol import JobDriver
from ultimat3.drivers.sqlite.driver import SqliteDriver

#: Every driver kind, as pytest params (Postgres marked, so `-m "not postgres"` can leave it out).
KINDS: list[Any] = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
#: The kinds another process (the CLI, a worker) can open: memory:// lives inside one process only.
SHARED_KINDS: list[Any] = KINDS[1:]


@contextmanager
def database_url(kind: str, folder: Path, *, prefix: str = "x_test") -> Iterator[str]:
    """A fresh, empty database of ``kind`` for the block: ``memory://``, a SQLite file in
    ``folder``, or a PostgreSQL schema of its own (dropped afterwards)."""
    if kind == "memory":
        yield "memory://"
    elif kind == "sqlite":
        yield f"sqlite:///{folder / 'x.db'}"
    else:
        with postgres_schema(prefix) as url:
            yield url


def build(kind: str, url: str, clock: Clock | None = None, *, direct_url: str | None = None) -> JobDriver:
    """A driver of ``kind`` on ``url`` and ``clock`` (not yet migrated); ``direct_url`` for a
    PostgreSQL ``url`` that goes through a pooler."""
    if kind == "memory":
        return MemoryDriver(clock=clock)
    if kind == "sqlite":
        return SqliteDriver(url[len("sqlite:///"):], clock=clock)
    return PostgresDriver(url, clock=clock, direct_url=direct_url)
