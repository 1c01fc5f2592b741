"""Where the SQLite job store lives: its URL, its file and the mode the file is created with."""

from __future__ import annotations

import os

from ultimat3.core.errors import XError

__all__ = ["DEFAULT_SQLITE_FILE_MODE", "is_memory_path", "sqlite_file_mode", "sqlite_path"]

_MEMORY_PATHS = (":memory:", "")


#: The mode a new SQLite job store (and so its -wal/-shm files) is created with.
DEFAULT_SQLITE_FILE_MODE = 0o600


def sqlite_file_mode() -> int:
    """``X_SQLITE_FILE_MODE`` (octal, e.g. ``640``) from the environment, else owner-only ``600``."""
    raw = os.environ.get("X_SQLITE_FILE_MODE")
    if raw is None or raw.strip() == "":
        return DEFAULT_SQLITE_FILE_MODE
    try:
        mode = int(raw.strip(), 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise XError(
            f"X_SQLITE_FILE_MODE={raw!r} is not a file mode",
            "write an octal mode such as 600 (owner only, the default) or 640 (owner and group may read)",
            code="X_DATABASE_FILE_MODE",
        )
    return mode


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///relative.db`` or ``sqlite:////abs/path.db`` URL.

    In-memory databases are refused: worker processes and the app must share one file.
    """
    scheme, sep, rest = url.partition(":")
    if not sep or scheme.lower() != "sqlite" or not rest.startswith("///"):
        raise XError(
            f"{url!r} is not a SQLite database URL",
            "write sqlite:///relative/path.db or sqlite:////absolute/path.db",
            code="X_DATABASE_URL",
        )
    path = rest[3:]
    if "?" in path:
        raise XError(
            f"SQLite database URL {url!r} has query parameters, which the driver does not read",
            "write the bare file path: sqlite:///path/to/x.db",
            code="X_DATABASE_URL",
        )
    if is_memory_path(path):
        raise XError(
            f"SQLite database URL {url!r} names an in-memory database",
            "workers and the app share jobs through a file: use sqlite:///x.db, or memory:// for tests",
            code="X_DATABASE_URL",
        )
    return path


def is_memory_path(path: str) -> bool:
    return path in _MEMORY_PATHS or path.startswith("file::memory:") or "mode=memory" in path

