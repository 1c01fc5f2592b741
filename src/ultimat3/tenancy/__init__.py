"""Tenancy: the guard that scopes every statement over a tenanted table to the acting org, the
grants that let a scope step past it, and the rule for who may enqueue work for which org."""

from ultimat3.tenancy.enqueue import check_enqueue, check_stored_tenant
from ultimat3.tenancy.grants import granted, operator_context
from ultimat3.tenancy.guard import (
    NO_CROSS_TENANT_REASON,
    TenancyError,
    TenancyUnprovenError,
    cross_tenant,
    scoped,
)
from ultimat3.tenancy.tables import TENANT_COLUMN_KEY, tenant_column, tenanted
from ultimat3.tenancy.where import and_where

__all__ = [
    "NO_CROSS_TENANT_REASON",
    "TENANT_COLUMN_KEY",
    "TenancyError",
    "TenancyUnprovenError",
    "and_where",
    "check_enqueue",
    "check_stored_tenant",
    "cross_tenant",
    "granted",
    "operator_context",
    "scoped",
    "tenant_column",
    "tenanted",
]
