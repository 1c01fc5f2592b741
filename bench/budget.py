"""A job's CPU budget: what the Python primitives every attempt needs cost on this machine, against
what the worker and the driver spend per job. The bound of the client-CPU targets of issue 13.

    bench/.venv/bin/python bench/budget.py [--url postgresql://.../bench_budget] [--jobs 20000]

Prints three tables (µs of this process's CPU per job, best of ``--tries``):

* the primitives, each timed alone in a loop: a task per attempt on a running event loop (created,
  run, its result taken by a done callback: the least a worker that can cancel each attempt pays),
  the same with the attempt's own context, a thread hop (``run_in_executor``) shared by a batch,
  the input model's validation, and a ``JobRecord`` built from a claimed row (the payload's JSON,
  which it includes, shown apart);
* a drain of ``--jobs`` no-op jobs on SQLite (a scratch file) and, with ``--url``, on PostgreSQL:
  the driver's calls alone (``ack_and_claim`` of 100 acks plus the next 100, no worker), and the
  whole worker at concurrency 100 (``freeze_gc`` as ``x worker`` runs it). The worker's own share
  is the difference;
* with ``--url``, a claimed row fetched from PostgreSQL and built into a ``ClaimedJob`` (100 per
  statement): by position, as claims read rows, and by name, as they did before.

Writes nothing but the scratch file it removes (and, with ``--url``, empties that database's
``public`` schema first: point it at a database of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import chunks, markdown_table
from pydantic import BaseModel

from ultimat3.drivers.protocol import Ack, ClaimRequest
from ultimat3.drivers.sqlite.rows import DECODE
from ultimat3.jobs import Worker, WorkerEvent, create_driver, job
from ultimat3.tenancy import operator_context


class In(BaseModel):
    """The bench's input model (bench/sys_ultimat3.py's)."""

    i: int = 0
    t: float = 0.0


@job(name="budget.noop", tenant="none", input=In)
async def noop(input: In, ctx: Any, step: Any) -> None:
    """The no-op job of the drains."""
    return None


def best_of(tries: int, n: int, run: Callable[[], None]) -> float:
    """µs of process CPU per item: ``run`` does ``n`` items; the best of ``tries`` runs."""
    fastest = float("inf")
    for _ in range(tries):
        began = time.process_time()
        run()
        fastest = min(fastest, time.process_time() - began)
    return fastest * 1e6 / n


def repeat(n: int, fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` called ``n`` times."""

    def run() -> None:
        for _ in range(n):
            fn()

    return run


def tasks(n: int, batch: int, own_context: bool) -> Callable[[], None]:
    """``n`` no-op tasks on a running loop, ``batch`` alive at once, each result taken by a callback."""

    async def attempt() -> None:
        return None

    def run() -> None:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            for _ in range(0, n, batch):
                done = loop.create_future()
                left = [batch]

                def finished(task: asyncio.Task[None], left: list[int] = left,
                             done: asyncio.Future[None] = done) -> None:
                    task.result()
                    left[0] -= 1
                    if left[0] == 0:
                        done.set_result(None)

                for _ in range(batch):
                    context = contextvars.copy_context() if own_context else None
                    loop.create_task(attempt(), context=context).add_done_callback(finished)
                await done

        asyncio.run(main())

    return run


def thread_hops(n: int, batch: int) -> Callable[[], None]:
    """One ``run_in_executor`` round trip per ``batch`` items (a driver call shared by a batch)."""

    def run() -> None:
        pool = ThreadPoolExecutor(1)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for _ in range(0, n, batch):
                await loop.run_in_executor(pool, int)

        asyncio.run(main())
        pool.shutdown()

    return run


def claimed_row() -> dict[str, Any]:
    """A claimed row as the SQLite driver reads it (every column of x_jobs)."""
    now = time.time()
    return {"id": "0190a0c4-5b6e-7000-8000-000000000001", "run_id": "0190a0c4-5b6e-7000-8000-000000000002",
            "name": "budget.noop", "queue": "default", "payload": '{"i":1,"t":0.0}', "state": "running",
            "priority": 0, "attempt": 1, "max_attempts": 5, "run_at": now, "visible_at": now + 30,
            "claimed_by": "w", "claim_token": "w:1:abc", "idempotency_key": None, "tenant_id": None,
            "traceparent": None, "enqueued_by": "bench", "last_error": None, "result": None, "created_at": now,
            "updated_at": now, "finished_at": None, "flow_key": None, "flow_max": None, "rate_key": None,
            "rate_per_second": None, "rate_burst": None, "started_at": now}


def primitives(n: int, tries: int) -> list[list[str]]:
    """The first table's rows."""
    from ultimat3.drivers.records import job_record

    row = claimed_row()
    payload = row["payload"]
    data = {"i": 1, "t": 0.0}
    # (label, µs, counted in the sum). The worker's side: a task in its own context (as attempts
    # run), a hop, the validation; the driver's side: the record. The plain task and the JSON are
    # inside those, so they are shown but not added.
    cases: list[tuple[str, float, bool]] = [
        ("a task per attempt (created, run, result taken by a callback), 100 alive at once",
         best_of(tries, n, tasks(n, 100, own_context=False)), False),
        ("the same, each task in its own copied context", best_of(tries, n, tasks(n, 100, own_context=True)), True),
        ("one thread hop (run_in_executor) per 100 jobs, per job", best_of(tries, n, thread_hops(n, 100)), True),
        ("the input model's validation (In.model_validate)",
         best_of(tries, n, repeat(n, lambda: In.model_validate(data))), True),
        ("a JobRecord from a claimed row (28 columns, SQLite's decoders, the payload's JSON included)",
         best_of(tries, n, repeat(n, lambda: job_record(row, DECODE))), True),
        ("of which the payload's JSON (json.loads)",
         best_of(tries, n, repeat(n, lambda: json.loads(payload))), False),
    ]
    rows = [[label, f"{cost:.1f}"] for label, cost, _ in cases]
    rows.append(["sum (a task in its own context, the hop, the validation, the record)",
                 f"{sum(cost for _, cost, counted in cases if counted):.1f}"])
    return rows


def fill(driver: Any, n: int) -> None:
    """``n`` no-op jobs, enqueued 1,000 per call."""
    for part in chunks(n, 1000):
        noop.enqueue_many([{"i": i} for i in part], driver=driver)


def driver_alone(url: str, n: int) -> float:
    """µs of CPU per job for ``ack_and_claim`` of 100 + 100 with no worker."""
    driver = create_driver(url)
    fill(driver, n)
    request = ClaimRequest(worker_id="budget", limit=100, names=(noop.name,))
    began = time.process_time()
    batch = driver.claim(request)
    done = 0
    while batch:
        done += len(batch)
        _, batch = driver.ack_and_claim([Ack(c.job.id, c.claim_token, None) for c in batch], request)
    spent = time.process_time() - began
    driver.close()
    assert done == n, done
    return spent * 1e6 / n


def run_worker(driver: Any, n: int) -> None:
    """Run a Worker at concurrency 100 (``freeze_gc`` as ``x worker`` runs it) until ``n`` jobs are done."""
    seen = {"done": 0}

    def on_event(event: WorkerEvent) -> None:
        if event.kind == "done":
            seen["done"] += 1
            if seen["done"] >= n:
                worker.stop()

    worker = Worker(driver, names=[noop.name], concurrency=100, poll_interval=1.0, on_event=on_event,
                    freeze_gc=True, liveness_interval=None, schedules=False, horizon_warning=None)
    asyncio.run(worker.run())


def whole_worker(url: str, n: int) -> float:
    """µs of CPU per job for a Worker at concurrency 100 draining ``n`` jobs."""
    driver = create_driver(url)
    fill(driver, n)
    began = time.process_time()
    run_worker(driver, n)
    spent = time.process_time() - began
    driver.close()
    return spent * 1e6 / n


def postgres_rows(url: str, n: int, tries: int) -> list[list[str]]:
    """The third table: µs per claimed row to fetch and build, 100 rows per statement, the claim's
    columns read (no update): through the claim's row factory, and through psycopg's ``dict_row``
    and a record built by column name (how claims were read before: see CHANGELOG, #13)."""
    import psycopg
    from psycopg.rows import dict_row

    from ultimat3.drivers.postgres.rows import _Q, _job, claimed_rows
    from ultimat3.drivers.protocol import ClaimedJob

    reset_postgres(url)
    driver = create_driver(url)
    fill(driver, 100)
    driver.close()
    columns = _Q["claim_queue"].split("RETURNING", 1)[1].replace("(SELECT priority FROM head)", "1").replace(
        "(SELECT run_at FROM head)", "now()").replace("(SELECT id FROM head)", "'x'")
    select = f"SELECT {columns} FROM x_jobs AS j LIMIT 100"
    whole = "SELECT j.*, 1 AS head_priority, now() AS head_run_at, 'x' AS head_id FROM x_jobs AS j LIMIT 100"
    statements = max(1, n // 100)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")

        def by_position() -> None:
            for _ in range(statements):
                conn.cursor(row_factory=claimed_rows).execute(select).fetchall()

        def by_name() -> None:
            for _ in range(statements):
                fetched = conn.cursor(row_factory=dict_row).execute(whole).fetchall()
                [ClaimedJob(job=_job(row), claim_token=row["claim_token"]) for row in fetched]

        rows = statements * 100
        return [["by position (the claim's row factory)", f"{best_of(tries, rows, by_position):.1f}"],
                ["by name (dict_row, then a record by column name)", f"{best_of(tries, rows, by_name):.1f}"]]


def reset_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


def drains(urls: dict[str, Callable[[], str]], n: int) -> list[list[str]]:
    """The second table's rows: per driver, the driver alone, the whole worker, the difference."""
    rows = []
    for name, fresh in urls.items():
        alone = driver_alone(fresh(), n)
        whole = whole_worker(fresh(), n)
        rows.append([name, f"{alone:.1f}", f"{whole:.1f}", f"{whole - alone:.1f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--url", default=None, help="a PostgreSQL database of its own (its public schema is emptied)")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--tries", type=int, default=5)
    args = parser.parse_args()
    print(markdown_table(["primitive", "µs per job"], primitives(args.jobs, args.tries)))
    print()
    with tempfile.TemporaryDirectory() as scratch, operator_context("bench", "the budget enqueues its own jobs"):
        runs = {"count": 0}

        def sqlite_url() -> str:
            runs["count"] += 1
            return f"sqlite:///{scratch}/budget{runs['count']}.db"

        urls: dict[str, Callable[[], str]] = {"SQLite": sqlite_url}
        if args.url:
            def postgres_url() -> str:
                reset_postgres(args.url)
                return str(args.url)

            urls["PostgreSQL"] = postgres_url
        print(markdown_table(["drain of no-op jobs", "driver's calls alone: µs per job",
                              "whole worker, c=100: µs per job", "the worker's own: µs per job"],
                             drains(urls, args.jobs)))
        if args.url:
            print()
            print(markdown_table(["a claimed row from PostgreSQL, fetched and built", "µs per row"],
                                 postgres_rows(args.url, args.jobs, args.tries)))
    print()
    print("CPU of this process only (PostgreSQL's server CPU is not in these numbers).")


if __name__ == "__main__":
    main()
