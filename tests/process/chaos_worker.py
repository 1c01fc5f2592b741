"""A worker process for the process tests: ``python -m tests.process.chaos_worker --url URL --app-db URL ...``.

Runs :class:`~ultimat3.jobs.Worker` over the jobs of :mod:`tests.process.chaos_app` until SIGTERM
(graceful) or SIGKILL (the point of the tests). Every worker event is appended as one JSON line to
``--events`` so the test can see what this process did (e.g. that its ack was ``fenced``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

_stop_requested = False
_worker: Any = None


def _early_sigterm(signum: int, frame: object) -> None:
    # A SIGTERM that lands while the process is still importing or building its worker is a stop
    # request too (the tests stop freshly started replacements): remember it instead of dying.
    global _stop_requested
    _stop_requested = True
    if _worker is not None:
        _worker.stop()


def main(argv: list[str] | None = None) -> int:
    global _worker
    signal.signal(signal.SIGTERM, _early_sigterm)
    from tests.process import chaos_app
    from ultimat3.drivers import create_driver
    from ultimat3.jobs import Worker, WorkerEvent

    parser = argparse.ArgumentParser(prog="chaos_worker")
    parser.add_argument("--url", required=True)
    parser.add_argument("--app-db", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--names", default="", help="comma-separated job names (default: every declared job)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--visibility", type=float, default=3.0)
    parser.add_argument("--heartbeat", type=float, default=0.3)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("--liveness", type=float, default=1.0, help="probe interval; 0 turns the registry off")
    parser.add_argument("--ticks", type=int, default=0, help="1: also declare chaos.tick (a 1 s schedule)")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {args.worker_id} %(levelname)s %(name)s %(message)s")
    chaos_app.configure(args.app_db, args.worker_id)
    chaos_app.declare(ticks=bool(args.ticks))
    # The tests and the workers share one file: migrations are idempotent, the tables exist already.
    driver = create_driver(args.url, migrate=False)
    lock = threading.Lock()
    events = open(args.events, "a", encoding="utf-8")  # noqa: SIM115 - closed in finally

    def on_event(event: WorkerEvent) -> None:
        line = json.dumps({"kind": event.kind, "job_id": event.job_id, "attempt": event.attempt,
                           "count": event.count, "worker": args.worker_id, "at": time.time(),
                           "error": event.error})
        with lock:
            events.write(line + "\n")
            events.flush()

    worker = Worker(
        driver,
        names=[name for name in args.names.split(",") if name] or None,
        concurrency=args.concurrency,
        visibility_timeout=args.visibility,
        heartbeat_interval=args.heartbeat,
        poll_interval=args.poll,
        grace_period=args.grace,
        worker_id=args.worker_id,
        environment="test",
        on_event=on_event,
        liveness_interval=args.liveness or None,
    )
    _worker = worker
    if _stop_requested:
        worker.stop()
    with lock:
        events.write(json.dumps({"kind": "started", "worker": args.worker_id, "pid": os.getpid(),
                                 "at": time.time()}) + "\n")
        events.flush()
    try:
        worker.run_forever()
    finally:
        driver.close()
        with lock:
            events.write(json.dumps({"kind": "stopped", "worker": args.worker_id, "at": time.time()}) + "\n")
            events.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
