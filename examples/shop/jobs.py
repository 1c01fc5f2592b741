"""The shop's jobs and backfills. Point the CLI at it with ``x --app shop.jobs ...``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select, update

from shop.db import engine
from shop.tables import customers
from ultimat3.backfill import Batch, backfill
from ultimat3.core import Ctx
from ultimat3.jobs import AsyncStep, RetryPolicy, SyncStep, job


class Welcome(BaseModel):
    """Input of ``shop.send_welcome``."""

    org_id: str
    customer_id: int
    email: str


@job(name="shop.send_welcome", tenant=lambda i: i.org_id, input=Welcome, queue="emails",
     idempotency_key=lambda i: f"welcome:{i.customer_id}", retry=RetryPolicy(max_attempts=8), timeout="30s")
async def send_welcome(input: Welcome, ctx: Ctx, step: AsyncStep) -> dict[str, Any]:
    """Send a welcome email, then a follow-up two days later (the run sleeps without a worker)."""
    first = await step.run("welcome", lambda: {"sent_to": input.email, "template": "welcome"})
    await step.sleep("wait-2-days", "2d")
    second = await step.run("follow-up", lambda: {"sent_to": input.email, "template": "tips"})
    return {"welcome": first, "follow_up": second}


class Recount(BaseModel):
    """Input of ``shop.recount_orders``."""

    org_id: str


@job(name="shop.recount_orders", tenant=lambda i: i.org_id, input=Recount)
def recount_orders(input: Recount, ctx: Ctx, step: SyncStep) -> int:
    """A plain (sync) job: runs in the worker's thread pool."""
    return step.run("recount", lambda: 0)


def _customers(ctx: Ctx) -> Any:
    return select(customers.c.id, customers.c.email)


def _lower_emails(batch: Batch) -> None:
    with engine().begin() as conn:
        for row in batch.rows:
            clean = row.email.strip().lower()
            if clean != row.email:
                conn.execute(update(customers).where(customers.c.id == row.id).values(email=clean))


def _messy_count(ctx: Ctx) -> int:
    predicate = (customers.c.email != func.lower(func.trim(customers.c.email)))
    with engine().connect() as conn:
        return int(conn.execute(select(func.count()).select_from(customers).where(predicate)).scalar_one())


#: Every org's customers: a cross-tenant sweep, so it declares tenant='none' and gets the
#: cross-tenant capability for its own pass only.
normalize_emails = backfill(
    name="shop.normalize_emails",
    tenant="none",
    source=lambda ctx: select(customers.c.id, customers.c.email).where(
        customers.c.email != func.lower(func.trim(customers.c.email))
    ),
    handle=_lower_emails,
    count=_messy_count,
    engine=engine,  # the app's database, named: a backfill never guesses where its tables live
    batch=500,
    rate=10,
)


def _mark_loyal(batch: Batch) -> None:
    ids = [row.id for row in batch.rows]
    with engine().begin() as conn:
        conn.execute(update(customers).where(customers.c.id.in_(ids)).values(loyal=True))


#: One org's customers: the pass's pages are scoped to org "acme" exactly as a request's would be.
acme_loyalty = backfill(
    name="shop.acme_loyalty",
    tenant=lambda _input: "acme",
    source=lambda ctx: select(customers.c.id).where(customers.c.orders >= 5),
    handle=_mark_loyal,
    engine=engine,
    batch=1000,
    rate=20,
)
