"""What each index of ``x_jobs`` costs an insert, on PostgreSQL: the server-side bound of enqueue.

    bench/.venv/bin/python bench/index_cost.py [--rows 1000] [--tries 7]

Builds ``x_jobs`` (the driver's migrations) in a scratch database, then times one statement that
inserts ``--rows`` server-generated rows (no client work: ids from ``gen_random_uuid()``), best of
``--tries``, with every index, then again after dropping the indexes one by one (cumulative), and
last without the primary key. The difference between the first and the last line is what index
maintenance costs per job, whatever the client does. Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psycopg
from benchlib import drop_database, markdown_table, recreate_database

DATABASE = "x_bench_index_cost"
INSERT = """
INSERT INTO x_jobs (id, run_id, name, queue, payload, state, priority, attempt, max_attempts, run_at,
                    created_at, updated_at)
SELECT gen_random_uuid()::text, gen_random_uuid()::text, 'bench.noop', 'default', jsonb_build_object('i', g),
       'ready', 0, 0, 3, now(), now(), now()
FROM generate_series(1, %s) AS g
"""


def best(conn: psycopg.Connection, rows: int, tries: int) -> float:
    """Fastest of ``tries`` inserts of ``rows`` rows, in seconds."""
    fastest = float("inf")
    for _ in range(tries):
        began = time.perf_counter()
        conn.execute(INSERT, (rows,))
        fastest = min(fastest, time.perf_counter() - began)
    return fastest


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--tries", type=int, default=7)
    args = parser.parse_args()

    from ultimat3 import create_driver

    url = recreate_database(DATABASE)
    create_driver(url).close()  # migrations: the table and its indexes as a deployment has them
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER IF EXISTS x_jobs_attempt_ended ON x_jobs")  # fires on UPDATE only
            best(conn, args.rows, 2)  # warm
            rows = [["every index", f"{best(conn, args.rows, args.tries) * 1e6 / args.rows:.1f}", ""]]
            names = [r[0] for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'x_jobs' AND indexname <> 'x_jobs_pkey'"
                " ORDER BY indexname")]
            previous = float(rows[0][1])
            for name in names:
                conn.execute(f'DROP INDEX "{name}"')
                now = best(conn, args.rows, args.tries) * 1e6 / args.rows
                rows.append([f"without {name} (and those above)", f"{now:.1f}", f"{previous - now:+.1f}"])
                previous = now
            conn.execute("ALTER TABLE x_jobs DROP CONSTRAINT x_jobs_pkey")
            now = best(conn, args.rows, args.tries) * 1e6 / args.rows
            rows.append(["no index at all", f"{now:.1f}", f"{previous - now:+.1f}"])
    finally:
        drop_database(DATABASE)
    print(markdown_table(["x_jobs with", "µs per inserted row", "that index's share"], rows))


if __name__ == "__main__":
    main()
