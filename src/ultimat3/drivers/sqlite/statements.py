"""Splitting a SQLite migration script into statements the driver runs in its own transaction."""

from __future__ import annotations

import sqlite3

__all__ = ["split_statements"]


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
