"""Fair dispatch across tenants: how long a small tenant's jobs wait behind a big tenant's backlog.

    bench/.venv/bin/python bench/fairness.py [--big 100000] [--small 10] [--kinds sqlite,postgres] [--no-write]

Per driver and claim mode: ``--big`` jobs of tenant ``big`` are enqueued, then ``--small`` jobs of
tenant ``small``; one worker (``concurrency=10``, an async no-op handler) starts, and the clock runs
until the small tenant's last job has started. "claim order" is the default claim (priority, run_at,
id: the small tenant waits for the whole backlog); "fair" is ``Worker(fair=True)`` (round-robin by
tenant at claim time). Also reported: jobs finished per second until then, and the server's and the
client's CPU per job (PostgreSQL), so the price of the fair claim shows. Writes its table into
bench/RESULTS.md between the ``fairness`` markers.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import CpuMeter, markdown_table, recreate_database, vacuum_analyze, write_block  # noqa: E402

BEGIN, END = "<!-- fairness:begin -->", "<!-- fairness:end -->"


class Org(BaseModel):
    org: str


def run_case(url: str, big: int, small: int, fair: bool, timeout: float, measure: int) -> dict[str, Any]:
    from ultimat3 import Ctx, Worker, create_driver
    from ultimat3.jobs import WorkerEvent, isolated_registry, job
    from ultimat3.tenancy import operator_context

    with isolated_registry():
        started: list[float] = []

        async def task(value: Org, ctx: Ctx) -> None:
            if value.org == "small":
                started.append(time.perf_counter())

        handle = job(name="bench.fair", tenant=lambda v: v.org, input=Org)(task)
        driver = create_driver(url)
        with operator_context("bench", "fairness bench: seed two tenants"):
            for offset in range(0, big, 5000):
                handle.enqueue_many([{"org": "big"}] * min(5000, big - offset), driver=driver)
            handle.enqueue_many([{"org": "small"}] * small, driver=driver)
        if url.startswith("postgresql"):
            vacuum_analyze(url)
        done = [0]

        def on_event(event: WorkerEvent) -> None:
            if event.kind == "done":
                done[0] += 1
            if len(started) >= small and done[0] >= measure:
                worker.stop()

        worker = Worker(driver, concurrency=10, environment="test", fair=fair, on_event=on_event,
                        liveness_interval=None, schedules=False)
        begin = time.perf_counter()

        async def main() -> None:
            run = asyncio.ensure_future(worker.run())
            try:
                await asyncio.wait_for(asyncio.shield(run), timeout=timeout)
            except TimeoutError:
                worker.stop()
                await run

        with CpuMeter() as meter:
            asyncio.run(main())
        worker.close()
        driver.close()
    waited = (max(started) - begin) if len(started) >= small else float("nan")
    jobs = max(done[0], 1)
    return {"waited": waited, "done": done[0], "rate": done[0] / meter.wall,
            "client_us": meter.client_cpu / jobs * 1e6, "server_us": meter.server_cpu / jobs * 1e6}


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--big", type=int, default=100_000)
    args.add_argument("--small", type=int, default=10)
    args.add_argument("--kinds", default="sqlite,postgres")
    args.add_argument("--timeout", type=float, default=600.0)
    args.add_argument("--measure", type=int, default=5000,
                      help="run at least this many jobs, so jobs/s and CPU/job are a sustained drain's")
    args.add_argument("--no-write", action="store_true")
    options = args.parse_args()
    rows = []
    for kind in options.kinds.split(","):
        for fair in (False, True):
            if kind == "postgres":
                url = recreate_database("bench_fair")
                result = run_case(url, options.big, options.small, fair, options.timeout, options.measure)
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    result = run_case(f"sqlite:///{tmp}/fair.db", options.big, options.small, fair,
                                      options.timeout, options.measure)
            mode = "fair (`Worker(fair=True)`)" if fair else "claim order (default)"
            server = f"{result['server_us']:.0f} us" if kind == "postgres" else "(in process)"
            rows.append([kind, mode, f"{result['waited']:.3f} s", f"{result['done']:,}", f"{result['rate']:,.0f}/s",
                         f"{result['client_us']:.0f} us", server])
            print(rows[-1], flush=True)
    header = ["driver", "claim", "small tenant's last start", "jobs run", "jobs/s", "client CPU/job",
              "server CPU/job"]
    table = markdown_table(header, rows)
    print(table)
    if not options.no_write:
        block = (f"{BEGIN}\n## Fair dispatch across tenants (`bench/fairness.py`, {time.strftime('%Y-%m-%d')})\n\n"
                 f"{options.big:,} jobs of one tenant, then {options.small} of another; one worker, concurrency 10, "
                 "no-op handler. Time from the worker's start until the small tenant's last job started; the worker "
                 f"runs on until at least {options.measure:,} jobs are done, so jobs/s and CPU per job are those "
                 "of a sustained drain (the fair claim's price).\n\n"
                 f"{table}\n{END}")
        write_block(BEGIN, END, block)


if __name__ == "__main__":
    main()
