"""The SQL drivers' SQL, kept as SQL: one parser for every dialect's ``queries.sql`` and one loader
for its numbered migration files.

One header syntax, ``-- name: <query>``, starts a named statement that runs to the next header.
Whole-line ``--`` comments are dropped (psycopg would read a percent sign in one as a
placeholder, and no server needs them); text before the first header is the file's preamble.
Query and parameter names are aligned across dialects, so a driver method reads the same in each.

A block whose name starts with ``_`` is a fragment, not a statement: ``{{_name}}`` in any other
block is replaced by its text once, at load time (static SQL only: values stay bound parameters);
a fragment may use other fragments, never itself.
Several statements that must agree on one predicate (the operator's job filter) share it so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

__all__ = ["MIGRATION_PREFIX", "Migration", "load_migrations", "load_queries", "parse_queries"]

#: Ledger ids of the library's own migrations are ``x:`` + the file's stem (``x:0001_init``).
MIGRATION_PREFIX = "x:"
_HEADER = re.compile(r"^--\s*name:\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*$")
_FRAGMENT = re.compile(r"\{\{(_[A-Za-z0-9_]+)\}\}")
_MIGRATION_FILE = re.compile(r"^\d{4}_[A-Za-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    """One migration file: its ledger id (``x:0001_init``) and its SQL text."""

    id: str
    sql: str


def parse_queries(text: str) -> dict[str, str]:
    """Split ``-- name: NAME`` blocks into ``{NAME: sql}``; a name defined twice, or a block with no
    statement, is refused (``ValueError``)."""
    queries: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if current is not None:
            body = "\n".join(lines).strip()
            if not body:
                raise ValueError(f"query {current!r} in queries.sql is empty")
            queries[current] = body

    for line in text.splitlines():
        header = _HEADER.match(line.strip())
        if header is not None:
            flush()
            current = header["name"]
            if current in queries:
                raise ValueError(f"query {current!r} is defined twice in queries.sql")
            lines = []
        elif current is not None and not line.lstrip().startswith("--"):
            lines.append(line.rstrip())
    flush()
    fragments = {name: body for name, body in queries.items() if name.startswith("_")}

    expanding: list[str] = []

    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fragments:
            raise ValueError(f"fragment {name!r} is used in queries.sql but not defined")
        if name in expanding:
            raise ValueError(f"fragment {name!r} in queries.sql uses itself ({' -> '.join([*expanding, name])})")
        expanding.append(name)
        try:
            return _FRAGMENT.sub(expand, fragments[name])  # a fragment may use fragments
        finally:
            expanding.pop()

    return {name: _FRAGMENT.sub(expand, body) for name, body in queries.items() if not name.startswith("_")}


def load_queries(package: str, file: str = "queries.sql") -> dict[str, str]:
    """Every named statement of ``package``'s ``queries.sql`` (or ``file``)."""
    return parse_queries(resources.files(package).joinpath(file).read_text(encoding="utf-8"))


def load_migrations(package: str) -> list[Migration]:
    """Every ``migrations/NNNN_name.sql`` file of ``package``, in number order."""
    folder = resources.files(package).joinpath("migrations")
    names = sorted(entry.name for entry in folder.iterdir() if _MIGRATION_FILE.match(entry.name))
    return [Migration(MIGRATION_PREFIX + name.removesuffix(".sql"), folder.joinpath(name).read_text(encoding="utf-8"))
            for name in names]
