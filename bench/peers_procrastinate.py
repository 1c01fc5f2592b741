"""procrastinate under the bench (same ops and flags as sys_ultimat3.py; PostgreSQL only).

Idiomatic usage of procrastinate 3.x: ``App(connector=PsycopgConnector(conninfo=...))``, the schema
applied with ``app.schema_manager.apply_schema()``, ``@app.task``; the app enqueues synchronously
(``task.defer`` / ``task.batch_defer``, as a sync web app would) and the worker is
``app.run_worker_async(concurrency=N, wait=False)`` with its defaults otherwise (LISTEN/NOTIFY on,
``delete_jobs="never"``, so every finished job stays as a row, like ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procrastinate
import psycopg
from benchlib import CpuMeter, chunks, emit, latency_summary, mono, parser, url_from_argv, vacuum_analyze

logging.getLogger("procrastinate").setLevel(logging.WARNING)

URL = url_from_argv()
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))
LATENCIES: list[float] = []
TARGET = {"n": 0, "done": None}


@app.task(name="bench_noop")
async def noop(i: int = 0) -> None:
    return None


@app.task(name="bench_latency")
async def probe(t: float = 0.0) -> None:
    LATENCIES.append(mono() - t)
    if len(LATENCIES) >= TARGET["n"] and TARGET["done"] is not None:
        TARGET["done"].set()


def enqueue(args) -> None:
    with app.open():
        app.schema_manager.apply_schema()
        noop.defer(i=-1)  # warm up
        started = time.perf_counter()
        with CpuMeter() as cpu:
            if args.mode == "single":
                for i in range(args.n):
                    noop.defer(i=i)
            else:
                for part in chunks(args.n, args.batch):
                    noop.batch_defer(*({"i": i} for i in part))
        seconds = time.perf_counter() - started
    emit(jobs=args.n, seconds=seconds, rate=args.n / seconds, **cpu.report())


def drain(args) -> None:
    with app.open():
        app.schema_manager.apply_schema()
        for part in chunks(args.n, args.batch):
            noop.batch_defer(*({"i": i} for i in part))
    vacuum_analyze(args.url)

    async def main() -> float:
        async with app.open_async():
            started = time.perf_counter()
            await app.run_worker_async(concurrency=args.concurrency, wait=False, install_signal_handlers=False)
            return time.perf_counter() - started

    with CpuMeter() as cpu:
        seconds = asyncio.run(main())
    with psycopg.connect(args.url) as conn:
        (finished,) = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'").fetchone()
    emit(jobs=args.n, seconds=seconds, rate=args.n / seconds, verified_done=finished, **cpu.report())


def _enqueuer(url: str, n: int, gap: float, ready: mp.Event) -> None:
    with app.open():
        probe.configure(schedule_in={"hours": 1}).defer(t=0.0)  # warm up without waking the worker
        ready.wait(30)
        rand = random.Random(7)
        for _ in range(n):
            time.sleep(gap * (0.5 + rand.random()))
            probe.defer(t=mono())


def latency(args) -> None:
    with app.open():
        app.schema_manager.apply_schema()
    TARGET["n"] = args.n
    os.environ["BENCH_URL"] = args.url
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_enqueuer, args=(args.url, args.n, args.gap, ready), daemon=True)
    child.start()

    async def main() -> None:
        TARGET["done"] = asyncio.Event()
        async with app.open_async():
            run = asyncio.ensure_future(
                app.run_worker_async(concurrency=max(1, args.concurrency), install_signal_handlers=False)
            )
            await asyncio.sleep(1.0)
            ready.set()
            await TARGET["done"].wait()
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run

    asyncio.run(main())
    child.join(10)
    emit(jobs=len(LATENCIES), **latency_summary(LATENCIES, args.warmup))


if __name__ == "__main__":
    arguments = parser(__doc__ or "").parse_args()
    {"enqueue": enqueue, "drain": drain, "latency": latency}[arguments.op](arguments)
