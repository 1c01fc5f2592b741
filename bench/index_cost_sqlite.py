"""What each index of ``x_jobs`` costs an insert on SQLite, and what binding a row costs: the bound
of SQLite's ``enqueue_many``.

    bench/.venv/bin/python bench/index_cost_sqlite.py [--rows 1000] [--tries 7]

Builds ``x_jobs`` (the driver's migrations) in a scratch file with the driver's pragmas (WAL,
``synchronous=NORMAL``), then times inserting ``--rows`` rows in one ``BEGIN IMMEDIATE`` ..
``COMMIT`` into an emptied table, best of ``--tries`` (CPU seconds of this process: SQLite runs
in it), ids in time order as the driver mints them. Two ways in:
``generated``, one ``INSERT .. SELECT`` over a recursive CTE (no Python per row, no binding), and
``driver``, the driver's own ``job_insert`` by ``executemany`` with every row's 21 named parameters
(the rows built inside the timing, as the driver builds them under its write lock; what
``enqueue_many`` ran until issue 13's seventh round, and still runs for a batch whose jobs differ in
first run time or rate), the same rows bound by position, and ``job_insert_many``, what
``enqueue_many`` runs now: one statement over a JSON array of the rows (the array built inside the
timing). First with every index, then after
dropping them one by one (cumulative).

A second table is the bound of a one-job enqueue: what one ``INSERT`` in its own transaction costs,
and how many WAL frames (pages) its commit writes, into ``x_jobs`` and into the bare-SQL floor's table
(bench/floor_sqlite.py). Every b-tree an insert touches (the table, its primary key, each index whose
predicate takes the row) is one more page in the commit. Prints the tables; writes nothing but the
scratch file it removes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import markdown_table
from floor_sqlite import INSERT as FLOOR_INSERT
from floor_sqlite import SCHEMA as FLOOR_SCHEMA

GENERATED = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)
INSERT INTO x_jobs (id, run_id, name, queue, payload, state, priority, attempt, max_attempts, run_at,
                    created_at, updated_at)
SELECT printf('%020d', ? + n), printf('%020d', ? + n + 1000000000), 'bench.noop', 'default',
       json_object('i', n), 'ready', 0, 0, 3, t.now, t.now, t.now
FROM g, (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) AS t
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--tries", type=int, default=7)
    args = parser.parse_args()

    from ultimat3 import create_driver
    from ultimat3.drivers.protocol import EnqueueRequest
    from ultimat3.drivers.sqlite.driver import _json_row, _shared_row_values
    from ultimat3.drivers.sqlite.rows import QUERIES
    from ultimat3.drivers.staging import new_ids, stage_many

    staged = stage_many([EnqueueRequest(name="bench.noop", payload={"i": i}, enqueued_by="bench")
                         for i in range(args.rows)])

    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "index_cost.db")
        create_driver(f"sqlite:///{path}").close()  # migrations: the table and indexes as deployed
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")

        insert = QUERIES["job_insert"]
        order = re.findall(r":(\w+)", insert)
        positional = re.sub(r":\w+", "?", insert)
        frames = one_job_commits(conn, staged[0], insert, args.tries)

        def best(driver_rows: bool, by_position: bool = False, as_json: bool = False) -> float:
            fastest = float("inf")
            for attempt in range(args.tries):
                conn.execute("DELETE FROM x_jobs")  # each try starts from an empty queue, as the bench's do
                # Fresh time-ordered ids each try, as the driver mints them (drivers/staging.py).
                ids = new_ids(2 * args.rows)
                now = time.time()
                fresh = [type(job)(job.request, ids[2 * i], ids[2 * i + 1], job.payload)
                         for i, job in enumerate(staged)]
                began = time.process_time()
                # The rows are built inside the timing, as the driver builds them under its lock.
                values = [job.columns(now) for job in fresh] if driver_rows and not as_json else None
                conn.execute("BEGIN IMMEDIATE")
                if as_json:
                    keyless = list(enumerate(fresh))
                    shared = _shared_row_values(keyless, now)
                    assert shared is not None
                    conn.execute(QUERIES["job_insert_many"],
                                 {**shared, "rows": json.dumps([_json_row(job) for _, job in keyless])})
                elif values is None:
                    conn.execute(GENERATED, (args.rows, attempt * args.rows, attempt * args.rows))
                elif by_position:
                    conn.executemany(positional, [tuple(row[name] for name in order) for row in values])
                else:
                    conn.executemany(insert, values)
                conn.execute("COMMIT")
                fastest = min(fastest, time.process_time() - began)
            return fastest * 1e6 / args.rows

        try:
            best(False), best(True)  # warm
            rows = []
            names = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'x_jobs' AND sql IS NOT NULL"
                " ORDER BY name")]
            label = "every index"
            previous: float | None = None  # the generated insert's cost on the line above
            for name in [None, *names]:
                if name is not None:
                    conn.execute(f'DROP INDEX "{name}"')
                    label = f"without {name} (and those above)"
                cost = (best(False), best(True), best(True, by_position=True), best(True, as_json=True))
                share = "" if previous is None else f"{previous - cost[0]:+.1f}"
                rows.append([label, f"{cost[0]:.1f}", share, f"{cost[1]:.1f}", f"{cost[2]:.1f}", f"{cost[3]:.1f}"])
                previous = cost[0]
        finally:
            conn.close()
    print(markdown_table(["x_jobs with", "generated: µs per row", "that index's share",
                          "driver's job_insert (executemany): µs per row",
                          "the same, parameters by position: µs per row",
                          "driver's job_insert_many (one JSON array): µs per row"], rows))
    print()
    print("Only the primary key (text id) is left on the last line; SQLite keeps it as its own index.")
    print()
    print(markdown_table(["one job per transaction", "µs per commit (CPU)", "WAL frames per commit"], frames))
    print()
    print("A frame is one page (4 KiB) appended to the WAL at COMMIT: one per b-tree the insert touched.")


def one_job_commits(conn: sqlite3.Connection, job: Any, insert: str, tries: int) -> list[list[str]]:
    """``[label, µs, frames]`` for a one-row transaction into ``x_jobs`` (every index, the driver's
    ``job_insert``) and into the floor's table, best of ``tries`` runs of 200 commits each."""
    from ultimat3.drivers.staging import new_ids

    conn.executescript(FLOOR_SCHEMA)
    conn.execute("PRAGMA wal_autocheckpoint=0")  # the WAL grows by exactly what each commit wrote
    n = 200

    def run(write: Callable[[int], None]) -> tuple[float, float]:
        fastest, frames = float("inf"), 0.0
        for _ in range(tries):
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            began = time.process_time()
            for i in range(n):
                conn.execute("BEGIN IMMEDIATE")
                write(i)
                conn.execute("COMMIT")
            fastest = min(fastest, time.process_time() - began)
            frames = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1] / n
        return fastest * 1e6 / n, frames

    def ours(i: int) -> None:
        job_id, run_id = new_ids(2)
        conn.execute(insert, job.columns(time.time()) | {"id": job_id, "run_id": run_id})

    def floor(i: int) -> None:
        conn.execute(FLOOR_INSERT, ("noop", json.dumps({"i": i}), time.time()))

    out = []
    for label, write in (("x_jobs (driver's job_insert, every index)", ours), ("the floor's table", floor)):
        micros, frames = run(write)
        out.append([label, f"{micros:.1f}", f"{frames:.1f}"])
    conn.execute("PRAGMA wal_autocheckpoint=1000")
    return out


if __name__ == "__main__":
    main()
