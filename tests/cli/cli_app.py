"""The app the CLI tests point ``--app`` at: jobs, a tenanted table and the backfills over it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select, update

from ultimat3.backfill import Batch, backfill, engine_for_url
from ultimat3.core import Ctx
from ultimat3.drivers import database_url
from ultimat3.jobs import RetryPolicy, SyncStep, job, limit, rate_limit
from ultimat3.jobs.schedule import cron, every
from ultimat3.tenancy import tenanted

metadata = MetaData()
widgets = tenanted(
    Table(
        "cli_widgets",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("org_id", String(20), nullable=False),
        Column("label", String(50), nullable=False),
    )
)


def engine() -> Any:
    """The app engine: the database the CLI was pointed at."""
    return engine_for_url(database_url())


class Ping(BaseModel):
    """Input of ``cli.ping``."""

    org_id: str
    n: int


@job(name="cli.ping", tenant=lambda i: i.org_id, input=Ping, retry=RetryPolicy(max_attempts=2))
def ping(input: Ping, ctx: Ctx, step: SyncStep) -> int:
    """Echo ``n`` after recording it as a step."""
    return step.run("echo", lambda: input.n)


@job(name="cli.sync", tenant=lambda i: i.org_id, input=Ping, concurrency=limit(max=1, key=lambda i: i.org_id))
def sync(input: Ping, ctx: Ctx) -> int:
    return input.n


@job(name="cli.mail", tenant=lambda i: i.org_id, input=Ping, rate=rate_limit("1/h"))
def mail(input: Ping, ctx: Ctx) -> int:
    return input.n


class Digest(BaseModel):
    """Input of ``cli.digest``: which digest to build."""

    kind: str = "daily"


@job(name="cli.digest", tenant="none", input=Digest, schedule=[
    cron("0 3 * * *", tz="Europe/Berlin", name="nightly"),
    every("1h", name="hourly", input={"kind": "hourly"}),
])
def digest(input: Digest, ctx: Ctx) -> str:
    """A periodic job with two schedules."""
    return input.kind


def _upper(batch: Batch) -> None:
    with engine().begin() as conn:
        ids = [row.id for row in batch.rows]
        conn.execute(update(widgets).where(widgets.c.id.in_(ids)).values(label=func.upper(widgets.c.label)))


def _lower_count(ctx: Ctx) -> int:
    with engine().connect() as conn:
        stmt = select(func.count()).select_from(widgets).where(widgets.c.label != func.upper(widgets.c.label))
        return int(conn.execute(stmt).scalar_one())


shout = backfill(engine="job-store",
    name="cli.shout",
    tenant="none",
    source=lambda ctx: select(widgets.c.id).where(widgets.c.label != func.upper(widgets.c.label)),
    handle=_upper,
    count=_lower_count,
    batch=100,
    rate=1000,
)

staging_only = backfill(engine="job-store",
    name="cli.staging_only",
    tenant="none",
    source=lambda ctx: select(widgets.c.id),
    handle=lambda batch: None,
    environments=["staging"],
    rate=1000,
)

needs_migration = backfill(engine="job-store",
    name="cli.needs_migration",
    tenant="none",
    source=lambda ctx: select(widgets.c.id),
    handle=lambda batch: None,
    requires="20261201_widgets_labels",
    rate=1000,
)


def _boom(batch: Batch) -> None:
    raise RuntimeError("the widget service said no\n  (and a second line the one-line error must not show)")


boom = backfill(
    engine="job-store",
    name="cli.boom",
    tenant="none",
    source=lambda ctx: select(widgets.c.id),
    handle=_boom,
    retry=RetryPolicy(max_attempts=1),
    environments=["test"],
    rate=1000,
)


#: Ids ``cli.careful`` quarantines instead of handling (the tests "fix the data" by emptying it).
refused: set[int] = set()


def _careful(batch: Batch) -> None:
    assert batch.connection is not None
    good = []
    for row in batch.rows:
        if row.id in refused:
            batch.fail(row, f"widget {row.id} is refused")
        else:
            good.append(row.id)
    batch.connection.execute(update(widgets).where(widgets.c.id.in_(good)).values(label=func.upper(widgets.c.label)))


careful = backfill(
    engine="job-store",
    name="cli.careful",
    tenant="none",
    source=lambda ctx: select(widgets.c.id).where(widgets.c.label != func.upper(widgets.c.label)),
    handle=_careful,
    batch=100,
    rate=1000,
    transactional=True,
)


def seed(rows: int = 1_000) -> None:
    """(Re)create ``cli_widgets`` with ``rows`` lower-case labels across two orgs; ``cli.careful``
    refuses every 97th widget again."""
    refused.clear()
    refused.update(range(97, rows + 1, 97))
    metadata.drop_all(engine())
    metadata.create_all(engine())
    with engine().begin() as conn:
        rows_data = [{"id": n, "org_id": f"org{n % 2}", "label": f"w{n}"} for n in range(1, rows + 1)]
        conn.execute(widgets.insert(), rows_data)
