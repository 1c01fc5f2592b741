"""Tenancy: the guard that filters every SQLAlchemy select over a tenanted table to the acting org."""

from ultimat3.tenancy.guard import (
    NO_CROSS_TENANT_REASON,
    TENANT_COLUMN_KEY,
    TenancyError,
    cross_tenant,
    scoped,
    tenant_column,
    tenanted,
)

__all__ = [
    "NO_CROSS_TENANT_REASON",
    "TENANT_COLUMN_KEY",
    "TenancyError",
    "cross_tenant",
    "scoped",
    "tenant_column",
    "tenanted",
]
