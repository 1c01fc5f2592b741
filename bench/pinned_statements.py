"""Issue 22, per statement: the buffers each hot-path statement touches as jobs go by under a pin.

    .venv/bin/python bench/pinned_statements.py [--checkpoints 0,10000,50000,100000] [--no-write]

A REPEATABLE READ session opens a snapshot and keeps it (the "pin"): VACUUM may then remove no row
version newer than it. One client drives jobs through the driver's public API (enqueue_many of
1,000, then claim 100 / ack_many 100 until the queue is empty). At each checkpoint (jobs processed
since the pin) every hot statement runs once under ``EXPLAIN (ANALYZE, BUFFERS)`` with the
parameters the driver would send, inside a transaction that is rolled back, and the table reports
its shared buffers hit + read (the plan's total, planning excluded): claim of 10, settle of 10
(``ack_many``), ack, nack, heartbeat, step record, enqueue, cancel and the lapsed-claim rescue.
Writes the table into bench/RESULTS.md between the ``pinned-statements`` markers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import markdown_table, recreate_database, write_block  # noqa: E402

BEGIN, END = "<!-- pinned-statements:begin -->", "<!-- pinned-statements:end -->"
DATABASE = "x_bench_pinned_statements"
QUEUE = "pinned"


def buffers(conn: Any, sql: str, params: dict[str, Any]) -> int:
    """Shared buffers hit + read by one execution of ``sql``, rolled back afterwards."""
    import psycopg

    with conn.transaction(force_rollback=True), psycopg.ClientCursor(conn) as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0][0]["Plan"]
        return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def statements(driver: Any, queries: dict[str, str]) -> dict[str, int]:
    """Each hot statement once, under EXPLAIN, on jobs made for it."""
    import psycopg
    from psycopg.types.json import Jsonb

    from ultimat3.drivers.protocol import Ack, ClaimRequest, EnqueueRequest

    now = datetime.now(UTC)
    driver.enqueue_many([EnqueueRequest(name="bench.pinned", payload={"i": i}, queue=QUEUE) for i in range(20)])
    claimed = driver.claim(ClaimRequest("bench-pin", limit=10, queues=(QUEUE,)))
    ids = [c.job.id for c in claimed]
    tokens = [c.claim_token for c in claimed]
    out: dict[str, int] = {}
    with psycopg.connect(driver._conninfo, autocommit=True) as conn:
        claim_params = {"now": now, "visible_at": now + timedelta(seconds=30), "limit": 10, "worker": "bench-x",
                        "names": None, "queue": QUEUE}
        if "claim_queue_from" in queries:
            # Where the claimer's cursor stands: the first row its last claim could see.
            first = conn.execute("SELECT priority, run_at, id FROM x_jobs WHERE state = 'ready' AND queue = %s"
                                 " ORDER BY priority DESC, run_at, id LIMIT 1", (QUEUE,)).fetchone()
            out["claim 10"] = buffers(conn, queries["claim_queue_from"], {
                **claim_params, "c_priority": first[0], "c_run_at": first[1], "c_id": first[2]})
        else:
            out["claim 10"] = buffers(conn, queries["claim_queue"], claim_params)
        out["claim 10 from the head (catch-up)"] = buffers(conn, queries["claim_queue"], claim_params)
        out["settle 10 (ack_many)"] = buffers(conn, queries["ack_many"], {
            "ids": ids, "tokens": tokens, "results": [Jsonb(None)] * len(ids), "now": now})
        one = {"id": ids[0], "token": tokens[0], "now": now}
        out["ack"] = buffers(conn, queries["ack"], {**one, "result": Jsonb(None)})
        out["nack (retry)"] = buffers(conn, queries["nack"], {
            **one, "dead": False, "counts": True, "release": False, "run_at": now + timedelta(seconds=5),
            "error": "boom"})
        out["heartbeat"] = buffers(conn, queries["heartbeat"], {**one, "visible_at": now + timedelta(seconds=30)})
        out["step record"] = buffers(conn, queries["steps_record"], {**one, "name": "s", "result": Jsonb(1)})
        out["cancel"] = buffers(conn, queries["cancel"], {"id": ids[1], "reason": "x", "now": now})
        # The lapsed-claim search an hour later, when every claim made so far has lapsed.
        later = now + timedelta(hours=1)
        if "claim_lapsed" in queries:
            # Its own statement, run about once a second and floored at the previous run.
            out["lapsed-claim search (1 h later)"] = buffers(conn, queries["claim_lapsed"], {
                **claim_params, "now": later, "visible_at": later + timedelta(seconds=30), "queues": [QUEUE],
                "floor": later - timedelta(seconds=2)})
        else:
            # Inside every claim: its lapsed branch alone.
            lapsed = queries["claim_queue"].split("), lapsed AS (", 1)[1].split("), picked AS (", 1)[0]
            out["lapsed-claim search (1 h later)"] = buffers(
                conn, lapsed.strip().removesuffix("FOR UPDATE SKIP LOCKED"), {**claim_params, "now": later})
        out["enqueue"] = buffers_enqueue(conn, driver, queries["enqueue"])
    driver.ack_many([Ack(i, t, None) for i, t in zip(ids, tokens, strict=True)])
    # Drain what is left, so the next checkpoint starts from an empty queue.
    while batch := driver.claim(ClaimRequest("bench-pin", limit=100, queues=(QUEUE,))):
        driver.ack_many([Ack(c.job.id, c.claim_token, None) for c in batch])
    return out


def buffers_enqueue(conn: Any, driver: Any, sql: str) -> int:
    """The enqueue statement with the parameters the driver stages for one request."""
    from ultimat3.drivers.postgres.driver import _Staged
    from ultimat3.drivers.protocol import EnqueueRequest

    staged = _Staged(EnqueueRequest(name="bench.pinned", payload={"i": -1}, queue=QUEUE), driver.clock.now())
    return buffers(conn, sql, {**staged.params, "channel": driver.channel})


def process(driver: Any, jobs: int) -> float:
    """Push ``jobs`` jobs through enqueue, claim and ack; returns jobs per second."""
    from ultimat3.drivers.protocol import Ack, ClaimRequest, EnqueueRequest

    began = time.perf_counter()
    done = 0
    while done < jobs:
        size = min(1000, jobs - done)
        driver.enqueue_many([EnqueueRequest(name="bench.pinned", payload={"i": i}, queue=QUEUE) for i in range(size)])
        while batch := driver.claim(ClaimRequest("bench-pin", limit=100, queues=(QUEUE,))):
            driver.ack_many([Ack(c.job.id, c.claim_token, None) for c in batch])
            done += len(batch)
    return jobs / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--checkpoints", default="0,10000,50000,100000")
    parser.add_argument("--label", default="", help="a note for the table heading (which code ran)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    checkpoints = [int(part) for part in args.checkpoints.split(",")]

    import psycopg

    from ultimat3 import create_driver
    from ultimat3.drivers.postgres.driver import _Q

    url = recreate_database(DATABASE)
    driver = create_driver(url)
    pin = psycopg.connect(url)
    try:
        # Warm the table a little, settle it, then pin the horizon for the rest of the run.
        process(driver, 2000)
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("VACUUM ANALYZE x_jobs")
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM x_jobs").fetchone()
        results: dict[int, dict[str, int]] = {}
        processed = 0
        rates: list[str] = []
        for checkpoint in checkpoints:
            if checkpoint > processed:
                rate = process(driver, checkpoint - processed)
                rates.append(f"{processed:,}-{checkpoint:,}: {rate:,.0f} jobs/s")
                processed = checkpoint
            results[checkpoint] = statements(driver, dict(_Q))
            print(f"after {checkpoint:>7,} jobs under the pin: {json.dumps(results[checkpoint])}", flush=True)
    finally:
        pin.close()
        driver.close()
    names = list(results[checkpoints[0]])
    header = ["statement", *[f"{c:,} jobs" for c in checkpoints]]
    rows = [[name, *[f"{results[c][name]:,}" for c in checkpoints]] for name in names]
    table = markdown_table(header, rows)
    print(table)
    print("\n".join(rates))
    if not args.no_write:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d")
        block = (f"{BEGIN}\n### Pinned horizon, per statement ({stamp}{', ' + args.label if args.label else ''})\n\n"
                 "Shared buffers (hit + read) of one execution of each hot statement under `EXPLAIN (ANALYZE, "
                 "BUFFERS)`, after N jobs were processed while a REPEATABLE READ session held its snapshot "
                 "(`bench/pinned_statements.py`). Flat rows are the goal of issue 22. \"claim 10\" is the claim "
                 "a worker makes (from its cursor, after the change); \"from the head\" the walk it makes every "
                 "30 s as a safety net (before the change: every claim). The lapsed-claim search is measured "
                 "an hour later, when every claim made so far has lapsed.\n\n"
                 f"{table}\n\nThroughput of the single client between checkpoints: {'; '.join(rates)}.\n{END}")
        write_block(BEGIN, END, block)


if __name__ == "__main__":
    main()
