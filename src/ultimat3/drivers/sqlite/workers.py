"""The SQLite driver's worker registry. Liveness is an ``flock`` on a lock file per worker in a
folder beside the database (``x.db-workers/``): the kernel frees it the moment the process dies,
SIGKILL and OOM included, and every process on the file shares the host, so it always knows.

``flock`` locks belong to an open file description, not a process: a probe from another thread
or driver of the same process conflicts with a live worker's lock exactly as another process's
probe does. A lock file that is missing means the worker is gone (it is created before the row).
Platforms without ``fcntl`` cannot decide, so they never call a worker dead (the visibility
timeout still rescues its jobs).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.protocol import RescuedJob, WorkerInfo, WorkerRecord
from ultimat3.drivers.sqlite.rows import QUERIES
from ultimat3.drivers.workers import id_taken, liveness_key, lost_error, running_by_worker, unknown_worker

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from ultimat3.drivers.sqlite.driver import SqliteDriver

__all__ = ["SqliteWorkerRegistry"]

#: How long register() waits for a lock file that a rescuer's probe holds for an instant.
_REGISTER_PATIENCE = 2.0


def _try_lock(path: str, *, create: bool) -> int | None:
    """An fd holding an exclusive flock on ``path``, or ``None`` when someone holds it (or, unless
    ``create``, when the file does not exist)."""
    assert fcntl is not None
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one unlinked under it)."""
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


class SqliteWorkerRegistry:
    """:class:`~ultimat3.drivers.protocol.WorkerRegistry` over ``x_workers`` and lock files."""

    def __init__(self, driver: SqliteDriver) -> None:
        self._driver = driver
        self.folder = driver._file + "-workers"
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, WorkerInfo]] = {}

    def _path(self, worker_id: str) -> str:
        return os.path.join(self.folder, liveness_key(worker_id) + ".lock")

    def register(self, info: WorkerInfo) -> None:
        """Lock the worker's file (waiting an instant for a prober), then write its row."""
        if fcntl is None:  # pragma: no cover - not POSIX
            fd = -1
        else:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            deadline = time.monotonic() + _REGISTER_PATIENCE
            path = self._path(info.id)
            while True:
                fd_or_none = _try_lock(path, create=True)
                if fd_or_none is not None:
                    if _same_file(fd_or_none, path):
                        break
                    # A rescuer unlinked the file while we waited on it: lock the new one instead.
                    os.close(fd_or_none)
                elif time.monotonic() >= deadline:
                    raise id_taken(info.id)
                else:
                    time.sleep(0.02)
            fd = fd_or_none
        try:
            self._upsert(info)
        except BaseException:
            self._close(fd)
            raise
        with self._lock:
            self._held[info.id] = (fd, info)

    def _upsert(self, info: WorkerInfo) -> None:
        params = {"id": info.id, "host": info.host, "pid": info.pid, "concurrency": info.concurrency,
                  "queues": None if info.queues is None else json.dumps(list(info.queues))}
        self._driver._write(lambda conn, now: conn.execute(QUERIES["worker_upsert"], {**params, "now": now}))

    @staticmethod
    def _close(fd: int) -> None:
        if fd >= 0:
            os.close(fd)  # closing the file description frees its flock

    def beat(self, worker_id: str, clock_offset: float | None = None, wakeups: str | None = None) -> bool:
        """Record the worker as seen now; rewrite its row when a rescue removed it."""
        with self._lock:
            held = self._held.get(worker_id)
        if held is None:
            raise unknown_worker(worker_id)
        params = {"id": worker_id, "clock_offset": clock_offset, "wakeups": wakeups}

        def run(conn: sqlite3.Connection, now: float) -> int:
            return conn.execute(QUERIES["worker_beat"], {**params, "now": now}).rowcount

        if self._driver._write(run) == 1:
            return True
        self._upsert(held[1])
        self._driver._write(run)
        return False

    def unregister(self, worker_id: str) -> None:
        """Remove the row, then the lock file, then let go of the lock."""
        with self._lock:
            held = self._held.pop(worker_id, None)
        if held is None:
            return
        try:
            self._driver._execute("worker_delete", {"id": worker_id})
            if held[0] >= 0:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(worker_id))
        finally:
            self._close(held[0])

    def abandon(self, worker_id: str) -> None:
        """Let go of the lock and keep the row and the file: what a death looks like."""
        with self._lock:
            held = self._held.pop(worker_id, None)
        if held is not None:
            self._close(held[0])

    def _probe(self, worker_id: str) -> tuple[bool, str, int | None]:
        """(alive, why, fd holding the dead worker's lock for the caller to release)."""
        with self._lock:
            if worker_id in self._held:
                return True, "holds its lock file (this process)", None
        if fcntl is None:  # pragma: no cover - not POSIX
            return True, "liveness cannot be probed on this platform (no flock)", None
        path = self._path(worker_id)
        fd = _try_lock(path, create=False)  # None when held, and when there is no file
        if fd is not None:
            return False, "its lock file is free: the process that held it is gone", fd
        if os.path.exists(path):
            return True, "its process holds its lock file", None
        return False, "its lock file is gone", None

    def list(self) -> list[WorkerRecord]:
        """Every registered worker by id, probed (changing nothing)."""
        rows = self._driver._rows("worker_list")
        running = running_by_worker((row["claimed_by"], row["id"]) for row in self._driver._rows("worker_running"))
        records = []
        for row in rows:
            alive, why, fd = self._probe(row["id"])
            if fd is not None:
                self._close(fd)
            records.append(WorkerRecord(
                id=row["id"], host=row["host"], pid=row["pid"], concurrency=row["concurrency"],
                queues=None if row["queues"] is None else tuple(json.loads(row["queues"])),
                started_at=to_datetime(row["started_at"]), last_seen_at=to_datetime(row["last_seen_at"]),
                alive=alive, why=why, running=running.get(row["id"], ()), clock_offset=row["clock_offset"],
                wakeups=row["wakeups"],
            ))
        return records

    def rescue(self, worker_id: str) -> builtins.list[RescuedJob]:
        """Release the running jobs of every worker whose lock is free; remove their rows and files."""
        dead: dict[str, int | None] = {}
        try:
            for row in self._driver._rows("worker_list"):
                if row["id"] == worker_id:
                    continue
                alive, _why, fd = self._probe(row["id"])
                if not alive:
                    dead[row["id"]] = fd  # held until the rows are gone: it cannot re-register meanwhile
            if not dead:
                return []

            def run(conn: sqlite3.Connection, now: float) -> list[RescuedJob]:
                rescued: list[RescuedJob] = []
                for dead_id in dead:
                    params = {"worker": dead_id, "error": lost_error(dead_id), "now": now}
                    rescued += [RescuedJob(row["id"], row["queue"], dead_id)
                                for row in conn.execute(QUERIES["worker_release_jobs"], params).fetchall()]
                    conn.execute(QUERIES["worker_delete"], {"id": dead_id})
                return sorted(rescued, key=lambda r: r.job_id)

            rescued = self._driver._write(run)
            for dead_id in dead:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(dead_id))
        finally:
            for fd in dead.values():
                if fd is not None:
                    self._close(fd)
        self._driver._notify(r.queue for r in rescued)
        return rescued
