"""The driver's SQL, kept as SQL: ``queries.sql`` by name, and the numbered migration files.

Both are read from the installed package once, at import.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Final

__all__ = ["MIGRATION_PREFIX", "QUERIES", "load_migrations", "parse_queries"]

#: Ledger ids of the library's own migrations are ``x:`` + the file's stem (``x:0001_init``).
MIGRATION_PREFIX: Final = "x:"
_HEADER = re.compile(r"^--\s*name:\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*--\s*$")
_MIGRATION_FILE = re.compile(r"^\d{4}_[A-Za-z0-9_]+\.sql$")


def parse_queries(text: str) -> dict[str, str]:
    """Split ``-- name: NAME --`` blocks into ``{NAME: sql}``.

    Whole-line ``--`` comments are dropped: psycopg would take a percent sign in one for a
    placeholder, and the server has no use for them. Text before the first header is ignored.
    """
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
    return queries


def load_migrations() -> list[tuple[str, str]]:
    """``(ledger id, sql)`` of every ``migrations/NNNN_name.sql`` file, in number order."""
    folder = resources.files(__package__).joinpath("migrations")
    found = sorted(entry.name for entry in folder.iterdir() if _MIGRATION_FILE.match(entry.name))
    return [
        (MIGRATION_PREFIX + name.removesuffix(".sql"), folder.joinpath(name).read_text(encoding="utf-8"))
        for name in found
    ]


#: Every named statement of ``queries.sql``.
QUERIES: Final[dict[str, str]] = parse_queries(
    resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
)
