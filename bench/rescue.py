"""How long a SIGKILLed worker's jobs wait before another worker starts them: before (the claim's
visibility timeout, 30 s, is the only way back) and after (the liveness probe of issue 19).

    bench/.venv/bin/python bench/rescue.py [--jobs 8] [--kinds sqlite,postgres] [--no-write]

Per backend and mode: worker A (a process) claims ``--jobs`` jobs that hold their slot; worker B
starts; A is SIGKILLed; the table gives the time from the kill to B's start of each job (median and
max). Both workers use the defaults a user gets: ``visibility_timeout=30``, ``liveness_interval=1``
(``None`` for "before"). Writes its table into bench/RESULTS.md between the ``rescue`` markers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import ADMIN_URL, markdown_table, write_block  # noqa: E402

BEGIN, END = "<!-- rescue:begin -->", "<!-- rescue:end -->"


def worker_main(url: str, worker_id: str, liveness: float, holds: bool, marks: str) -> None:
    """One worker process: ``bench.hold`` holds its slot (A) or records its start and returns (B)."""
    from ultimat3 import Ctx, Worker, create_driver, job

    def mark(job_id: str) -> None:
        with open(marks, "a", encoding="utf-8") as out:
            out.write(f"{job_id} {time.time()}\n")

    async def hold(input: dict[str, object], ctx: Ctx) -> None:
        mark(ctx.actor.id.rsplit(":", 1)[-1])  # one short append: the start time is the point
        if holds:
            await asyncio.sleep(3600)

    job(name="bench.hold", tenant="none")(hold)
    driver = create_driver(url, migrate=False)
    worker = Worker(driver, concurrency=16, worker_id=worker_id, environment="test", poll_interval=1.0,
                    liveness_interval=liveness or None)
    Path(marks + ".ready").touch()
    try:
        worker.run_forever()
    finally:
        driver.close()


def _lines(path: Path) -> list[tuple[str, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((parts[0], float(parts[1])))
    return out


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def measure(url: str, liveness: float, jobs: int, folder: Path) -> list[float]:
    """Seconds from A's SIGKILL to B's start of each of A's jobs."""
    from ultimat3 import create_driver
    from ultimat3.drivers.protocol import EnqueueRequest

    driver = create_driver(url)
    run = uuid.uuid4().hex[:6]
    marks_a, marks_b = folder / f"a-{run}.log", folder / f"b-{run}.log"
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(worker_id: str, holds: bool, marks: Path) -> subprocess.Popen[bytes]:
        path = os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path}
        proc = subprocess.Popen([sys.executable, __file__, "_worker", url, worker_id, str(liveness),
                                 "1" if holds else "0", str(marks)], env=env)
        procs.append(proc)
        _wait(lambda: Path(str(marks) + ".ready").exists(), 30, f"{worker_id} to start")
        return proc

    try:
        a = spawn(f"A-{run}", True, marks_a)
        driver.enqueue_many([EnqueueRequest(name="bench.hold", payload={}) for _ in range(jobs)])
        _wait(lambda: len(_lines(marks_a)) >= jobs, 30, "A to start every job")
        spawn(f"B-{run}", False, marks_b)
        time.sleep(3.5)  # B registered, its session older than the 3 s settle: the steady state of a fleet
        killed = time.time()
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        _wait(lambda: len(_lines(marks_b)) >= jobs, 120, "B to start every job")
        return sorted(at - killed for _, at in _lines(marks_b))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        driver.close()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        _, _, url, worker_id, liveness, holds, marks = sys.argv
        worker_main(url, worker_id, float(liveness), holds == "1", marks)
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--kinds", default="sqlite,postgres")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import psycopg
    from psycopg import sql

    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for kind in args.kinds.split(","):
            for mode, liveness in (("before (visibility timeout only)", 0.0), ("after (liveness probe, 1 s)", 1.0)):
                if kind == "sqlite":
                    url = f"sqlite:///{folder / f'rescue-{uuid.uuid4().hex[:6]}.db'}"
                    delays = measure(url, liveness, args.jobs, folder)
                else:
                    name = f"bench_rescue_{uuid.uuid4().hex[:6]}"
                    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                    try:
                        base = ADMIN_URL.rsplit("/", 1)[0]
                        delays = measure(f"{base}/{name}", liveness, args.jobs, folder)
                    finally:
                        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                            admin.execute(drop.format(sql.Identifier(name)))
                row = [kind, mode, str(len(delays)), f"{statistics.median(delays):.2f} s", f"{max(delays):.2f} s"]
                rows.append(row)
                print(" | ".join(row), flush=True)
    header = ["driver", "mode", "jobs", "kill -> restart, median", "max"]
    table = markdown_table(header, rows)
    print(table)
    if not args.no_write:
        block = (f"{BEGIN}\n## Rescue of a SIGKILLed worker's jobs (`bench/rescue.py`, {time.strftime('%Y-%m-%d')})\n\n"
                 f"Worker A holds {args.jobs} jobs, worker B runs beside it, A is SIGKILLed; time until B starts"
                 " each of A's jobs. Defaults: visibility timeout 30 s, liveness probe every 1 s (jittered).\n\n"
                 f"{table}\n{END}")
        write_block(BEGIN, END, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
