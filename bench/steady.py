"""Issue 13's two sustained-load cases, on PostgreSQL: latency under a steady offered load, and the
worker's memory over a long drain.

    bench/.venv/bin/python bench/steady.py [--rate 1000] [--seconds 20] [--drain 100000] [--no-write]

``steady``: one worker process (``Worker.run()``, concurrency 10, async no-op handler) is idle and
subscribed; a second process offers ``--rate`` jobs/s for ``--seconds`` on a fixed schedule
(job ``i`` is due at ``start + i / rate``; a late enqueuer does not drift, it catches up), each
job carrying its enqueue instant (``CLOCK_MONOTONIC``, comparable across the two processes).
The handler records start - enqueue. Reported: the achieved offered rate, p50/p90/p99/max of
enqueue-to-start (first second dropped: the pool and statement caches warm up), and the worker's
CPU. Target (issue 13): p50 < 5 ms, p99 < 25 ms at 1,000 jobs/s.

``rss``: ``--drain`` + 1,000 jobs enqueued up front, then one worker at concurrency 100 drains
them; the worker's resident set (``/proc/self/statm``) is read when the 1,000th and the last job
are done. Target: the last within +20 MB of the first.

Writes its tables into bench/RESULTS.md between the ``steady`` markers.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import sys
import time
from datetime import UTC, datetime
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import CpuMeter, chunks, markdown_table, mono, percentile, recreate_database, vacuum_analyze, write_block
from pydantic import BaseModel

from ultimat3.jobs import job

BEGIN, END = "<!-- steady:begin -->", "<!-- steady:end -->"
DATABASE = "x_bench_steady"


class Stamp(BaseModel):
    t: float = 0.0


LATENCIES: list[float] = []


@job(name="bench.steady", tenant="none", input=Stamp)
async def steady(input: Stamp, ctx: Any, step: Any) -> None:
    if input.t:
        LATENCIES.append(mono() - input.t)


@job(name="bench.rss", tenant="none", input=Stamp)
async def rss(input: Stamp, ctx: Any, step: Any) -> None:
    return None



def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def _offer(url: str, rate: float, seconds: float, ready: Any, report: Any) -> None:
    from ultimat3.jobs import create_driver
    from ultimat3.tenancy import operator_context

    with operator_context("bench", "the benchmark enqueues its own jobs"):
        driver = create_driver(url, migrate=False)
        steady.enqueue({"t": 0.0}, driver=driver, delay=3600)  # warm up without waking the worker
        ready.wait(30)
        total = int(rate * seconds)
        start = time.perf_counter()
        late = 0
        for i in range(total):
            due = start + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            elif pause < -0.005:
                late += 1
            steady.enqueue({"t": mono()}, driver=driver)
        elapsed = time.perf_counter() - start
        driver.close()
    report.put({"offered": total, "seconds": elapsed, "late": late})


def steady_case(url: str, rate: float, seconds: float) -> dict[str, Any]:
    from ultimat3.jobs import Worker, create_driver

    driver = create_driver(url)
    total = int(rate * seconds)
    worker = Worker(driver, names=[steady.name], concurrency=10, poll_interval=1.0)
    ctx = mp.get_context("spawn")
    ready, report = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_offer, args=(url, rate, seconds, ready, report), daemon=True)
    child.start()

    async def main() -> None:
        run = asyncio.ensure_future(worker.run())
        await asyncio.sleep(1.0)  # subscribed and idle
        ready.set()
        while len(LATENCIES) < total and (child.is_alive() or len(LATENCIES) < total):
            await asyncio.sleep(0.05)
            if not child.is_alive() and len(LATENCIES) < total:
                await asyncio.sleep(2.0)  # the last enqueues' jobs
                break
        worker.stop()
        await run

    with CpuMeter() as cpu:
        asyncio.run(main())
    child.join(10)
    offered = report.get(timeout=10)
    driver.close()
    kept = LATENCIES[int(rate):]  # the first second warms the pools and statement caches
    return {"rate": rate, "offered_per_s": offered["offered"] / offered["seconds"], "late": offered["late"],
            "started": len(LATENCIES), "samples": len(kept),
            "p50_ms": percentile(kept, 50) * 1000, "p90_ms": percentile(kept, 90) * 1000,
            "p99_ms": percentile(kept, 99) * 1000, "max_ms": max(kept) * 1000, **cpu.report()}


def rss_case(url: str, jobs: int) -> dict[str, Any]:
    from ultimat3.jobs import Worker, WorkerEvent, create_driver

    driver = create_driver(url)
    total = jobs + 1000
    for part in chunks(total, 1000):
        rss.enqueue_many([{} for _ in part], driver=driver)
    vacuum_analyze(url)
    seen = {"done": 0, "first": 0.0, "last": 0.0, "peak": 0.0}

    def on_event(event: WorkerEvent) -> None:
        if event.kind != "done":
            return
        seen["done"] += 1
        if seen["done"] == 1000:
            seen["first"] = _rss_mb()
        if seen["done"] % 5000 == 0:
            seen["peak"] = max(seen["peak"], _rss_mb())
        if seen["done"] >= total:
            seen["last"] = _rss_mb()
            worker.stop()

    worker = Worker(driver, names=[rss.name], concurrency=100, poll_interval=1.0, on_event=on_event)
    began = time.perf_counter()
    asyncio.run(worker.run())
    seconds = time.perf_counter() - began
    worker.close()
    driver.close()
    return {"jobs": total, "seconds": seconds, "rss_first_mb": seen["first"], "rss_last_mb": seen["last"],
            "rss_peak_mb": max(seen["peak"], seen["last"]), "growth_mb": seen["last"] - seen["first"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--drain", type=int, default=100_000, help="rss: jobs after the first 1,000")
    parser.add_argument("--only", choices=["steady", "rss"], default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from ultimat3.tenancy import operator_context

    sections = []
    with operator_context("bench", "the benchmark enqueues its own jobs"):
        if args.only in (None, "steady"):
            s = steady_case(recreate_database(DATABASE), args.rate, args.seconds)
            print(s)
            table = markdown_table(
                ["offered", "achieved offer", "jobs started", "p50 ms", "p90 ms", "p99 ms", "max ms",
                 "worker CPU", "PG CPU"],
                [[f"{s['rate']:,.0f}/s for {args.seconds:g} s", f"{s['offered_per_s']:,.0f}/s",
                  f"{s['started']:,}", f"{s['p50_ms']:.2f}", f"{s['p90_ms']:.2f}", f"{s['p99_ms']:.2f}",
                  f"{s['max_ms']:.1f}", f"{s['client_cpu_cores']:.2f} cores", f"{s['server_cpu_cores']:.2f} cores"]])
            sections.append("Enqueue-to-start under a steady offered load (one enqueuer process, `handle.enqueue` "
                            "per job on a fixed schedule; one worker, concurrency 10, idle and subscribed at the "
                            "start; first second dropped). Target: p50 < 5 ms, p99 < 25 ms.\n\n" + table)
        if args.only in (None, "rss"):
            r = rss_case(recreate_database(DATABASE), args.drain)
            print(r)
            table = markdown_table(
                ["jobs drained", "jobs/s", "RSS after 1,000", "RSS at the end", "peak (every 5,000)", "growth"],
                [[f"{r['jobs']:,}", f"{r['jobs'] / r['seconds']:,.0f}", f"{r['rss_first_mb']:.1f} MB",
                  f"{r['rss_last_mb']:.1f} MB", f"{r['rss_peak_mb']:.1f} MB", f"{r['growth_mb']:+.1f} MB"]])
            sections.append("Worker memory over a long drain (one worker, concurrency 100, async no-op handler, the "
                            "jobs enqueued up front). Target: within +20 MB of the RSS after the first 1,000.\n\n"
                            + table)
    if not args.no_write and sections:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d")
        write_block(BEGIN, END, f"{BEGIN}\n### Sustained load ({stamp}, `bench/steady.py`)\n\n"
                    + "\n\n".join(sections) + f"\n{END}")


if __name__ == "__main__":
    main()
