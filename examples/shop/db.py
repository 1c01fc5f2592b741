"""The shop's engine: the same database the jobs use (``X_DATABASE_URL``, default ``sqlite:///x.db``)."""

from __future__ import annotations

import functools
import random

from sqlalchemy import Engine, create_engine, insert

from shop.tables import customers, metadata
from ultimat3.jobs import database_url


@functools.cache
def engine() -> Engine:
    """One engine per process for the app's tables."""
    url = database_url()
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return create_engine(url)


def seed(rows: int = 20_000, *, seed_value: int = 7) -> None:
    """Create the shop's tables and fill ``shop_customers`` with messy emails across three orgs."""
    rng = random.Random(seed_value)
    metadata.drop_all(engine())
    metadata.create_all(engine())
    orgs = ("acme", "globex", "initech")
    data = []
    for n in range(1, rows + 1):
        email = f"customer{n}@example.com"
        if rng.random() < 0.6:  # most rows need the cleanup the backfill does
            email = f"  {email.upper()} " if rng.random() < 0.5 else email.title()
        data.append({"id": n, "org_id": orgs[n % 3], "email": email, "loyal": False,
                     "orders": rng.randint(0, 10)})
    with engine().begin() as conn:
        for start in range(0, len(data), 5000):
            conn.execute(insert(customers), data[start:start + 5000])
