"""POST /orders writes the order and enqueues ``orders.confirm`` in one ``AsyncSession`` transaction:
the confirmation job exists if and only if the order does.

    pip install 'ultimat3[aiosqlite]' fastapi uvicorn   # or 'ultimat3[asyncpg]' for PostgreSQL
    X_DATABASE_URL=sqlite:///orders.db uvicorn examples.fastapi_orders.app:app
    x --app examples.fastapi_orders.app worker                    # sends the confirmations
    ORDERS_IN_PROCESS_WORKER=1 uvicorn ...                        # or: a worker inside the app

``ORDERS_DATABASE_URL`` is the app's async SQLAlchemy URL (default: the job store's file through
``sqlite+aiosqlite``); it must point at the job store's database for the enqueue to join the order's
transaction.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from ultimat3 import Actor, Ctx, current_ctx, database_url, job, use_ctx
from ultimat3.contrib.asgi import run_worker
from ultimat3.drivers import create_driver

metadata = MetaData()
orders = Table(
    "shop_orders", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("org_id", String(40), nullable=False),
    Column("email", String(200), nullable=False),
    Column("total_cents", Integer, nullable=False),
)


class Confirm(BaseModel):
    """Input of ``orders.confirm``."""

    org_id: str
    order_id: int
    email: str


@job(name="orders.confirm", tenant=lambda i: i.org_id, input=Confirm)
async def confirm(input: Confirm, ctx: Ctx) -> str:
    """Send the confirmation e-mail (here: say so)."""
    return f"confirmation of order {input.order_id} sent to {input.email}"


class NewOrder(BaseModel):
    """The request body of ``POST /orders``."""

    email: str
    total_cents: int
    #: For the example's test: fail after the enqueue, before the commit.
    fail_after_enqueue: bool = False


def orders_url() -> str:
    """The app's async URL: ``ORDERS_DATABASE_URL``, else the job store's SQLite file via aiosqlite."""
    explicit = os.environ.get("ORDERS_DATABASE_URL")
    if explicit:
        return explicit
    url = database_url()
    if not url.startswith("sqlite:///"):
        raise RuntimeError("set ORDERS_DATABASE_URL (postgresql+asyncpg://... on the job store's database)")
    return "sqlite+aiosqlite:///" + url[len("sqlite:///"):]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """One engine and one job driver for the app's lifetime."""
    engine = create_async_engine(orders_url())
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    driver = create_driver(database_url())
    app.state.engine, app.state.driver = engine, driver
    try:
        if os.environ.get("ORDERS_IN_PROCESS_WORKER") == "1":
            # Small deployments: the confirmations are sent by a worker in this very process.
            async with run_worker(driver, concurrency=4, grace_period=10):
                yield
        else:
            yield
    finally:
        await driver.aclose()
        driver.close()
        await engine.dispose()


app = FastAPI(lifespan=lifespan)


async def session() -> AsyncIterator[AsyncSession]:
    """One session (and transaction) per request."""
    engine: AsyncEngine = app.state.engine
    async with AsyncSession(engine) as s:
        yield s


def acting_for(org: Annotated[str, Header(alias="X-Org")]) -> Ctx:
    """The request's context: a user of one org (normally from your auth)."""
    return Ctx(actor=Actor(id=f"web:{org}", org_id=org), environment=current_ctx().environment)


@app.post("/orders", status_code=201)
async def create_order(body: NewOrder, s: Annotated[AsyncSession, Depends(session)],
                       ctx: Annotated[Ctx, Depends(acting_for)]) -> dict[str, object]:
    """Write the order and enqueue its confirmation; both commit together, or neither does."""
    with use_ctx(ctx):
        result = await s.execute(insert(orders).values(org_id=ctx.actor.org_id, email=body.email,
                                                       total_cents=body.total_cents).returning(orders.c.id))
        order_id = result.scalar_one()
        queued = await confirm.aenqueue({"org_id": ctx.actor.org_id, "order_id": order_id, "email": body.email},
                                        connection=s, driver=app.state.driver)
        if body.fail_after_enqueue:
            raise HTTPException(status_code=500, detail="failed after the enqueue: nothing was committed")
        await s.commit()
    return {"order_id": order_id, "confirmation_job": queued.id}
