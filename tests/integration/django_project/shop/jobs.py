"""The app's jobs and backfill, discovered by ultimat3.contrib.django at start-up."""

from pydantic import BaseModel

from shop.models import Order
from ultimat3 import Batch, Ctx, backfill, job
from ultimat3.contrib.django import table


class OrderRef(BaseModel):
    org: str
    order_id: int


@job(name="shop.ship", input=OrderRef, tenant=lambda ref: ref.org)
def ship(order: OrderRef, ctx: Ctx) -> dict[str, int]:
    Order.objects.filter(pk=order.order_id).update(shipped=True)
    return {"shipped": order.order_id}


orders = table(Order)  # what the pass pages through, as SQLAlchemy sees Django's table


def fill(batch: Batch) -> None:
    for row in batch.rows:  # idempotent: a replayed batch writes the same codes
        Order.objects.filter(pk=row.id).update(code=f"C-{row.id}")


fill_codes = backfill(
    name="shop.fill_codes",
    tenant="none",
    source=lambda ctx: orders.select().where(orders.c.code.is_(None)),
    handle=fill,
    engine="job-store",
    batch=2,
    rate=1000,
)
