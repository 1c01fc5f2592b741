"""Core: coded errors, the injectable clock and the ambient context."""

from ultimat3.core.clock import Clock, ManualClock, SystemClock, system_clock, to_datetime, to_seconds
from ultimat3.core.context import (
    CROSS_TENANT_SCOPE,
    ENVIRONMENTS,
    OPERATOR_SCOPE,
    SYSTEM_ACTOR,
    SYSTEM_SCOPE,
    Actor,
    Ctx,
    Environment,
    Grant,
    current_ctx,
    default_environment,
    parse_environment,
    use_ctx,
)
from ultimat3.core.errors import ConfigError, Interrupted, XError, check, fail

__all__ = [
    "CROSS_TENANT_SCOPE",
    "ENVIRONMENTS",
    "OPERATOR_SCOPE",
    "SYSTEM_ACTOR",
    "SYSTEM_SCOPE",
    "Actor",
    "Clock",
    "ConfigError",
    "Ctx",
    "Environment",
    "Grant",
    "Interrupted",
    "ManualClock",
    "SystemClock",
    "XError",
    "check",
    "current_ctx",
    "default_environment",
    "fail",
    "parse_environment",
    "system_clock",
    "to_datetime",
    "to_seconds",
    "use_ctx",
]
