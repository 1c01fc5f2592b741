"""Issue 22 on SQLite: what a long read transaction does to the embedded default.

    .venv/bin/python bench/pinned_sqlite.py [--rounds 10] [--jobs 2000] [--no-write]

SQLite has no VACUUM horizon; a reader that keeps an old snapshot instead keeps the WAL from being
checkpointed, so the WAL grows with every write. Rounds of ``--jobs`` jobs (enqueue_many of 500,
then claim 50 / ack_many until empty, one client) run with no reader, then with a reader that
opened a transaction and read x_jobs, then again after it ended. Per round: jobs/s, microseconds
per job, the WAL file's size, and what ``driver.oldest_snapshot()`` (the worker's
``X_DB_HORIZON_PINNED`` check) reports. Writes its table into bench/RESULTS.md between the
``pinned-sqlite`` markers.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import markdown_table, write_block  # noqa: E402

BEGIN, END = "<!-- pinned-sqlite:begin -->", "<!-- pinned-sqlite:end -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from ultimat3.drivers.protocol import Ack, ClaimRequest, EnqueueRequest
    from ultimat3.drivers.sqlite.driver import SqliteDriver

    folder = tempfile.mkdtemp(prefix="x_pinned_sqlite_")
    path = os.path.join(folder, "x.db")
    driver = SqliteDriver(path)
    driver.migrate()
    rows = []

    def round_(phase: str, number: int) -> None:
        began = time.perf_counter()
        done = 0
        for start in range(0, args.jobs, 500):
            count = min(500, args.jobs - start)
            driver.enqueue_many([EnqueueRequest(name="bench.pinned", payload={"i": i}) for i in range(count)])
        while batch := driver.claim(ClaimRequest("bench", limit=50)):
            driver.ack_many([Ack(c.job.id, c.claim_token, None) for c in batch])
            done += len(batch)
        seconds = time.perf_counter() - began
        holder = driver.oldest_snapshot()
        size = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
        rows.append([phase, str(number), f"{done / seconds:,.0f}", f"{seconds / done * 1e6:,.0f}",
                     f"{size / 2**20:,.1f}", "-" if holder is None else (holder.state or holder.kind)])
        print(rows[-1], flush=True)

    try:
        for number in range(1, 4):
            round_("no reader", number)
        reader = sqlite3.connect(path)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM x_jobs").fetchone()
        for number in range(1, args.rounds + 1):
            round_("reader open", number)
        reader.rollback()
        reader.close()
        for number in range(1, 4):
            round_("reader ended", number)
    finally:
        driver.close()
    table = markdown_table(["phase", "round", "jobs/s", "us per job", "WAL MiB", "oldest_snapshot()"], rows)
    print(table)
    if not args.no_write:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d")
        write_block(BEGIN, END, f"{BEGIN}\n### Pinned horizon on SQLite ({stamp})\n\n"
                    f"`bench/pinned_sqlite.py --rounds {args.rounds} --jobs {args.jobs}`: rounds of {args.jobs} jobs "
                    "(enqueue_many, then claim 50 / ack_many until empty, one client) before, during and after a "
                    "reader holds a read transaction on the file.\n\n" + table + f"\n{END}")


if __name__ == "__main__":
    main()
