"""Loads the SQLite driver's SQL: named queries from ``queries.sql`` and the migration files."""

from __future__ import annotations

import re
import sqlite3
from importlib import resources
from typing import NamedTuple

_HEADER = re.compile(r"^--\s*name:\s*(?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
#: Library migrations are recorded in ``x_migrations`` under this prefix (``x:0001_init``).
MIGRATION_PREFIX = "x:"


class Migration(NamedTuple):
    """One migration file: its ledger id and its statements, in order."""

    id: str
    statements: list[str]


def parse_queries(text: str) -> dict[str, str]:
    """Split a ``-- name: <query>`` file into ``{name: sql}`` (comments kept, whitespace trimmed)."""
    queries: dict[str, str] = {}
    headers = list(_HEADER.finditer(text))
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
        name = header.group("name")
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        body = text[header.end() : end].strip()
        if not body:
            raise ValueError(f"query {name!r} is empty")
        queries[name] = body
    return queries


def split_statements(script: str) -> list[str]:
    """Split a SQL script into complete statements.

    ``executescript`` would COMMIT first, so a migration could not run in one transaction; this
    lets the driver execute each statement inside its own BEGIN IMMEDIATE.
    """
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statement = buffer.strip()
            if _has_sql(statement):
                statements.append(statement)
            buffer = ""
    if _has_sql(buffer):
        raise ValueError(f"incomplete SQL statement at the end of the script: {buffer.strip()[:80]!r}")
    return statements


def _has_sql(text: str) -> bool:
    """Whether ``text`` holds anything but ``--`` comments and whitespace."""
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())


def load_migrations() -> list[Migration]:
    """The library's migration files, in file-name order, ids ``x:<file stem>``."""
    folder = resources.files(__package__).joinpath("migrations")
    files = sorted((entry for entry in folder.iterdir() if entry.name.endswith(".sql")), key=lambda entry: entry.name)
    return [
        Migration(MIGRATION_PREFIX + entry.name[: -len(".sql")], split_statements(entry.read_text("utf-8")))
        for entry in files
    ]


#: Every named statement of ``queries.sql``, parsed once at import.
QUERIES: dict[str, str] = parse_queries(resources.files(__package__).joinpath("queries.sql").read_text("utf-8"))
