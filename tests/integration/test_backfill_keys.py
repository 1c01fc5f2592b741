"""Backfills keyed by UUID and datetime primary keys on SQLite and PostgreSQL: pages follow the
key's order, and a pass resumed from its recorded cursor (after a failed batch) skips no row and
repeats only the batch that failed -- the cursor round-trips its type through the checkpoint."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.postgres import postgres_database

from ultimat3.backfill import Batch, backfill, dispose_engines, engine_for_url
from ultimat3.backfill.cursor import decode_cursor, encode_cursor
from ultimat3.backfill.definition import BackfillError
from ultimat3.drivers import create_driver
from ultimat3.jobs import JobDriver, RetryPolicy, Worker, isolated_registry

ROWS = 23
START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobDriver]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'x.db'}"
        context: Any = None
    else:
        context = postgres_database("x_bfkeys")
        url = context.__enter__()
    with isolated_registry():
        built = create_driver(url)
        try:
            yield built
        finally:
            built.close()
            dispose_engines()
            if context is not None:
                context.__exit__(None, None, None)


def keys_of(kind: str) -> list[Any]:
    if kind == "uuid":
        return sorted((uuid.uuid4() for _ in range(ROWS)), key=lambda u: u.bytes)
    # Microseconds and a minute apart: an ISO string cursor would compare wrongly on SQLite.
    return [START + timedelta(minutes=i, microseconds=i * 7) for i in range(ROWS)]


@pytest.mark.parametrize("kind", ["uuid", "datetime"])
def test_a_resumed_pass_pages_by_uuid_and_datetime_keys_exactly(driver: JobDriver, kind: str) -> None:
    metadata = sa.MetaData()
    column_type: Any = sa.Uuid() if kind == "uuid" else sa.DateTime(timezone=True)
    table = sa.Table(f"bf_{kind}", metadata, sa.Column("k", column_type, primary_key=True),
                     sa.Column("done", sa.Boolean, nullable=False))
    engine = engine_for_url(driver.url)
    metadata.create_all(engine)
    keys = keys_of(kind)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"k": key, "done": False} for key in keys])
    seen: Counter[Any] = Counter()
    failed = {"at": 2}

    def handle(batch: Batch) -> None:
        page = [row.k for row in batch.rows]
        seen.update(page)
        if batch.index == failed["at"]:
            failed["at"] = -1
            raise RuntimeError("batch 2 fails once")

    handle_ = backfill(name=f"keys.{kind}", tenant="none", source=lambda ctx: sa.select(table), handle=handle,
                       engine="job-store", batch=5, rate=1000, retry=RetryPolicy(max_attempts=3, base=0, jitter=0))
    queued = handle_.enqueue(driver=driver)
    worker = Worker(driver, environment="test", concurrency=1)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()
    row = driver.introspect.get(queued.id)
    assert row is not None and row.state == "done", row and row.last_error
    normalized = Counter({(k.astimezone(UTC) if isinstance(k, datetime) and k.tzinfo else
                           k.replace(tzinfo=UTC) if isinstance(k, datetime) else k): n for k, n in seen.items()})
    assert set(normalized) == set(keys), "every row was handled"
    assert sorted(k for k, n in normalized.items() if n == 2) == keys[10:15], "only the failed batch twice"
    steps = driver.steps.load(queued.run_id)
    assert steps["batch:0"].result["cursor_type"] == kind


@pytest.mark.parametrize("value", [7, "a", uuid.uuid4(), START, START.date(), __import__("decimal").Decimal("1.50")])
def test_cursors_round_trip_their_type(value: Any) -> None:
    encoded = encode_cursor(value, backfill="b")
    assert decode_cursor(encoded) == value and type(decode_cursor(encoded)) is type(value)


@pytest.mark.parametrize("value", [b"raw", 1.5, True, (1, 2)])
def test_a_key_of_another_type_is_refused_naming_the_backfill(value: Any) -> None:
    with pytest.raises(BackfillError) as refused:
        encode_cursor(value, backfill="shop.fill")
    assert refused.value.code == "X_BACKFILL_KEY_TYPE" and '"shop.fill"' in refused.value.message
