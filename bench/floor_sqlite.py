"""The bare-SQL floor on SQLite: the least an embedded queue can do, as a plain sqlite3 loop.

Same pragmas as ultimat3's SQLite driver (WAL, ``synchronous=NORMAL``, autocommit connection with
explicit ``BEGIN IMMEDIATE`` for a claim), one connection, no threads, no event loop.

* enqueue single: one ``INSERT`` per job, each its own transaction.
* enqueue batch:  ``executemany`` of ``--batch`` rows in one transaction.
* drain ``--concurrency k``: ``BEGIN IMMEDIATE``; ``UPDATE ... WHERE id IN (SELECT ... ORDER BY
  priority DESC, run_at, id LIMIT k) RETURNING``; ``COMMIT``; then ONE ``UPDATE`` marks the k done.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import CpuMeter, chunks, emit, parser

SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_jobs (
    id        INTEGER PRIMARY KEY,
    name      TEXT NOT NULL,
    payload   TEXT NOT NULL,
    state     TEXT NOT NULL DEFAULT 'ready',
    priority  INTEGER NOT NULL DEFAULT 0,
    run_at    REAL NOT NULL,
    attempt   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS floor_jobs_claim_idx ON floor_jobs (priority DESC, run_at, id) WHERE state = 'ready';
"""
INSERT = "INSERT INTO floor_jobs (name, payload, run_at) VALUES (?, ?, ?)"
CLAIM = """
UPDATE floor_jobs SET state = 'running', attempt = attempt + 1
 WHERE id IN (SELECT id FROM floor_jobs
               WHERE state = 'ready' AND run_at <= ?
               ORDER BY priority DESC, run_at, id LIMIT ?)
RETURNING id, payload
"""
DONE_ONE = "UPDATE floor_jobs SET state = 'done' WHERE id = ?"


def path_of(url: str) -> str:
    """``sqlite:////abs/path.db`` -> ``/abs/path.db``; ``sqlite:///rel.db`` -> ``rel.db``."""
    return url[len("sqlite:///"):]


def setup(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path_of(url), isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SCHEMA)
    return conn


def enqueue(args) -> None:
    conn = setup(args.url)
    started = time.perf_counter()
    with CpuMeter() as cpu:
        if args.mode == "single":
            for i in range(args.n):
                conn.execute(INSERT, ("noop", json.dumps({"i": i}), time.time()))
        else:
            for part in chunks(args.n, args.batch):
                conn.execute("BEGIN IMMEDIATE")
                now = time.time()
                conn.executemany(INSERT, [("noop", json.dumps({"i": i}), now) for i in part])
                conn.execute("COMMIT")
    seconds = time.perf_counter() - started
    conn.close()
    emit(jobs=args.n, seconds=seconds, rate=args.n / seconds, **cpu.report())


def drain(args) -> None:
    conn = setup(args.url)
    for part in chunks(args.n, args.batch):
        conn.execute("BEGIN IMMEDIATE")
        now = time.time()
        conn.executemany(INSERT, [("noop", json.dumps({"i": i}), now) for i in part])
        conn.execute("COMMIT")
    conn.execute("ANALYZE")
    k = max(1, args.concurrency)
    done_many = f"UPDATE floor_jobs SET state = 'done' WHERE id IN ({','.join('?' * k)})"
    done = 0
    cpu = CpuMeter().__enter__()
    started = time.perf_counter()
    while True:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(CLAIM, (time.time(), k)).fetchall()
        conn.execute("COMMIT")
        if not rows:
            break
        for _id, payload in rows:
            json.loads(payload)  # the no-op job still reads its input
        ids = [row[0] for row in rows]
        if len(ids) == 1:
            conn.execute(DONE_ONE, (ids[0],))
        elif len(ids) == k:
            conn.execute(done_many, ids)
        else:
            conn.execute(f"UPDATE floor_jobs SET state = 'done' WHERE id IN ({','.join('?' * len(ids))})", ids)
        done += len(rows)
    seconds = time.perf_counter() - started
    cpu.__exit__()
    (finished,) = conn.execute("SELECT count(*) FROM floor_jobs WHERE state = 'done'").fetchone()
    conn.close()
    emit(jobs=done, seconds=seconds, rate=done / seconds, verified_done=finished, **cpu.report())


if __name__ == "__main__":
    arguments = parser(__doc__ or "").parse_args()
    if arguments.op == "latency":
        sys.exit("the floor has no worker to wake: latency is measured for the libraries only")
    {"enqueue": enqueue, "drain": drain}[arguments.op](arguments)
