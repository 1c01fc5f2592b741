"""The embedded SQLite driver (the default)."""

from ultimat3.drivers.sqlite.driver import SqliteDriver, sqlite_path

__all__ = ["SqliteDriver", "sqlite_path"]
