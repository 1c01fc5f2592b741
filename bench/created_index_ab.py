"""What ``x_jobs_created_idx`` (the listing order) costs a drain: PostgreSQL CPU per job at c=100,
with the index and without it, alternated.

    bench/.venv/bin/python bench/created_index_ab.py [--rounds 6] [--jobs 20000]

Every claim and every ack rewrites the row (a state change is never HOT), so each adds an entry
to every index that is not partial, this one included. Each run recreates a scratch database,
migrates it, drops the index for the "without" runs, enqueues ``--jobs`` no-op jobs, settles the
table (``VACUUM ANALYZE``, ``CHECKPOINT``), and drains it with one ``Worker`` at concurrency 100
(``freeze_gc`` as ``x worker`` runs it). Rounds alternate which variant goes first. Prints each
run and the medians; writes nothing (the scratch database is dropped at the end).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import psycopg  # noqa: E402
from benchlib import CpuMeter, drop_database, markdown_table, recreate_database, vacuum_analyze  # noqa: E402
from budget import fill, run_worker  # noqa: E402

from ultimat3.jobs import create_driver  # noqa: E402
from ultimat3.tenancy import operator_context  # noqa: E402

DATABASE = "x_bench_created_index"


def drain(with_index: bool, jobs: int) -> tuple[float, float, float]:
    """One run: (jobs/s, client µs per job, PostgreSQL µs per job)."""
    url = recreate_database(DATABASE)
    driver = create_driver(url)
    if not with_index:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP INDEX x_jobs_created_idx")
    with operator_context("bench", "created_index_ab prefill"):
        fill(driver, jobs)
    vacuum_analyze(url)
    with CpuMeter() as meter:
        run_worker(driver, jobs)
    driver.close()
    return jobs / meter.wall, meter.client_cpu * 1e6 / jobs, meter.server_cpu * 1e6 / jobs


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--rounds", type=int, default=6, help="runs of each variant")
    args.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    options = args.parse_args()
    runs: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    try:
        for round_ in range(options.rounds):
            for with_index in (True, False) if round_ % 2 == 0 else (False, True):
                result = drain(with_index, options.jobs)
                runs[with_index].append(result)
                print(f"{'with' if with_index else 'without'}: {result[0]:,.0f} jobs/s, client {result[1]:.1f} µs, "
                      f"PostgreSQL {result[2]:.1f} µs per job", flush=True)
    finally:
        drop_database(DATABASE)
    rows = []
    for with_index, results in runs.items():
        rate, client, server = (statistics.median(column) for column in zip(*results, strict=True))
        servers = sorted(r[2] for r in results)
        rows.append([f"{'with' if with_index else 'without'} x_jobs_created_idx", f"{rate:,.0f}", f"{client:.1f}",
                     f"{server:.1f} [{servers[0]:.1f}..{servers[-1]:.1f}]"])
    print(markdown_table(["drain c=100", "jobs/s", "client µs/job", "PG µs/job [range]"], rows))


if __name__ == "__main__":
    main()
