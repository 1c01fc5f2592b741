"""Issue 13's "claim cost as the table grows": claim p50/p99 of a worker-sized claim (10) on an
empty table, then beside 1M finished and 100k waiting rows.

    .venv/bin/python bench/claim_growth.py [--finished 1000000] [--waiting 100000] [--claims 2000] [--no-write]

One client claims 10 and acks them (``ack_many``), ``--claims`` times, through the driver, first
with only the claimed rows in the table, then after bulk-inserting ``--finished`` done rows and
``--waiting`` ready ones (``generate_series``, then ``VACUUM ANALYZE``, as a live table would be
vacuumed). Claims walk from the claimer's cursor (its first claim from the head). Target (issue 13):
claim p99 <= 1.5x the empty-table claim. Writes its table into bench/RESULTS.md between the
``claim-growth`` markers.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import markdown_table, percentile, recreate_database, write_block  # noqa: E402

BEGIN, END = "<!-- claim-growth:begin -->", "<!-- claim-growth:end -->"
DATABASE = "x_bench_claim_growth"


def measure(driver: Any, claims: int, url: str) -> list[float]:
    """Claim-and-ack ``claims`` times (after a tenth as many unmeasured, to warm the caches and
    the statements), once the server has checkpointed: so neither table pays for a checkpoint
    that the other's setup started (filling 1.1M rows writes more WAL than ``max_wal_size``, and
    the checkpoint it triggers was measured as the grown table's cost: 1.3x to 3.3x run to run)."""
    import psycopg

    from ultimat3.drivers.protocol import Ack, ClaimRequest, EnqueueRequest

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    samples: list[float] = []
    for _ in range(claims // 10 + claims):
        driver.enqueue_many([EnqueueRequest(name="bench.grow", payload={}, queue="hot") for _ in range(10)])
        began = time.perf_counter()
        got = driver.claim(ClaimRequest("bench", limit=10, queues=("hot",)))
        samples.append(time.perf_counter() - began)
        driver.ack_many([Ack(c.job.id, c.claim_token, None) for c in got])
    return samples[claims // 10:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import psycopg

    from ultimat3 import create_driver

    url = recreate_database(DATABASE)
    driver = create_driver(url)
    try:
        empty = measure(driver, args.claims, url)
        with psycopg.connect(url, autocommit=True) as conn:
            began = time.perf_counter()
            conn.execute(
                "INSERT INTO x_jobs (id, run_id, name, queue, payload, state, priority, run_at, created_at,"
                " updated_at, finished_at) SELECT 'f' || i, 'f' || i, 'bench.old', 'hot', '{}', 'done', 0,"
                " now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',"
                " now() - interval '1 day'"
                " FROM generate_series(1, %s) AS i", (args.finished,))
            # Waiting rows in another queue: a backlog the hot queue's claims must not walk.
            conn.execute(
                "INSERT INTO x_jobs (id, run_id, name, queue, payload, state, priority, run_at, created_at, updated_at)"
                " SELECT 'w' || i, 'w' || i, 'bench.later', 'cold', '{}', 'ready', 0, now(), now(), now()"
                " FROM generate_series(1, %s) AS i", (args.waiting,))
            conn.execute("VACUUM ANALYZE x_jobs")
            filled = time.perf_counter() - began
        grown = measure(driver, args.claims, url)
    finally:
        driver.close()
    rows = [
        ["empty table", f"{percentile(empty, 50) * 1000:.2f}", f"{percentile(empty, 99) * 1000:.2f}", "1.00x"],
        [f"+{args.finished:,} finished, +{args.waiting:,} waiting", f"{percentile(grown, 50) * 1000:.2f}",
         f"{percentile(grown, 99) * 1000:.2f}", f"{percentile(grown, 99) / percentile(empty, 99):.2f}x"],
    ]
    table = markdown_table(["table", "claim p50 ms", "claim p99 ms", "p99 over empty"], rows)
    print(table)
    print(f"(filling took {filled:.0f}s)")
    if not args.no_write:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d")
        write_block(BEGIN, END, f"{BEGIN}\n### Claim cost as the table grows ({stamp})\n\n"
                    f"`bench/claim_growth.py --finished {args.finished} --waiting {args.waiting} "
                    f"--claims {args.claims}`:"
                    " one client claims 10 from queue `hot` and acks them (a tenth more first, unmeasured, each"
                    " table after a CHECKPOINT); the grown table holds the finished rows in"
                    " `hot` and the waiting backlog in `cold`. Target (issue 13): p99 <= 1.5x the empty table's.\n\n"
                    + table + f"\n{END}")


if __name__ == "__main__":
    main()
