"""The PostgreSQL driver's worker registry. Liveness is a session-level advisory lock per worker,
held on a connection of its own that the worker keeps open for its whole life: the server frees
the lock the moment that connection dies (the process was killed, the host is gone, the network
cut it), with no timer involved. Any other session can tell by trying the same key.
"""

from __future__ import annotations

import builtins
import threading
import time
from typing import TYPE_CHECKING

import psycopg

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import first_line
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.postgres.database import CONNECT_TIMEOUT
from ultimat3.drivers.postgres.rows import _Q, Conn, Row, _rows, _tuples
from ultimat3.drivers.protocol import RescuedJob, WorkerInfo, WorkerRecord
from ultimat3.drivers.workers import LOST_PREFIX, LOST_SUFFIX, id_taken, unknown_worker

if TYPE_CHECKING:
    from ultimat3.drivers.postgres.driver import PostgresDriver

__all__ = ["PostgresWorkerRegistry"]

#: How long register() waits for a key that a rescuer's probe holds for an instant.
_REGISTER_PATIENCE = 2.0


class _Held:
    """One registered worker of this process: its info and its liveness connection."""

    __slots__ = ("conn", "info", "lock")

    def __init__(self, info: WorkerInfo, conn: Conn) -> None:
        self.info = info
        self.conn = conn
        self.lock = threading.Lock()


class PostgresWorkerRegistry:
    """:class:`~ultimat3.drivers.protocol.WorkerRegistry` over ``x_workers`` and advisory locks."""

    def __init__(self, driver: PostgresDriver) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}

    # -- this process's workers -----------------------------------------------------------------

    def _connect(self, info: WorkerInfo) -> Conn:
        """A liveness connection holding the worker's lock, its row written through it."""
        try:
            conn: Conn = psycopg.connect(
                self._driver._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                application_name=f"ultimat3 worker {info.id}"[:63],
            )
        except psycopg.OperationalError as exc:
            raise DriverError(
                f"cannot open the liveness connection of worker {info.id!r}: {first_line(exc, type(exc).__name__)}",
                "check that PostgreSQL is up and accepts one more connection per worker",
                code="X_DATABASE_UNREACHABLE",
            ) from exc
        try:
            deadline = time.monotonic() + _REGISTER_PATIENCE
            while True:
                row = conn.execute(_Q["worker_lock"], {"id": info.id}).fetchone()
                if row is not None and row[0]:
                    break
                if time.monotonic() >= deadline:
                    raise id_taken(info.id)
                time.sleep(0.02)
            self._upsert(conn, info)
        except BaseException:
            conn.close()
            raise
        return conn

    def _upsert(self, conn: Conn, info: WorkerInfo) -> None:
        conn.execute(_Q["worker_upsert"], {
            "id": info.id, "host": info.host, "pid": info.pid, "concurrency": info.concurrency,
            "queues": None if info.queues is None else list(info.queues),
            "now": to_datetime(self._driver.clock.now()),
        })

    def register(self, info: WorkerInfo) -> None:
        """Open the worker's liveness connection, take its lock, write its row."""
        conn = self._connect(info)
        with self._lock:
            self._held[info.id] = _Held(info, conn)

    def beat(self, worker_id: str, clock_offset: float | None = None) -> bool:
        """Refresh the row through the liveness connection (which proves it alive); when that
        connection died or the row was removed, reconnect, re-lock and rewrite it."""
        with self._lock:
            held = self._held.get(worker_id)
        if held is None:
            raise unknown_worker(worker_id)
        params: dict[str, object] = {"id": worker_id, "clock_offset": clock_offset}
        with held.lock:
            try:
                params["now"] = to_datetime(self._driver.clock.now())
                if held.conn.execute(_Q["worker_beat"], params).rowcount == 1:
                    return True
                self._upsert(held.conn, held.info)  # a rescue removed the row: we are back
            except psycopg.OperationalError:
                if not held.conn.closed:
                    raise
                # The session died, and the lock with it: take both again (our jobs, if another
                # worker rescued them meanwhile, are fenced away from us already).
                held.conn = self._connect(held.info)
            params["now"] = to_datetime(self._driver.clock.now())
            held.conn.execute(_Q["worker_beat"], params)
            return False

    def unregister(self, worker_id: str) -> None:
        """Remove the row, then close the liveness connection (freeing the lock)."""
        with self._lock:
            held = self._held.pop(worker_id, None)
        if held is None:
            return
        with held.lock:
            try:
                if not held.conn.closed:
                    held.conn.execute(_Q["worker_delete"], {"id": worker_id})
                else:
                    self._driver._db.run(lambda conn, _: conn.execute(_Q["worker_delete"], {"id": worker_id}))
            finally:
                held.conn.close()

    def abandon(self, worker_id: str) -> None:
        """Close the liveness connection and keep the row: what a death looks like to the server."""
        with self._lock:
            held = self._held.pop(worker_id, None)
        if held is not None:
            with held.lock:
                held.conn.close()

    def close(self) -> None:
        """The driver is closing: every liveness connection it holds closes too."""
        with self._lock:
            ids = list(self._held)
        for worker_id in ids:
            self.abandon(worker_id)

    # -- the fleet ------------------------------------------------------------------------------

    def list(self) -> list[WorkerRecord]:
        """Every registered worker by id, probed in a transaction that is rolled back."""

        def op(conn: Conn, _: bool) -> tuple[list[Row], dict[str, list[str]]]:
            running: dict[str, list[str]] = {}
            with conn.transaction(force_rollback=True):
                rows = _rows(conn).execute(_Q["worker_list"]).fetchall()
                for claimed_by, job_id in _tuples(conn).execute(_Q["worker_running"]).fetchall():
                    running.setdefault(claimed_by, []).append(job_id)
            return rows, running

        rows, running = self._driver._db.run(op)
        records = []
        for row in rows:
            free = bool(row["free"])
            records.append(WorkerRecord(
                id=row["id"], host=row["host"], pid=row["pid"], concurrency=row["concurrency"],
                queues=None if row["queues"] is None else tuple(row["queues"]),
                started_at=row["started_at"], last_seen_at=row["last_seen_at"],
                alive=not free,
                why=("its database session is gone: its advisory lock is free" if free
                     else "its database session holds its advisory lock"),
                running=tuple(running.get(row["id"], [])), clock_offset=row["clock_offset"],
            ))
        return records

    def rescue(self, worker_id: str) -> builtins.list[RescuedJob]:
        """One transaction: find workers whose lock is free (keeping their keys locked to the end),
        put their running jobs back to ready, remove their rows, NOTIFY the queues."""
        now = to_datetime(self._driver.clock.now())

        def op(conn: Conn, _: bool) -> list[RescuedJob]:
            with conn.transaction():
                cur = _tuples(conn)
                dead = [row[0] for row in cur.execute(_Q["worker_dead"], {"me": worker_id}).fetchall()]
                if not dead:
                    return []
                rows = cur.execute(_Q["worker_release_jobs"], {
                    "dead": dead, "now": now, "error_prefix": LOST_PREFIX, "error_suffix": LOST_SUFFIX,
                    "channel": self._driver.channel,
                }).fetchall()
            return [RescuedJob(job_id=row[0], queue=row[1], worker_id=row[2]) for row in rows]

        rescued = self._driver._db.run(op)
        self._driver._wake([r.queue for r in rescued])
        return rescued
