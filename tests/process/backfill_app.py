"""The app the killed-worker test runs in real worker processes.

A slow backfill over ``kill_items`` whose handler counts every handling of every row in
``handled`` (``n`` goes up by one each time), so the test can prove after a SIGKILL that every row
was handled and none more than twice. Configured by ``X_DATABASE_URL``.
"""

from __future__ import annotations

import json
import os
import time

import sqlalchemy as sa

from ultimat3.backfill import Batch, backfill, engine_for_url
from ultimat3.jobs import RetryPolicy, Worker, create_driver
from ultimat3.tenancy import operator_context

ROWS = 10_000
BATCH = 250
NAME = "kill.sweep"

metadata = sa.MetaData()
kill_items = sa.Table("kill_items", metadata, sa.Column("id", sa.Integer, primary_key=True, autoincrement=False))
handled = sa.Table(
    "handled", metadata,
    sa.Column("row_id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("n", sa.Integer, nullable=False),
)

UPSERT = sa.text(
    "INSERT INTO handled (row_id, n) VALUES (:id, 1) ON CONFLICT (row_id) DO UPDATE SET n = handled.n + 1"
)


def url() -> str:
    return os.environ["X_DATABASE_URL"]


def handle(batch: Batch) -> None:
    with engine_for_url(url()).begin() as conn:
        conn.execute(UPSERT, [{"id": row.id} for row in batch.rows])
    # After the write and before the checkpoint: a kill here leaves a handled, unrecorded batch.
    time.sleep(0.1)


sweep = backfill(engine="job-store",
    name=NAME,
    tenant="none",
    source=lambda ctx: sa.select(kill_items),
    handle=handle,
    batch=BATCH,
    rate=200,
    retry=RetryPolicy(max_attempts=5, base=0.1, jitter=0),
)


def prepare() -> None:
    """Create the app tables, fill them, enqueue the pass; print its ids as JSON."""
    driver = create_driver(url())
    engine = engine_for_url(url())
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(kill_items.insert(), [{"id": i} for i in range(1, ROWS + 1)])
    with operator_context("test:backfill-kill", "the test enqueues the cross-tenant pass it will kill"):
        queued = sweep.enqueue(driver=driver)
    print(json.dumps({"job_id": queued.id, "run_id": queued.run_id}))
    driver.close()


def work() -> None:
    """A worker that gives up a dead peer's claim after two seconds."""
    worker = Worker(create_driver(url()), concurrency=1, visibility_timeout=2, heartbeat_interval=0.5,
                    poll_interval=0.2, grace_period=5, environment="test")
    worker.run_forever()
