"""The app the process tests run: jobs whose every execution leaves rows in the app's own tables.

Shared by the pytest process (which declares the jobs to enqueue them) and the worker processes
(``python -m tests.process.chaos_worker``). The app database is separate from the job tables: a
SQLite file (stdlib ``sqlite3``) or the same PostgreSQL schema (``psycopg``). Each execution of
``chaos.effect`` writes, in ONE app transaction, a row in ``chaos_attempts`` (always) and its effect
in ``chaos_effects`` (UNIQUE on ``n``; a replay finds it there and leaves it). So after a drain:
``count(chaos_effects)`` proves nothing was lost, and ``count(chaos_attempts) - jobs`` counts the
executions that were replayed after their effect had committed.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel

from ultimat3.backfill import Batch, backfill
from ultimat3.core import Ctx
from ultimat3.jobs import JobHandle, RetryPolicy, SyncStep, job, limit, rate_limit
from ultimat3.jobs.schedule import every

#: Generous: a job whose workers keep getting killed must not run out of attempts (each claim of a
#: killed worker burns one), and an app write refused by a locked/restarting database retries fast.
CHAOS_RETRY = RetryPolicy(max_attempts=200, base=0.05, factor=2.0, cap=0.5, jitter=0.5)

APP_TABLES_SQLITE = (
    "CREATE TABLE IF NOT EXISTS chaos_effects (n INTEGER NOT NULL UNIQUE, job_id TEXT NOT NULL, worker TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chaos_attempts (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER NOT NULL, "
    "job_id TEXT NOT NULL, worker TEXT NOT NULL, attempt INTEGER NOT NULL, started REAL)",
    "CREATE TABLE IF NOT EXISTS chaos_marks (id INTEGER PRIMARY KEY AUTOINCREMENT, tag TEXT NOT NULL, "
    "kind TEXT NOT NULL, worker TEXT NOT NULL, attempt INTEGER NOT NULL, at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_items (id INTEGER PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS bf_handled (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_batches (id INTEGER PRIMARY KEY AUTOINCREMENT, idx INTEGER NOT NULL, "
    "worker TEXT NOT NULL, rows INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_exact (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_exact_batches (id INTEGER PRIMARY KEY AUTOINCREMENT, idx INTEGER NOT NULL)",
)
APP_TABLES_POSTGRES = (
    "CREATE TABLE IF NOT EXISTS chaos_effects (n integer NOT NULL UNIQUE, job_id text NOT NULL, worker text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chaos_attempts (id bigserial PRIMARY KEY, n integer NOT NULL, "
    "job_id text NOT NULL, worker text NOT NULL, attempt integer NOT NULL, started double precision)",
    "CREATE TABLE IF NOT EXISTS chaos_marks (id bigserial PRIMARY KEY, tag text NOT NULL, "
    "kind text NOT NULL, worker text NOT NULL, attempt integer NOT NULL, at double precision NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_items (id integer PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS bf_handled (id integer PRIMARY KEY, n integer NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_batches (id bigserial PRIMARY KEY, idx integer NOT NULL, "
    "worker text NOT NULL, rows integer NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_exact (id integer PRIMARY KEY, n integer NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bf_exact_batches (id bigserial PRIMARY KEY, idx integer NOT NULL)",
)


class AppDb:
    """The app's own database: ``sqlite:///path`` or ``postgresql://...``, one connection per thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite:")
        self._local = threading.local()

    def _connect(self) -> Any:
        if self.is_sqlite:
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 30000")
            return conn
        import psycopg

        return psycopg.connect(self.url, connect_timeout=5, autocommit=True)

    def _sql(self, statement: str) -> str:
        return statement if self.is_sqlite else statement.replace("?", "%s")

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor inside one transaction on this thread's connection (dropped if it broke)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        try:
            if self.is_sqlite:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield _Cursor(conn, self)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            else:
                with conn.transaction():
                    yield _Cursor(conn, self)
        except Exception:
            # A connection the database dropped (restart, terminate) is useless: open a new one next time.
            if not self.is_sqlite and (conn.closed or conn.broken):
                self._local.conn = None
                conn.close()
            raise

    def create_tables(self) -> None:
        """The app tables (idempotent); a SQLite app file goes to WAL so writers do not block readers."""
        if self.is_sqlite:
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            try:
                conn.execute("PRAGMA journal_mode=WAL").fetchall()
            finally:
                conn.close()
        with self.transaction() as cur:
            for statement in APP_TABLES_SQLITE if self.is_sqlite else APP_TABLES_POSTGRES:
                cur.execute(statement)

    def scalar(self, statement: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row."""
        with self.transaction() as cur:
            row = cur.execute(statement, params).fetchone()
            return None if row is None else row[0]

    def rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row."""
        with self.transaction() as cur:
            return [tuple(row) for row in cur.execute(statement, params).fetchall()]

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            conn.close()


class _Cursor:
    def __init__(self, conn: Any, db: AppDb) -> None:
        self._conn = conn
        self._db = db

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(self._db._sql(statement), tuple(params))

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        if self._db.is_sqlite:
            self._conn.executemany(statement, rows)
        else:
            with self._conn.cursor() as cur:
                cur.executemany(self._db._sql(statement), rows)


# -- the process's configuration (set by chaos_worker before any job runs) ----------------------

_app: AppDb | None = None
_worker_id = "pytest"


def configure(app_url: str, worker_id: str) -> None:
    """Point this process's handlers at the app database."""
    global _app, _worker_id
    _app = AppDb(app_url)
    _worker_id = worker_id


def app() -> AppDb:
    """The configured app database."""
    assert _app is not None, "chaos_app.configure() was not called in this process"
    return _app


# -- the jobs -------------------------------------------------------------------------------------


class Effect(BaseModel):
    """One unit of work: effect number ``n``, taking up to ``work_ms`` before it commits."""

    n: int
    work_ms: int = 5


class Block(BaseModel):
    """A job that holds its worker until ``release`` (a file path) exists or it is aborted.

    With ``only_first`` the block applies to the first attempt only: a re-claimed run finishes at once.
    """

    tag: str
    release: str = ""
    only_first: bool = True


def _effect(input: Effect, ctx: Ctx, step: SyncStep) -> dict[str, Any]:
    started = time.time()
    if input.work_ms > 0:
        time.sleep(random.uniform(0, input.work_ms / 1000))
    with app().transaction() as cur:
        cur.execute(
            "INSERT INTO chaos_attempts (n, job_id, worker, attempt, started) VALUES (?, ?, ?, ?, ?)",
            (input.n, step.job_id, _worker_id, step.attempt, started),
        )
        cur.execute(
            "INSERT INTO chaos_effects (n, job_id, worker) VALUES (?, ?, ?) ON CONFLICT (n) DO NOTHING",
            (input.n, step.job_id, _worker_id),
        )
    return {"n": input.n, "by": _worker_id}


def _mark(tag: str, kind: str, attempt: int) -> None:
    with app().transaction() as cur:
        cur.execute(
            "INSERT INTO chaos_marks (tag, kind, worker, attempt, at) VALUES (?, ?, ?, ?, ?)",
            (tag, kind, _worker_id, attempt, time.time()),
        )


def _block(input: Block, ctx: Ctx, step: SyncStep) -> dict[str, Any]:
    _mark(input.tag, "start", step.attempt)
    if input.only_first and step.attempt > 1:
        _mark(input.tag, "finish", step.attempt)
    else:
        # Watch the abort signal as a well-behaved handler does, and the release file. Once
        # released, return at once (no app write first): the attempt goes straight to its ack.
        while not (input.release and Path(input.release).exists()):
            if step.signal.wait(0.01):
                _mark(input.tag, "aborted", step.attempt)
                step.signal.raise_if_aborted()
    return {"tag": input.tag, "by": _worker_id, "attempt": step.attempt}


class Governed(BaseModel):
    """A job under flow control: ``key`` is its concurrency key; it marks its start and finish
    (tag ``flow-<n>``) and works ``work_ms``; with ``block`` its first attempt holds its worker
    until it is killed (as :class:`Block` does)."""

    n: int
    key: str = "k"
    work_ms: int = 50
    block: bool = False


#: ``chaos.limited``: at most this many attempts per key at once across the fleet.
LIMIT = 2
#: ``chaos.rated``: starts per second across the fleet, and the burst.
RATE, BURST = 20.0, 2


def _governed(input: Governed, ctx: Ctx, step: SyncStep) -> dict[str, Any]:
    tag = f"flow-{input.n}"
    _mark(tag, "start", step.attempt)
    if input.block and step.attempt == 1:
        while not step.signal.wait(0.01):
            pass
        step.signal.raise_if_aborted()
    time.sleep(input.work_ms / 1000)
    _mark(tag, "finish", step.attempt)
    return {"n": input.n, "by": _worker_id}


# -- the backfill: a paced pass over bf_items (in the job database: the backfill's default engine) --

BACKFILL_BATCH = 500
bf_items = sa.Table("bf_items", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True, autoincrement=False))


def _sweep_handle(batch: Batch) -> None:
    ids = [(row.id,) for row in batch.rows]
    with app().transaction() as cur:
        cur.execute("INSERT INTO bf_batches (idx, worker, rows) VALUES (?, ?, ?)", (batch.index, _worker_id, len(ids)))
        cur.executemany(
            "INSERT INTO bf_handled (id, n) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET n = bf_handled.n + 1", ids
        )
    # Between the app commit and the batch's checkpoint: a kill here makes the batch run twice.
    time.sleep(0.02)


#: ``chaos.exact`` quarantines the rows whose id is a multiple of this.
QUARANTINE_EVERY = 97


def _exact_handle(batch: Batch) -> None:
    # NOT idempotent: every handling adds 1. Written through batch.connection, in the transaction
    # the batch's checkpoint is recorded in: a kill anywhere leaves both or neither.
    # Every QUARANTINE_EVERY-th row is quarantined instead: stored in the same transaction too.
    assert batch.connection is not None
    batch.connection.execute(sa.text("INSERT INTO bf_exact_batches (idx) VALUES (:idx)"), {"idx": batch.index})
    for row in batch.rows:
        if row.id % QUARANTINE_EVERY == 0:
            batch.fail(row, f"row {row.id} is refused")
    batch.connection.execute(
        sa.text("INSERT INTO bf_exact (id, n) VALUES (:id, 1) ON CONFLICT (id) DO UPDATE SET n = bf_exact.n + 1"),
        [{"id": row.id} for row in batch.rows if row.id % QUARANTINE_EVERY])
    time.sleep(0.02)  # a kill may land here, inside the open transaction


def _tick(input: Any, ctx: Ctx) -> str | None:
    return None if ctx.tick is None else ctx.tick.isoformat()


def declare(*, ticks: bool = False) -> dict[str, JobHandle[Any]]:
    """Declare the app's jobs and its backfill in the current registry; returns them by name. With
    ``ticks``, also ``chaos.tick``: a job every worker fires once a second (its schedule)."""
    effect = job(name="chaos.effect", tenant="none", input=Effect, retry=CHAOS_RETRY)(_effect)
    block = job(name="chaos.block", tenant="none", input=Block, retry=CHAOS_RETRY)(_block)
    sweep = backfill(engine="job-store", name="chaos.sweep", tenant="none", source=lambda ctx: sa.select(bf_items.c.id),
                     handle=_sweep_handle, batch=BACKFILL_BATCH, rate=100, retry=CHAOS_RETRY)
    exact = backfill(engine="job-store", name="chaos.exact", tenant="none", source=lambda ctx: sa.select(bf_items.c.id),
                     handle=_exact_handle, batch=BACKFILL_BATCH, rate=100, retry=CHAOS_RETRY)
    limited = job(name="chaos.limited", tenant="none", input=Governed, retry=CHAOS_RETRY,
                  concurrency=limit(max=LIMIT, key=lambda i: i.key))(_governed)
    rated = job(name="chaos.rated", tenant="none", input=Governed, retry=CHAOS_RETRY,
                rate=rate_limit(f"{RATE:g}/s", burst=BURST))(_governed)
    declared: dict[str, JobHandle[Any]] = {effect.name: effect, block.name: block, sweep.name: sweep,
                                           exact.name: exact, limited.name: limited, rated.name: rated}
    if ticks:
        tick = job(name="chaos.tick", tenant="none", schedule=every("1s"))(_tick)
        declared[tick.name] = tick
    return declared


def worker_id_from_env() -> str:
    """The worker id a process was started with."""
    return os.environ.get("CHAOS_WORKER_ID", f"w{os.getpid()}")
