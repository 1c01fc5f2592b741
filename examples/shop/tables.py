"""The shop's own tables (SQLAlchemy Core). ``customers`` is tenanted: every select the library
builds against it is filtered to the acting org."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table

from ultimat3.tenancy import tenanted

metadata = MetaData()

customers = tenanted(
    Table(
        "shop_customers",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("org_id", String(40), nullable=False, index=True),
        Column("email", String(200), nullable=False),
        Column("loyal", Boolean, nullable=False, default=False),
        Column("orders", Integer, nullable=False, default=0),
    ),
    column="org_id",
)
