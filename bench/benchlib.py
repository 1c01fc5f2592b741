"""Helpers shared by every bench script: the result line, clocks, percentiles, database admin.

Each system script (``sys_ultimat3.py``, ``peers_*.py``, ``floor_*.py``) is run by ``run.py`` as
its own process, one measurement per process, and reports by printing ONE line::

    RESULT {"jobs": 20000, "seconds": 3.21, ...}

so a crashed or hung case costs one table cell, not the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def write_block(begin: str, end: str, block: str) -> None:
    """Put ``block`` (which starts with ``begin`` and ends with ``end``) into bench/RESULTS.md in
    place of the block between those markers, or append it when there is none yet."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
    current = "# Benchmark results\n" if not os.path.exists(path) else open(path).read()  # noqa: SIM115
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        _, tail = rest.split(end, 1)
        current = head + block + tail
    else:
        current = current.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as fh:
        fh.write(current)


def mono() -> float:
    """System-wide monotonic seconds: comparable between processes on one Linux host."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def emit(**fields: Any) -> None:
    """Report this process's measurement to run.py."""
    sys.stdout.write("RESULT " + json.dumps(fields) + "\n")
    sys.stdout.flush()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def latency_summary(latencies: Sequence[float], warmup: int) -> dict[str, Any]:
    """p50/p90/p99/max in milliseconds, dropping the first ``warmup`` samples."""
    kept = list(latencies[warmup:]) or list(latencies)
    return {
        "samples": len(kept),
        "p50_ms": percentile(kept, 50) * 1000,
        "p90_ms": percentile(kept, 90) * 1000,
        "p99_ms": percentile(kept, 99) * 1000,
        "max_ms": max(kept) * 1000 if kept else math.nan,
        "mean_ms": sum(kept) / len(kept) * 1000 if kept else math.nan,
    }


def db_url(name: str) -> str:
    """The URL of database ``name`` on the server ``ADMIN_URL`` points at."""
    base, _, _ = ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


def recreate_database(name: str) -> str:
    """DROP (forcing out stragglers) and CREATE database ``name``; returns its URL."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return db_url(name)


def drop_database(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def vacuum_analyze(url: str) -> None:
    """Settle a freshly prefilled database so every system starts its drain from the same state:
    statistics current, no dead tuples, and no dirty buffers left for a checkpoint to flush in
    the middle of the measurement (this VM's fsync latency swings a lot under a checkpoint)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def checkpoint() -> None:
    """Flush the server's dirty buffers now, so the next case does not pay for the last one's."""
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def chunks(n: int, size: int) -> list[range]:
    """``range(n)`` cut into consecutive ranges of at most ``size``."""
    return [range(start, min(n, start + size)) for start in range(0, n, size)]


def parser(description: str) -> argparse.ArgumentParser:
    """The command line every system script shares."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("op", choices=["enqueue", "drain", "latency"])
    p.add_argument("--url", required=True, help="postgresql://... or sqlite:///path")
    p.add_argument("--n", type=int, default=20_000, help="jobs")
    p.add_argument("--mode", choices=["single", "batch"], default="single", help="enqueue: one call per job or batches")
    p.add_argument("--batch", type=int, default=1000, help="jobs per batch call (enqueue --mode batch, prefill)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--gap", type=float, default=0.02, help="latency: seconds between enqueues")
    p.add_argument("--warmup", type=int, default=10, help="latency: samples dropped at the start")
    p.add_argument("--variant", default="", help="system-specific knob (see each script)")
    return p


def url_from_argv() -> str:
    """``--url`` from the command line (or ``BENCH_URL``), for modules that need it at import.

    A ``spawn`` child process re-imports the script; it finds the URL in ``BENCH_URL``, which the
    parent sets before starting it.
    """
    argv = sys.argv
    for index, arg in enumerate(argv):
        if arg == "--url" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--url="):
            return arg.split("=", 1)[1]
    return os.environ.get("BENCH_URL", "")


def _postgres_cpu_seconds() -> float:
    """CPU seconds used so far by every ``postgres`` process on this host (from /proc).

    Counts reaped children too (``cutime``/``cstime``): a backend whose connection closed inside
    the measured block has exited, and its CPU is then on the postmaster's account.
    """
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        if name.startswith("postgres"):
            fields = stat[stat.rfind(")") + 2 :].split()
            total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / tick


class CpuMeter:
    """Wall seconds, this process's CPU seconds and the PostgreSQL server's over a block.

    ``client_cpu / wall`` near 1.0 means the client is CPU-bound on one core (the GIL);
    ``server_cpu / wall`` shows how hard the database worked for it. Both are reported as
    fractions of ONE core (the machine has ``os.cpu_count()``).
    """

    def __enter__(self) -> CpuMeter:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self._pg = _postgres_cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.client_cpu = time.process_time() - self._cpu
        self.server_cpu = _postgres_cpu_seconds() - self._pg

    def report(self) -> dict[str, float]:
        return {
            "client_cpu_cores": round(self.client_cpu / self.wall, 3),
            "server_cpu_cores": round(self.server_cpu / self.wall, 3),
        }
