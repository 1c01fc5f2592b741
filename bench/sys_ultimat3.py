"""ultimat3 under the bench: enqueue, drain and enqueue-to-start latency, on PostgreSQL or SQLite.

    python bench/sys_ultimat3.py enqueue --url postgresql://.../bench_ultimat3 --n 20000 --mode batch
    python bench/sys_ultimat3.py drain   --url sqlite:////tmp/b.db --n 20000 --concurrency 10
    python bench/sys_ultimat3.py latency --url postgresql://... --n 500

``--variant``: ``sync`` runs a plain ``def`` handler (thread pool) instead of ``async def``;
``nofreeze`` runs the worker without ``freeze_gc`` (which ``x worker`` and the other variants set);
``drain`` uses ``Worker.drain()`` instead of ``run()``/``stop()``; ``timing`` wraps the driver's
methods and reports how many calls each got and the seconds spent inside them (a breakdown of
where a job's time goes: in the database, or in the worker around it).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import CpuMeter, chunks, emit, latency_summary, mono, parser, vacuum_analyze
from pydantic import BaseModel

from ultimat3.jobs import Worker, WorkerEvent, create_driver, job
from ultimat3.tenancy import operator_context


class In(BaseModel):
    i: int = 0
    t: float = 0.0


LATENCIES: list[float] = []
TARGET = {"n": 0}
WORKER: dict[str, Worker] = {}


@job(name="bench.noop", tenant="none", input=In)
async def noop(input: In, ctx, step) -> None:
    return None


@job(name="bench.noop_sync", tenant="none", input=In)
def noop_sync(input: In, ctx, step) -> None:
    return None


@job(name="bench.latency", tenant="none", input=In)
async def probe(input: In, ctx, step) -> None:
    LATENCIES.append(mono() - input.t)
    if len(LATENCIES) >= TARGET["n"]:
        WORKER["w"].stop()


def enqueue(args) -> None:
    driver = create_driver(args.url)
    handle = noop
    handle.enqueue({"i": -1}, driver=driver)  # warm the pool, the statement cache, pydantic
    started = time.perf_counter()
    with CpuMeter() as cpu:
        if args.mode == "single":
            for i in range(args.n):
                handle.enqueue({"i": i}, driver=driver)
        else:
            for part in chunks(args.n, args.batch):
                handle.enqueue_many([{"i": i} for i in part], driver=driver)
    seconds = time.perf_counter() - started
    driver.close()
    emit(jobs=args.n, seconds=seconds, rate=args.n / seconds, **cpu.report())


class _Timed:
    """Per-method call counts and seconds of a driver (``--variant timing``)."""

    def __init__(self, driver, names=("claim", "ack", "ack_many", "ack_and_claim", "nack", "heartbeat")) -> None:
        import threading

        self.calls: dict[str, list[float]] = {name: [0, 0.0, 0] for name in names}
        self.lock = threading.Lock()
        for name in names:
            if hasattr(driver, name):
                setattr(driver, name, self._wrap(name, getattr(driver, name)))

    def _wrap(self, name, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            dt = time.perf_counter() - t0
            with self.lock:
                slot = self.calls[name]
                slot[0] += 1
                slot[1] += dt
                if name == "claim":
                    slot[2] += len(out)
                elif name == "ack_many":
                    slot[2] += len(args[0])
                elif name == "ack_and_claim":
                    slot[2] += len(out[1])  # jobs claimed (acks: as many as the calls' batches)
            return out

        return timed

    def report(self) -> dict:
        counted = ("claim", "ack_many", "ack_and_claim")
        return {name: {"calls": c, "seconds": round(s, 4), **({"jobs": j} if name in counted else {})}
                for name, (c, s, j) in self.calls.items() if c}


def drain(args) -> None:
    handle = noop_sync if "sync" in args.variant else noop
    driver = create_driver(args.url)
    for part in chunks(args.n, args.batch):
        handle.enqueue_many([{"i": i} for i in part], driver=driver)
    if args.url.startswith("postgres"):
        vacuum_analyze(args.url)
    timed = _Timed(driver) if "timing" in args.variant else None
    done = {"n": 0, "at": 0.0}

    def on_event(event: WorkerEvent) -> None:
        if event.kind == "done":
            done["n"] += 1
            if done["n"] >= args.n:
                done["at"] = time.perf_counter()
                worker.stop()

    # freeze_gc as `x worker` runs it (it owns its process); "nofreeze" in --variant turns it off.
    worker = Worker(driver, names=[handle.name], concurrency=args.concurrency, poll_interval=1.0,
                    on_event=on_event, freeze_gc="nofreeze" not in args.variant)
    started = time.perf_counter()
    with CpuMeter() as cpu:
        if "drain" in args.variant:
            asyncio.run(worker.drain())
            worker.close()
            done["at"] = time.perf_counter()
        else:
            asyncio.run(worker.run())
    seconds = done["at"] - started
    stats = {s.queue: s.counts for s in driver.introspect.stats()}
    driver.close()
    finished = stats.get("default", {}).get("done", 0)
    extra = {"driver_calls": timed.report()} if timed is not None else {}
    emit(jobs=args.n, seconds=seconds, rate=args.n / seconds, verified_done=finished, **cpu.report(), **extra)


def _enqueuer(url: str, n: int, gap: float, ready: mp.Event) -> None:
    # A spawned process starts with no actor: its tenant="none" probes need the operator's grant.
    with operator_context("bench", "the benchmark enqueues its own jobs"):
        _offer(url, n, gap, ready)


def _offer(url: str, n: int, gap: float, ready: mp.Event) -> None:
    driver = create_driver(url, migrate=False)
    probe.enqueue({"t": 0.0}, driver=driver, delay=3600)  # warm up without waking the worker
    ready.wait(30)
    rand = random.Random(7)
    for _ in range(n):
        time.sleep(gap * (0.5 + rand.random()))
        probe.enqueue({"t": mono()}, driver=driver)
    driver.close()


def latency(args) -> None:
    driver = create_driver(args.url)
    TARGET["n"] = args.n
    worker = Worker(driver, names=[probe.name], concurrency=max(1, args.concurrency), poll_interval=1.0,
                    freeze_gc=True)
    WORKER["w"] = worker
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_enqueuer, args=(args.url, args.n, args.gap, ready), daemon=True)
    child.start()

    async def main() -> None:
        run = asyncio.ensure_future(worker.run())
        await asyncio.sleep(1.0)  # the worker is subscribed and idle
        ready.set()
        while not run.done():
            await asyncio.wait([run], timeout=1.0)
            if not child.is_alive() and not run.done():
                await asyncio.sleep(2.0)  # its last probes may still be on their way
                worker.stop()  # the enqueuer is gone: report what arrived instead of waiting forever
        await run

    asyncio.run(main())
    child.join(10)
    driver.close()
    emit(jobs=len(LATENCIES), **latency_summary(LATENCIES, args.warmup))


if __name__ == "__main__":
    arguments = parser(__doc__ or "").parse_args()
    with operator_context("bench", "the benchmark enqueues its own jobs"):
        {"enqueue": enqueue, "drain": drain, "latency": latency}[arguments.op](arguments)
