"""The bare-SQL floor on PostgreSQL: the least a queue can do, as a plain psycopg loop.

No library, no pool, no threads, no event loop, no JSON models: one autocommit connection.

* enqueue single: one ``INSERT ... RETURNING id`` per job.
* enqueue batch:  one ``INSERT ... SELECT unnest(%s::jsonb[]) RETURNING id`` per ``--batch`` jobs.
* drain ``--concurrency k``: claim ``k`` ready rows in one ``UPDATE ... WHERE id IN (SELECT ...
  ORDER BY priority DESC, run_at, id LIMIT k FOR UPDATE SKIP LOCKED) RETURNING``, "run" them (no-op),
  then mark them done in ONE ``UPDATE ... WHERE id = ANY(%s)``. ``k=1`` is the single floor (two
  round trips a job), ``k=10`` the batched one.

The table has what a queue minimally needs: an id, a name, a payload, a state, a priority, a
run_at and an attempt counter, with a partial index over ready rows in claim order.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psycopg
from benchlib import CpuMeter, chunks, emit, parser, vacuum_analyze

SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_jobs (
    id        bigserial PRIMARY KEY,
    name      text NOT NULL,
    payload   jsonb NOT NULL,
    state     text NOT NULL DEFAULT 'ready',
    priority  integer NOT NULL DEFAULT 0,
    run_at    timestamptz NOT NULL DEFAULT now(),
    attempt   integer NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS floor_jobs_claim_idx ON floor_jobs (priority DESC, run_at, id) WHERE state = 'ready';
"""
INSERT_ONE = "INSERT INTO floor_jobs (name, payload) VALUES (%s, %s::jsonb) RETURNING id"
INSERT_MANY = "INSERT INTO floor_jobs (name, payload) SELECT %s, unnest(%s::jsonb[]) RETURNING id"
CLAIM = """
UPDATE floor_jobs SET state = 'running', attempt = attempt + 1
 WHERE id IN (SELECT id FROM floor_jobs
               WHERE state = 'ready' AND run_at <= now()
               ORDER BY priority DESC, run_at, id
               LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
DONE_ONE = "UPDATE floor_jobs SET state = 'done' WHERE id = %s"
DONE_MANY = "UPDATE floor_jobs SET state = 'done' WHERE id = ANY(%s)"


def setup(url: str) -> psycopg.Connection:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(SCHEMA)
    return conn


def enqueue(args) -> None:
    conn = setup(args.url)
    conn.execute(INSERT_ONE, ("noop", json.dumps({"i": -1}))).fetchone()
    started = time.perf_counter()
    with CpuMeter() as cpu:
        if args.mode == "single":
            for i in range(args.n):
                conn.execute(INSERT_ONE, ("noop", json.dumps({"i": i}))).fetchone()
        else:
            for part in chunks(args.n, args.batch):
                conn.execute(INSERT_MANY, ("noop", [json.dumps({"i": i}) for i in part])).fetchall()
    seconds = time.perf_counter() - started
    conn.close()
    emit(jobs=args.n, seconds=seconds, rate=args.n / seconds, **cpu.report())


def drain(args) -> None:
    conn = setup(args.url)
    for part in chunks(args.n, args.batch):
        conn.execute(INSERT_MANY, ("noop", [json.dumps({"i": i}) for i in part]))
    vacuum_analyze(args.url)
    k = max(1, args.concurrency)
    done = 0
    cpu = CpuMeter().__enter__()
    started = time.perf_counter()
    while True:
        rows = conn.execute(CLAIM, (k,)).fetchall()
        if not rows:
            break
        for _id, _payload in rows:
            pass  # the no-op job
        if k == 1:
            conn.execute(DONE_ONE, (rows[0][0],))
        else:
            conn.execute(DONE_MANY, ([row[0] for row in rows],))
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
