"""A process whose wall clock the clock-skew tests set off with libfaketime:
``python -m tests.process.skew_app MODE --url URL ...``.

Modes (each through the public API, as a user's process would):

- ``worker``: run a :class:`~ultimat3.Worker` over ``skew.hold``; with ``--enqueue N`` it first
  enqueues N holds itself (under its own clock).
- ``enqueue``: enqueue one ``skew.hold`` with ``--delay`` seconds and record the server's time
  right after, so the test can tell when the job was due by the database's clock.
- ``lease``: for ``--seconds``, take the lease ``skew`` (limit 1), hold it a while, give it back;
  every hold is recorded with the server's times.

Every record is written with the SERVER's ``clock_timestamp()``, never this process's clock, so
the test judges with the one clock both processes share.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

import psycopg
from pydantic import BaseModel

MARKS = """
CREATE TABLE IF NOT EXISTS skew_marks (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    job_id text,
    worker text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    until timestamptz
)
"""


class Hold(BaseModel):
    """Hold the claim this many seconds."""

    seconds: float = 6.0


def mark(url: str, kind: str, worker: str, job_id: str | None = None) -> None:
    """One row in ``skew_marks`` stamped by the server."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO skew_marks (kind, job_id, worker) VALUES (%s, %s, %s)", (kind, job_id, worker))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skew_app")
    parser.add_argument("mode", choices=["worker", "enqueue", "lease"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", default="p")
    parser.add_argument("--enqueue", type=int, default=0)
    parser.add_argument("--hold", type=float, default=6.0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--direct-url", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(levelname)s %(message)s")

    from ultimat3 import Ctx, Worker, create_driver, job, operator_context

    async def hold(input: Hold, ctx: Ctx) -> None:
        job_id = ctx.actor.id.rsplit(":", 1)[-1]  # a run's actor is "job:NAME:ID"
        await asyncio.to_thread(mark, args.url, "start", args.name, job_id)
        await asyncio.sleep(input.seconds)
        await asyncio.to_thread(mark, args.url, "end", args.name, job_id)

    handle = job(name="skew.hold", tenant="none", input=Hold)(hold)
    driver = create_driver(args.url, migrate=False, direct_url=args.direct_url)
    try:
        offset = getattr(driver, "clock_offset", lambda: None)()
        print(f"{args.name}: host clock minus server clock = {offset}", file=sys.stderr, flush=True)
        if args.mode == "lease":
            return _leases(driver, args.url, args.name, args.seconds)
        with operator_context("skew-test", "clock skew process test"):
            if args.mode == "enqueue":
                handle.enqueue(Hold(seconds=0.0), delay=args.delay or None, driver=driver)
                mark(args.url, "enqueued", args.name)
                return 0
            for _ in range(args.enqueue):
                handle.enqueue(Hold(seconds=args.hold), driver=driver)
        worker = Worker(driver, concurrency=8, visibility_timeout=4.0, heartbeat_interval=1.0,
                        poll_interval=args.poll, grace_period=1.0, worker_id=args.name, environment="test")
        mark(args.url, "ready", args.name)
        worker.run_forever()
        return 0
    finally:
        driver.close()


def _leases(driver: object, url: str, name: str, seconds: float) -> int:
    from ultimat3.drivers.protocol import JobDriver

    assert isinstance(driver, JobDriver)
    mark(url, "ready", name)
    deadline = time.monotonic() + seconds
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            lease = driver.leases.acquire("skew", name, 1, ttl=2.0)
            if lease is None:
                time.sleep(0.05)
                continue
            row = conn.execute("INSERT INTO skew_marks (kind, worker) VALUES ('lease', %s) RETURNING id",
                               (name,)).fetchone()
            assert row is not None
            time.sleep(0.5)  # well inside the 2 s the lease lives
            conn.execute("UPDATE skew_marks SET until = clock_timestamp() WHERE id = %s", (row[0],))
            driver.leases.release(lease)
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
