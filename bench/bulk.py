"""An incident on PostgreSQL: retry 100,000 dead jobs in bulk while another queue keeps draining.

    bench/.venv/bin/python bench/bulk.py [--dead 100000] [--batch 500] [--no-write]

Setup (not measured): ``--dead`` jobs in queue ``billing``, dead with ``X_PAYMENT_DOWN``, and
200,000 ready jobs in queue ``mail``. A drainer PROCESS claims 10 at a time from ``mail`` and acks
them (one claim and one ack_many per round), recording every claim's latency. The main process lets
it run for a baseline, then runs the operator's bulk retry (``ultimat3.jobs.operator.bulk``, the
function ``x jobs retry --queue billing --error X_PAYMENT_DOWN --yes`` calls) with the default batch
size, and reports how long it took and the drainer's claim latency before and during it.
Targets (issue 26): under 30 s, claim p99 during it under 100 ms. Writes its table into
bench/RESULTS.md between the ``bulk`` markers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import markdown_table, percentile, recreate_database, vacuum_analyze, write_block  # noqa: E402

BEGIN, END = "<!-- bulk:begin -->", "<!-- bulk:end -->"
DATABASE = "x_bench_bulk"
MAIL_JOBS = 200_000


def drainer(url: str, out: Any, stop: Any) -> None:
    """Claim 10 from ``mail`` and ack them, until told to stop; send (wall time, claim seconds) pairs."""
    from ultimat3 import create_driver
    from ultimat3.drivers.protocol import Ack, ClaimRequest

    driver = create_driver(url, migrate=False)
    samples: list[tuple[float, float]] = []
    try:
        while not stop.is_set():
            began = time.perf_counter()
            claimed = driver.claim(ClaimRequest("drainer", limit=10, queues=("mail",)))
            samples.append((time.time(), time.perf_counter() - began))
            if not claimed:
                break
            driver.ack_many([Ack(c.job.id, c.claim_token, None) for c in claimed])
    finally:
        out.send(samples)
        driver.close()


def setup(url: str, dead: int) -> None:
    import psycopg

    from ultimat3 import create_driver
    from ultimat3.drivers.protocol import EnqueueRequest

    driver = create_driver(url)
    try:
        for queue, count in (("billing", dead), ("mail", MAIL_JOBS)):
            for start in range(0, count, 5_000):
                driver.enqueue_many([EnqueueRequest(name=f"{queue}.job", payload={"i": i}, queue=queue)
                                     for i in range(start, min(count, start + 5_000))])
    finally:
        driver.close()
    with psycopg.connect(url, autocommit=True) as conn:
        # Dead the way a failing provider leaves them (a bench shortcut: the state, not the hour).
        conn.execute("UPDATE x_jobs SET state = 'dead', attempt = 5, finished_at = now(), updated_at = now(), "
                     "last_error = 'ConfigError: X_PAYMENT_DOWN: provider answered 503' WHERE queue = 'billing'")
    vacuum_analyze(url)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dead", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=None, help="bulk batch size (default: the library's)")
    ap.add_argument("--baseline", type=float, default=3.0, help="seconds of drain before the bulk retry")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from ultimat3 import create_driver
    from ultimat3.drivers.protocol import JobFilter
    from ultimat3.jobs.operator import DEFAULT_BATCH, bulk

    url = recreate_database(DATABASE)
    print(f"setting up {args.dead:,} dead billing jobs and {MAIL_JOBS:,} ready mail jobs ...", flush=True)
    setup(url, args.dead)
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    stop = ctx.Event()
    proc = ctx.Process(target=drainer, args=(url, send, stop))
    proc.start()
    time.sleep(args.baseline)
    driver = create_driver(url, migrate=False)
    batch = args.batch or DEFAULT_BATCH
    began_wall = time.time()
    began = time.perf_counter()
    outcome = bulk(driver, "retry", JobFilter(queue="billing", error="X_PAYMENT_DOWN"), actor="bench",
                   batch_size=batch)
    took = time.perf_counter() - began
    ended_wall = time.time()
    time.sleep(1.0)
    stop.set()
    samples: list[tuple[float, float]] = receive.recv()
    proc.join(timeout=30)
    driver.close()

    first_at = samples[0][0] if samples else began_wall
    before = [s for at, s in samples if at < began_wall]
    during = [s for at, s in samples if began_wall <= at <= ended_wall]
    assert outcome.touched == args.dead, outcome

    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:.1f} ms" if values else "–"

    rows = [[f"{args.dead:,}", f"{batch}", f"{outcome.batches}", f"{took:.1f} s", f"{args.dead / took:,.0f}/s",
             ms(before, 50), ms(before, 99), ms(during, 50), ms(during, 99),
             f"{10 * len(before) / max(1e-9, began_wall - first_at):,.0f}/s",
             f"{10 * len(during) / max(1e-9, ended_wall - began_wall):,.0f}/s"]]
    header = ["dead jobs retried", "batch", "batches", "took", "rate", "mail claim p50 before", "p99 before",
              "p50 during", "p99 during", "mail jobs/s before", "mail jobs/s during"]
    table = markdown_table(header, rows)
    print(table)
    if not args.no_write:
        block = "\n".join([
            BEGIN,
            "### Bulk retry during an incident (issue 26)",
            "",
            f"`bench/bulk.py`, {time.strftime('%Y-%m-%d')}: a bulk retry of dead jobs in queue `billing` "
            "(`ultimat3.jobs.operator.bulk`, what `x jobs retry --queue billing --error X_PAYMENT_DOWN --yes` "
            "runs) while a drainer process claims 10 at a time from queue `mail` and acks them. Claim latency "
            "of that drainer before and during the bulk retry. Targets: under 30 s, p99 during under 100 ms.",
            "",
            table,
            END,
        ])
        write_block(BEGIN, END, block)


if __name__ == "__main__":
    main()
