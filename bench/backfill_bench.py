"""Backfill sweeps and pacer accuracy (PostgreSQL; ours vs a hand-written keyset loop).

    python bench/backfill_bench.py sweep       --url postgresql://.../bench_bf_ours  --rows 200000
    python bench/backfill_bench.py sweep-floor --url postgresql://.../bench_bf_floor --rows 200000
    python bench/backfill_bench.py pacer       --url postgresql://.../bench_bf_pacer --rate 50 --batches 100
    python bench/backfill_bench.py pacer-only  --rate 500 --batches 500

``sweep``: ``backfill(engine="job-store", name=..., tenant='none', source=lambda ctx: select(bench_rows.c.id),
handle=<UPDATE bench_rows SET v = v + 1 WHERE id = ANY(batch.keys)>, batch=1000, rate=<high>)``
run with ``run_backfill(handle, driver=...)`` (enqueue, then a concurrency-1 worker in this
process), i.e. the whole product path: claim, ledger, a durable step per batch, the pacer.

``sweep-floor``: what a person writes by hand: ``SELECT id ... WHERE id > %s ORDER BY id LIMIT
1000`` then the same ``UPDATE`` with the page's ids, on one autocommit psycopg connection.

``pacer``: a real backfill with ``batch=1`` over ``--batches`` rows at ``--rate``; the handler
stamps each batch; achieved rate = (stamps - 1) / (last stamp - first stamp), leaving out the
first batch (it also pays the engine's first connection, a one-off that is not pacing).
``pacer-only``: the same stamps around ``Pacer.wait`` alone (no database), to tell the pacer's
own timing apart from the per-batch work it has to absorb. ``--variant scheduled`` runs a
reference pacer instead (``ScheduledPacer`` below: the next slot is the previous SLOT plus one
interval, not the wake-up time plus one interval, so oversleeping does not accumulate) — the fix
this bench first proposed, which ``Pacer`` has since adopted; kept as a yardstick.

``sweep --variant joined``: the handler runs the same ``UPDATE`` through ``batch.connection``,
the documented exactly-once form: it commits with the batch's checkpoint, one COMMIT per batch
as in the hand loop (the default handler's own autocommit connection adds the checkpoint's).

``sweep --variant plain-engine`` passes ``engine=create_engine(url, pool_pre_ping=False,
isolation_level="AUTOCOMMIT")`` to ``backfill()`` instead of the default engine the pass builds
from the driver's URL (``pool_pre_ping=True``, a transaction per page): how much of the gap to
the hand-written loop is the page read's extra round trips.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psycopg
from benchlib import emit, mono, vacuum_analyze

ROWS_DDL = """
CREATE TABLE IF NOT EXISTS bench_rows (id bigint PRIMARY KEY, v integer NOT NULL DEFAULT 0, note text);
"""
UPDATE = "UPDATE bench_rows SET v = v + 1 WHERE id = ANY(%s)"
PAGE_FIRST = "SELECT id FROM bench_rows ORDER BY id LIMIT %s"
PAGE_NEXT = "SELECT id FROM bench_rows WHERE id > %s ORDER BY id LIMIT %s"


def make_rows(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(ROWS_DDL)
        conn.execute("TRUNCATE bench_rows")
        conn.execute(
            "INSERT INTO bench_rows (id, note) SELECT g, md5(g::text) FROM generate_series(1, %s) AS g", (rows,)
        )
    vacuum_analyze(url)


def check_rows(url: str, rows: int) -> int:
    with psycopg.connect(url) as conn:
        (touched,) = conn.execute("SELECT count(*) FROM bench_rows WHERE v = 1").fetchone()
    return int(touched)


class ScheduledPacer:
    """A slot-scheduled reference pacer, for comparison only (same contract as ``Pacer.wait``).

    Slots are kept on a schedule: after a wait the next slot is the previous slot plus one
    interval, so a sleep that overshoots by 0.1 ms is paid back on the next wait instead of being
    added to every interval. A pass that fell more than one interval behind (a slow batch, a
    stall) restarts the schedule from now: it never bursts to catch up.
    """

    def __init__(self, rate: float) -> None:
        from ultimat3.backfill.pacer import RESOLUTION

        self.interval = 1.0 / rate
        self.resolution = RESOLUTION
        self.next: float | None = None

    def wait(self, signal) -> None:
        now = time.monotonic()
        if self.next is None or now - self.next > self.interval:
            self.next = now + self.interval  # first batch, or too far behind: no wait, no burst
            return
        remaining = self.next - now
        if remaining >= self.resolution:
            signal.wait(remaining)
        self.next += self.interval


def _declare(args, stamps: list[float] | None):
    from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, select

    from ultimat3.backfill import backfill

    metadata = MetaData()
    bench_rows = Table(
        "bench_rows", metadata,
        Column("id", BigInteger, primary_key=True), Column("v", Integer), Column("note", Text),
    )
    conn = psycopg.connect(args.url, autocommit=True)

    def handle(batch) -> None:
        if stamps is not None:
            stamps.append(mono())
        conn.execute(UPDATE, (batch.keys,))

    def handle_joined(batch) -> None:
        # The documented exactly-once path: the UPDATE goes through the batch's own connection,
        # so it commits with the batch's checkpoint (one COMMIT per batch, as in the hand loop).
        batch.connection.exec_driver_sql(UPDATE, (batch.keys,))

    extra = {}
    if args.variant == "plain-engine":
        from sqlalchemy import create_engine

        extra["engine"] = create_engine(
            args.url.replace("postgresql://", "postgresql+psycopg://", 1),
            pool_pre_ping=False, isolation_level="AUTOCOMMIT",
        )
    extra.setdefault("engine", "job-store")
    return backfill(
        name=f"bench.{args.op}",
        tenant="none",
        source=lambda ctx: select(bench_rows.c.id),
        handle=handle_joined if args.variant == "joined" else handle,
        batch=args.batch,
        rate=args.rate,
        **extra,
    ), conn


def sweep(args) -> None:
    from ultimat3.backfill import run_backfill
    from ultimat3.jobs import create_driver

    make_rows(args.url, args.rows)
    driver = create_driver(args.url)
    handle, conn = _declare(args, None)
    started = time.perf_counter()
    report = run_backfill(handle, driver=driver)
    seconds = time.perf_counter() - started
    conn.close()
    driver.close()
    emit(rows=report.rows, batches=report.batches, seconds=seconds, rate=report.rows / seconds,
         batches_per_s=report.batches / seconds, verified=check_rows(args.url, args.rows))


def sweep_floor(args) -> None:
    make_rows(args.url, args.rows)
    rows = batches = 0
    with psycopg.connect(args.url, autocommit=True) as conn:
        started = time.perf_counter()
        cursor = None
        while True:
            if cursor is None:
                page = conn.execute(PAGE_FIRST, (args.batch,)).fetchall()
            else:
                page = conn.execute(PAGE_NEXT, (cursor, args.batch)).fetchall()
            if not page:
                break
            ids = [row[0] for row in page]
            conn.execute(UPDATE, (ids,))
            cursor = ids[-1]
            rows += len(ids)
            batches += 1
            if len(ids) < args.batch:
                break
        seconds = time.perf_counter() - started
    emit(rows=rows, batches=batches, seconds=seconds, rate=rows / seconds, batches_per_s=batches / seconds,
         verified=check_rows(args.url, args.rows))


def _rate_of(stamps: list[float], declared: float) -> dict:
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
    achieved = (len(stamps) - 1) / span if len(stamps) > 1 else float("nan")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "declared": declared,
        "achieved": achieved,
        "error_pct": (achieved - declared) / declared * 100,
        "batches": len(stamps),
        "seconds": span,
        "max_gap_ms": max(gaps) * 1000 if gaps else float("nan"),
        "min_gap_ms": min(gaps) * 1000 if gaps else float("nan"),
    }


def pacer(args) -> None:
    from ultimat3.backfill import run_backfill
    from ultimat3.jobs import create_driver

    make_rows(args.url, args.batches)
    driver = create_driver(args.url)
    stamps: list[float] = []
    handle, conn = _declare(args, stamps)
    run_backfill(handle, driver=driver)
    conn.close()
    driver.close()
    emit(**_rate_of(stamps[1:], args.rate))


def pacer_only(args) -> None:
    from ultimat3.backfill.pacer import Pacer
    from ultimat3.jobs.signal import AbortSignal

    pace = ScheduledPacer(args.rate) if args.variant == "scheduled" else Pacer(args.rate, "bench.pacer-only")
    signal = AbortSignal("bench.pacer-only")
    stamps: list[float] = []
    for _ in range(args.batches):
        pace.wait(signal)
        stamps.append(mono())
    emit(**_rate_of(stamps, args.rate))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("op", choices=["sweep", "sweep-floor", "pacer", "pacer-only"])
    p.add_argument("--url", default="")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rate", type=float, default=10_000.0)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--variant", default="", help="sweep: plain-engine; pacer-only: scheduled")
    arguments = p.parse_args()
    if arguments.op in ("pacer", "pacer-only"):
        arguments.batch = 1
    from ultimat3.tenancy import operator_context

    with operator_context("bench", "the benchmark enqueues its own passes"):
        {"sweep": sweep, "sweep-floor": sweep_floor, "pacer": pacer, "pacer-only": pacer_only}[
            arguments.op.replace("_", "-")
        ](arguments)
