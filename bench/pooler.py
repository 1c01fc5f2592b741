"""Enqueue and drain through a transaction-mode PgBouncer beside a direct connection, in one run.

    bench/.venv/bin/python bench/pooler.py [--jobs 3000] [--repeat 3] [--no-write]

Starts Debian's PgBouncer (the test suite's helper, tests/pgbouncer.py) in transaction mode in front
of the local PostgreSQL, then for each of "direct", "pooled + direct URL" and "pooled (plain URL)":
single ``enqueue`` calls, ``enqueue_many`` of 1,000, and a ``Worker.drain()`` at concurrency 10 of
``--jobs`` no-op jobs, each on a fresh database; medians of ``--repeat``. Ratios are to "direct".
Writes its table into bench/RESULTS.md between the ``pooler`` markers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "src")]
from benchlib import markdown_table, write_block  # noqa: E402

BEGIN, END = "<!-- pooler:begin -->", "<!-- pooler:end -->"


def measure(url: str, direct: str | None, jobs: int) -> dict[str, float]:
    """Rates (per second) of the three operations on one fresh database."""
    from ultimat3 import Ctx, Worker, create_driver, job
    from ultimat3.drivers.protocol import EnqueueRequest
    from ultimat3.jobs import isolated_registry

    driver = create_driver(url, direct_url=direct)
    try:
        started = time.perf_counter()
        for _ in range(jobs):
            driver.enqueue(EnqueueRequest(name="bench.noop", payload={}))
        single = jobs / (time.perf_counter() - started)
        started = time.perf_counter()
        batches = max(1, jobs // 1000)
        for _ in range(batches):
            driver.enqueue_many([EnqueueRequest(name="bench.noop", payload={}) for _ in range(1000)])
        many = batches * 1000 / (time.perf_counter() - started)
        total = jobs + batches * 1000
        with isolated_registry():
            async def noop(input: dict[str, Any], ctx: Ctx) -> None:
                return None

            job(name="bench.noop", tenant="none")(noop)
            worker = Worker(driver, concurrency=10, environment="test", liveness_interval=None)
            started = time.perf_counter()
            done = asyncio.run(worker.drain())
            drain = done / (time.perf_counter() - started)
            worker.close()
        assert done == total, (done, total)
        return {"enqueue": single, "enqueue_many": many, "drain": drain}
    finally:
        driver.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    from tests.pgbouncer import pgbouncer, pgbouncer_database

    modes = ("direct", "pooled + direct URL", "pooled (plain URL)")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with pgbouncer() as bouncer:
        for _ in range(args.repeat):
            for mode in modes:
                with pgbouncer_database(bouncer, "bench_pooler") as (pooled, direct):
                    url, direct_url = {"direct": (direct, None), "pooled + direct URL": (pooled, direct),
                                       "pooled (plain URL)": (pooled, None)}[mode]
                    results[mode].append(measure(url, direct_url, args.jobs))
                    print(mode, {k: round(v) for k, v in results[mode][-1].items()}, flush=True)
    medians = {mode: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for mode, runs in results.items()}
    header = ["connection", "enqueue (1/call) /s", "enqueue_many (1000/call) rows/s", "drain c=10 jobs/s"]
    rows = []
    for mode in modes:
        cells = [mode]
        for key in ("enqueue", "enqueue_many", "drain"):
            value, base = medians[mode][key], medians["direct"][key]
            cells.append(f"{value:,.0f} ({value / base:.2f}x)")
        rows.append(cells)
    table = markdown_table(header, rows)
    print(table)
    if not args.no_write:
        day = time.strftime("%Y-%m-%d")
        block = (f"{BEGIN}\n## Through PgBouncer 1.18 in transaction mode (`bench/pooler.py`, {day})"
                 f"\n\n{args.jobs:,} single enqueues, {max(1, args.jobs // 1000)} x 1,000 in `enqueue_many`, then a"
                 f" `Worker.drain()` at concurrency 10 of all of them; fresh database per cell, median of"
                 f" {args.repeat}; ratio to direct in brackets.\n\n{table}\n{END}")
        write_block(BEGIN, END, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
