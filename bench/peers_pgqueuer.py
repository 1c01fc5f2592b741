"""pgqueuer under the bench (same ops and flags as sys_ultimat3.py; PostgreSQL only).

Idiomatic usage of pgqueuer 1.x, async throughout (it is an async-first library): one
``psycopg.AsyncConnection`` in autocommit behind ``PsycopgDriver``, ``Queries(driver).install()``
for the schema, ``Queries.enqueue(entrypoint, payload)`` (lists of each for a batch),
``QueueManager`` with an ``@qm.entrypoint`` and ``qm.run(mode=QueueExecutionMode.drain, ...)``.

Concurrency N: pgqueuer has no "N at a time" knob of that name. ``--variant`` picks how it is
expressed (the run uses the faster one, see run.py):
  ``budget``     ``max_concurrent_tasks=N, batch_size=N//2`` (the worker-wide cap; it refuses
                 ``max_concurrent_tasks < 2 * batch_size``, so N=1 falls back to ``entrypoint``)
  ``entrypoint`` ``@qm.entrypoint(concurrency_limit=N)`` with ``batch_size=N``
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing as mp
import os
import random
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psycopg
from benchlib import CpuMeter, chunks, emit, latency_summary, mono, parser, vacuum_analyze
from pgqueuer import PsycopgDriver, Queries, QueueManager
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode

logging.getLogger("pgqueuer").setLevel(logging.WARNING)

NOOP = "bench_noop"
PROBE = "bench_latency"


DRIVER = {"name": "asyncpg"}  # pgqueuer's own default client; psycopg is selectable


class _Conn:
    """``async with`` one connection of the chosen client, yielding a pgqueuer driver over it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = None

    async def __aenter__(self):
        if DRIVER["name"] == "asyncpg":
            import asyncpg
            from pgqueuer import AsyncpgDriver

            self.conn = await asyncpg.connect(self.url)
            return AsyncpgDriver(self.conn)
        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        return PsycopgDriver(self.conn)

    async def __aexit__(self, *exc) -> None:
        await self.conn.close()


def connect(url: str) -> _Conn:
    return _Conn(url)


async def install(url: str) -> None:
    async with connect(url) as driver:
        queries = Queries(driver)
        if not await queries.schema_is_installed():
            await queries.install()


def payload(i: int) -> bytes:
    return json.dumps({"i": i}).encode()


def enqueue(args) -> None:
    cpu = CpuMeter()

    async def main() -> float:
        await install(args.url)
        async with connect(args.url) as driver:
            queries = Queries(driver)
            await queries.enqueue(NOOP, payload(-1))  # warm up
            started = time.perf_counter()
            with cpu:
                if args.mode == "single":
                    for i in range(args.n):
                        await queries.enqueue(NOOP, payload(i))
                else:
                    for part in chunks(args.n, args.batch):
                        await queries.enqueue([NOOP] * len(part), [payload(i) for i in part], [0] * len(part))
            return time.perf_counter() - started

    seconds = asyncio.run(main())
    emit(jobs=args.n, seconds=seconds, rate=args.n / seconds, **cpu.report())


def _run_kwargs(concurrency: int, variant: str) -> tuple[dict, int]:
    """(qm.run kwargs, entrypoint concurrency_limit) for ``concurrency`` under ``variant``."""
    if variant == "budget" and concurrency >= 2:
        return {"batch_size": max(1, concurrency // 2), "max_concurrent_tasks": concurrency}, 0
    if variant == "entrypoint":
        return {"batch_size": concurrency}, concurrency
    return {"batch_size": concurrency}, 0  # "batch": no cap but the dequeue batch


def drain(args) -> None:
    calls = {"n": 0}
    variant = args.variant or "batch"

    async def prefill() -> None:
        await install(args.url)
        async with connect(args.url) as driver:
            queries = Queries(driver)
            for part in chunks(args.n, args.batch):
                await queries.enqueue([NOOP] * len(part), [payload(i) for i in part], [0] * len(part))

    async def main() -> float:
        async with connect(args.url) as driver:
            qm = QueueManager(Queries(driver))
            run_kwargs, limit = _run_kwargs(args.concurrency, variant)

            @qm.entrypoint(NOOP, concurrency_limit=limit)
            async def noop(job: Job) -> None:
                calls["n"] += 1

            started = time.perf_counter()
            await qm.run(mode=QueueExecutionMode.drain, **run_kwargs)
            return time.perf_counter() - started

    asyncio.run(prefill())
    vacuum_analyze(args.url)
    with CpuMeter() as cpu:
        seconds = asyncio.run(main())
    with psycopg.connect(args.url) as conn:
        (left,) = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
    emit(jobs=args.n, seconds=seconds, rate=args.n / seconds, verified_done=calls["n"] if left == 0 else -left,
         variant=f"{DRIVER['name']}:{variant}", **cpu.report())


def _enqueuer(url: str, n: int, gap: float, ready: mp.Event) -> None:
    async def main() -> None:
        async with connect(url) as driver:
            queries = Queries(driver)
            await queries.enqueue(PROBE, b"0", 0, execute_after=timedelta(hours=1))  # warm up
            await asyncio.to_thread(ready.wait, 30)
            rand = random.Random(7)
            for _ in range(n):
                await asyncio.sleep(gap * (0.5 + rand.random()))
                await queries.enqueue(PROBE, json.dumps(mono()).encode())

    asyncio.run(main())


def latency(args) -> None:
    latencies: list[float] = []
    ctx = mp.get_context("spawn")
    ready = ctx.Event()

    async def main() -> None:
        await install(args.url)
        async with connect(args.url) as driver:
            qm = QueueManager(Queries(driver))

            @qm.entrypoint(PROBE)
            async def probe(job: Job) -> None:
                latencies.append(mono() - json.loads(job.payload or b"0"))
                if len(latencies) >= args.n:
                    qm.shutdown.set()

            child = ctx.Process(target=_enqueuer, args=(args.url, args.n, args.gap, ready), daemon=True)
            child.start()
            run = asyncio.ensure_future(qm.run(batch_size=max(1, args.concurrency)))
            await asyncio.sleep(1.0)
            ready.set()
            await run
            child.join(10)

    asyncio.run(main())
    emit(jobs=len(latencies), **latency_summary(latencies, args.warmup))


if __name__ == "__main__":
    arguments = parser(__doc__ or "").parse_args()
    # --variant [asyncpg:|psycopg:][batch|budget|entrypoint][+uvloop]
    knob = arguments.variant
    if ":" in knob:
        DRIVER["name"], knob = knob.split(":", 1)
    if knob.endswith("+uvloop"):
        import uvloop

        uvloop.install()
        knob = knob[: -len("+uvloop")]
    arguments.variant = knob
    {"enqueue": enqueue, "drain": drain, "latency": latency}[arguments.op](arguments)
