"""What each index of ``x_jobs`` costs an insert on SQLite, and what binding a row costs: the bound
of SQLite's ``enqueue_many``.

    bench/.venv/bin/python bench/index_cost_sqlite.py [--rows 1000] [--tries 7]

Builds ``x_jobs`` (the driver's migrations) in a scratch file with the driver's pragmas (WAL,
``synchronous=NORMAL``), then times inserting ``--rows`` rows in one ``BEGIN IMMEDIATE`` ..
``COMMIT`` into an emptied table, best of ``--tries`` (CPU seconds of this process: SQLite runs
in it), ids in time order as the driver mints them. Two ways in:
``generated``, one ``INSERT .. SELECT`` over a recursive CTE (no Python per row, no binding), and
``driver``, the driver's own ``job_insert`` by ``executemany`` with every row's 21 named parameters,
as ``enqueue_many`` runs it (staging left out), and the same rows bound by position (the tuples
built inside the timing, as a driver would have to). First with every index, then after dropping them
one by one (cumulative). Prints a table; writes nothing but the scratch file it removes.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import markdown_table

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

        def best(driver_rows: bool, by_position: bool = False) -> float:
            fastest = float("inf")
            for attempt in range(args.tries):
                conn.execute("DELETE FROM x_jobs")  # each try starts from an empty queue, as the bench's do
                # Fresh time-ordered ids each try, as the driver mints them (drivers/staging.py).
                ids = new_ids(2 * args.rows)
                values = [job.columns(time.time()) | {"id": ids[2 * i], "run_id": ids[2 * i + 1]}
                          for i, job in enumerate(staged)] if driver_rows else None
                began = time.process_time()
                conn.execute("BEGIN IMMEDIATE")
                if values is None:
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
                now = (best(False), best(True), best(True, by_position=True))
                share = "" if previous is None else f"{previous - now[0]:+.1f}"
                rows.append([label, f"{now[0]:.1f}", share, f"{now[1]:.1f}", f"{now[2]:.1f}"])
                previous = now[0]
        finally:
            conn.close()
    print(markdown_table(["x_jobs with", "generated: µs per row", "that index's share",
                          "driver's job_insert (executemany): µs per row",
                          "the same, parameters by position: µs per row"], rows))
    print()
    print("Only the primary key (text id) is left on the last line; SQLite keeps it as its own index.")


if __name__ == "__main__":
    main()
