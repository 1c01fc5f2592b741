"""Applying every migration yields exactly the committed schema, per dialect.

The snapshot is the schema as the database reports it (SQLite's ``sqlite_master``; PostgreSQL's
catalog: columns, constraints, indexes), so a migration that drifts from the snapshot — or a
snapshot edited without a migration — fails here. Regenerate after a deliberate change with
``X_UPDATE_SCHEMA_SNAPSHOTS=1 bash scripts/test tests/integration/test_schema_snapshots.py`` and
commit the diff with the migration.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import psycopg
import pytest
from tests.postgres import postgres_schema

from ultimat3.drivers.postgres.driver import PostgresDriver
from ultimat3.drivers.sqlite.driver import SqliteDriver

DRIVERS = Path(__file__).resolve().parents[2] / "src" / "ultimat3" / "drivers"


def _compare(snapshot: Path, actual: str) -> None:
    if os.environ.get("X_UPDATE_SCHEMA_SNAPSHOTS") == "1":
        snapshot.write_text(actual)
    expected = snapshot.read_text()
    assert actual == expected, (
        f"the migrated schema differs from {snapshot.relative_to(DRIVERS.parents[2])}: write a migration for the "
        "change (and regenerate the snapshot), or fix the migration that drifted"
    )


def sqlite_schema(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
    finally:
        conn.close()
    return "".join(f"-- {kind} {name}\n{' '.join(sql.split())};\n\n" for kind, name, sql in rows if sql)


def test_sqlite_migrations_yield_the_committed_schema(tmp_path: Path) -> None:
    driver = SqliteDriver(str(tmp_path / "x.db"))
    try:
        driver.migrate()
    finally:
        driver.close()
    _compare(DRIVERS / "sqlite" / "schema.sql", sqlite_schema(tmp_path / "x.db"))


def postgres_schema_text(url: str) -> str:
    with psycopg.connect(url) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, ''),"
            " coalesce(collation_name, '') FROM information_schema.columns WHERE table_schema = %s"
            " ORDER BY table_name, ordinal_position", (schema,)).fetchall()
        constraints = conn.execute(
            "SELECT rel.relname, con.conname, pg_get_constraintdef(con.oid) FROM pg_constraint con"
            " JOIN pg_class rel ON rel.oid = con.conrelid JOIN pg_namespace ns ON ns.oid = rel.relnamespace"
            " WHERE ns.nspname = %s ORDER BY rel.relname, con.conname", (schema,)).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s"
            " ORDER BY tablename, indexname", (schema,)).fetchall()
    lines = ["-- columns: table.column type nullable default collation"]
    lines += [" ".join(str(part) for part in row).rstrip() for row in columns]
    lines += ["", "-- constraints"]
    lines += [f"{table} {name}: {definition}" for table, name, definition in constraints]
    lines += ["", "-- indexes"]
    lines += [f"{table} {name}: {definition.replace(schema + '.', '')}" for table, name, definition in indexes]
    return "\n".join(lines) + "\n"


@pytest.mark.postgres
def test_postgres_migrations_yield_the_committed_schema() -> None:
    with postgres_schema("x_snapshot") as url:
        driver = PostgresDriver(url)
        try:
            driver.migrate()
        finally:
            driver.close()
        _compare(DRIVERS / "postgres" / "schema.txt", postgres_schema_text(url))
