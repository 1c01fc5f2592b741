"""Issue 22, under load: a steady offered load while someone holds the database's oldest snapshot.

    .venv/bin/python bench/pinned_load.py [--rate 800] [--slots 32] [--phase 120] [--label TEXT] [--no-write]

A producer enqueues ``--rate`` jobs/s (``enqueue_many`` every 10 ms); one worker PROCESS with
``--slots`` slots runs them (an async handler that sleeps 1 ms). Five phases of ``--phase``
seconds each: clean; one idle-in-transaction session (it took an xid and went idle); clean again;
four REPEATABLE READ readers, each running ``count(*)`` over x_jobs every second in one snapshot;
recovery. Per 10 s window: completions per second (and as a share of the clean phase), enqueue to
finish p50/p99, the worker's claim statement p50/p99, buffer accesses (heap + indexes of x_jobs,
from pg_statio) per completed job, dead tuples, and the backlog at the window's end. Writes a
per-phase summary and the per-window table into bench/RESULTS.md between the ``pinned-load``
markers (``--label`` names the code that ran).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import markdown_table, percentile, recreate_database, write_block  # noqa: E402

BEGIN, END = "<!-- pinned-load:begin -->", "<!-- pinned-load:end -->"
DATABASE = "x_bench_pinned_load"
WINDOW = 10.0


def worker_main(url: str, slots: int, claims_file: str) -> None:
    """The worker process: runs ``bench.pinned`` jobs and logs every claim statement's duration."""
    from ultimat3 import Ctx, Worker, create_driver, job
    from ultimat3.drivers.postgres.driver import PostgresDriver

    async def work(input: dict[str, Any], ctx: Ctx) -> None:
        await asyncio.sleep(0.001)

    job(name="bench.pinned", tenant="none")(work)
    samples: list[str] = []
    lock = threading.Lock()
    original = PostgresDriver.claim

    def timed(self: PostgresDriver, request: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(self, request)
        finally:
            with lock:
                samples.append(f"{time.time():.3f} {time.perf_counter() - began:.6f}\n")

    PostgresDriver.claim = timed  # type: ignore[method-assign]

    def flush() -> None:
        with open(claims_file, "a", encoding="utf-8") as out:
            while True:
                time.sleep(1.0)
                with lock:
                    chunk, samples[:] = list(samples), []
                out.write("".join(chunk))
                out.flush()

    threading.Thread(target=flush, daemon=True).start()
    driver = create_driver(url, migrate=False)
    Worker(driver, concurrency=slots, environment="test", poll_interval=1.0).run_forever()


class Pin:
    """What holds the horizon in a phase: nothing, an idle transaction, or four RR readers."""

    def __init__(self, url: str, kind: str) -> None:
        import psycopg

        self.kind = kind
        self.stop = threading.Event()
        self.conns: list[Any] = []
        self.threads: list[threading.Thread] = []
        if kind == "idle-in-transaction":
            conn = psycopg.connect(url)
            conn.execute("SELECT txid_current()")  # an xid, then idle inside the transaction
            self.conns.append(conn)
        elif kind == "4 RR readers":
            for _ in range(4):
                conn = psycopg.connect(url)
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                self.conns.append(conn)
                thread = threading.Thread(target=self._read, args=(conn,), daemon=True)
                thread.start()
                self.threads.append(thread)

    def _read(self, conn: Any) -> None:
        while not self.stop.is_set():
            conn.execute("SELECT count(*) FROM x_jobs").fetchone()
            self.stop.wait(1.0)

    def end(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()
        for conn in self.conns:
            conn.rollback()
            conn.close()


def producer(url: str, rate: int, stop: threading.Event, counts: list[int]) -> None:
    from ultimat3 import create_driver
    from ultimat3.drivers.protocol import EnqueueRequest

    driver = create_driver(url, migrate=False)
    tick = 0.01
    per_tick = rate * tick
    owed = 0.0
    next_at = time.monotonic()
    try:
        while not stop.is_set():
            owed += per_tick
            size = int(owed)
            owed -= size
            if size:
                driver.enqueue_many([EnqueueRequest(name="bench.pinned", payload={}) for _ in range(size)])
                counts[0] += size
            next_at += tick
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    finally:
        driver.close()


def ms(values: list[float], q: float, digits: int) -> str:
    """The ``q`` percentile of ``values`` (seconds) in milliseconds, ``-`` when there are none."""
    return f"{percentile(values, q) * 1000:,.{digits}f}" if values else "-"


def statio(conn: Any) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0) + coalesce(idx_blks_hit, 0)"
        " + coalesce(idx_blks_read, 0), (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'x_jobs')"
        " FROM pg_statio_user_tables WHERE relname = 'x_jobs'").fetchone()
    return int(row[0]), int(row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--role", default="controller")
    parser.add_argument("--url", default="")
    parser.add_argument("--rate", type=int, default=800)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--phase", type=float, default=120.0)
    parser.add_argument("--claims-file", default="")
    parser.add_argument("--label", default="")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.role == "worker":
        worker_main(args.url, args.slots, args.claims_file)
        return

    import psycopg

    from ultimat3 import create_driver

    url = recreate_database(DATABASE)
    create_driver(url).close()
    claims_file = f"/tmp/x_pinned_claims_{os.getpid()}.txt"
    Path(claims_file).unlink(missing_ok=True)
    worker = subprocess.Popen([sys.executable, __file__, "--role", "worker", "--url", url, "--slots", str(args.slots),
                               "--claims-file", claims_file])
    time.sleep(2.0)
    stop = threading.Event()
    counts = [0]
    feeder = threading.Thread(target=producer, args=(url, args.rate, stop, counts), daemon=True)
    phases = ["clean", "idle-in-transaction", "clean again", "4 RR readers", "recovery"]
    windows: list[dict[str, Any]] = []
    monitor = psycopg.connect(url, autocommit=True)
    start = time.time()
    feeder.start()
    try:
        last_buffers, _ = statio(monitor)
        for phase in phases:
            pin = Pin(url, phase)
            phase_end = time.time() + args.phase
            while time.time() < phase_end - 0.001:
                w0 = time.time()
                time.sleep(max(0.0, min(WINDOW, phase_end - w0)))
                buffers, dead = statio(monitor)
                windows.append({"phase": phase, "t0": w0, "t1": time.time(), "buffers": buffers - last_buffers,
                                "dead": dead, "enqueued": counts[0]})
                last_buffers = buffers
                print(f"{time.time() - start:6.0f}s {phase:<20} enqueued {counts[0]:>8,} dead {dead:>8,}", flush=True)
            pin.end()
    finally:
        stop.set()
        feeder.join()
        time.sleep(1.0)
        worker.terminate()
        worker.wait(timeout=60)
    # Post hoc, from the rows themselves: completions and enqueue-to-finish latency per window.
    claims = [tuple(map(float, line.split())) for line in Path(claims_file).read_text().splitlines() if line.strip()]
    rows = monitor.execute(
        "SELECT extract(epoch FROM finished_at), extract(epoch FROM finished_at - created_at) FROM x_jobs"
        " WHERE state = 'done'").fetchall()
    created = sorted(float(r[0]) for r in monitor.execute("SELECT extract(epoch FROM created_at) FROM x_jobs"))
    monitor.close()
    finished = sorted(float(r[0]) for r in rows)
    import bisect

    table_rows = []
    for window in windows:
        t0, t1 = window["t0"], window["t1"]
        done = [lat for fin, lat in rows if t0 <= fin < t1]
        claim = [d for at, d in claims if t0 <= at < t1]
        rate = len(done) / (t1 - t0)
        backlog = bisect.bisect_left(created, t1) - bisect.bisect_left(finished, t1)
        window.update(rate=rate, backlog=backlog)
        table_rows.append([
            f"{t0 - start:.0f}", window["phase"], f"{rate:,.0f}", ms(done, 50, 1), ms(done, 99, 0),
            ms(claim, 50, 1), ms(claim, 99, 0),
            f"{window['buffers'] / max(1, len(done)):,.0f}", f"{window['dead']:,}", f"{backlog:,}"])
    first_clean = [w for w in windows if w["phase"] == "clean"]
    clean_rate = sum(w["rate"] for w in first_clean) / len(first_clean)
    phase_rows = []
    for phase in dict.fromkeys(phases):
        ws = [w for w in windows if w["phase"] == phase]
        done_lat = [lat for fin, lat in rows if any(w["t0"] <= fin < w["t1"] for w in ws)]
        claim = [d for at, d in claims if any(w["t0"] <= at < w["t1"] for w in ws)]
        rate = sum(w["rate"] for w in ws) / len(ws)
        per_job = sum(w["buffers"] for w in ws) / max(1, sum(w["rate"] * (w["t1"] - w["t0"]) for w in ws))
        phase_rows.append([phase, f"{rate:,.0f}", f"{rate / clean_rate:.0%}", ms(claim, 50, 1), ms(claim, 99, 0),
                           ms(done_lat, 99, 0), f"{per_job:,.0f}", f"{max(w['backlog'] for w in ws):,}"])
    phase_table = markdown_table(["phase", "jobs/s", "of clean", "claim p50 ms", "claim p99 ms",
                                  "enqueue to finish p99 ms", "buffers per job", "max backlog"], phase_rows)
    window_table = markdown_table(["t s", "phase", "jobs/s", "e2f p50 ms", "e2f p99 ms", "claim p50 ms",
                                   "claim p99 ms", "buffers/job", "dead tuples", "backlog"], table_rows)
    print(phase_table)
    print(window_table)
    Path(claims_file).unlink(missing_ok=True)
    if not args.no_write:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d")
        label = f", {args.label}" if args.label else ""
        block = (f"{BEGIN}\n### Pinned horizon under load ({stamp}{label})\n\n"
                 f"`bench/pinned_load.py --rate {args.rate} --slots {args.slots} --phase {args.phase:.0f}`: offered "
                 f"{args.rate} jobs/s, one worker process with {args.slots} slots, 1 ms async jobs, phases of "
                 f"{args.phase:.0f} s. \"of clean\" is the phase's completion rate over the first clean phase's.\n\n"
                 f"{phase_table}\n\n<details><summary>per 10 s window</summary>\n\n{window_table}\n\n</details>\n{END}")
        write_block(BEGIN, END, block)
    print(json.dumps({"clean_rate": clean_rate}))


if __name__ == "__main__":
    main()
