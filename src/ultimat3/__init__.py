"""ultimat3: durable background jobs and paced, ledgered backfills for Python.

The public face: everything the README's examples use is importable from here. The layers below
(``ultimat3.core``, ``ultimat3.drivers``, ``ultimat3.jobs``, ``ultimat3.backfill``,
``ultimat3.tenancy``, ``ultimat3.testing``) hold the rest.
"""

from ultimat3.backfill import JOB_STORE, BackfillError, BackfillInput, BackfillReport, Batch, backfill, run_backfill
from ultimat3.core import Actor, ConfigError, Ctx, Interrupted, ManualClock, XError, current_ctx, use_ctx
from ultimat3.drivers import create_driver, database_url
from ultimat3.drivers.errors import DriverError, JobDuplicateError
from ultimat3.drivers.limits import configure_limits
from ultimat3.jobs import (
    AsyncStep,
    JobAbortedError,
    JobHandle,
    JobInputError,
    RetryPolicy,
    SyncStep,
    Worker,
    WorkerEvent,
    job,
)
from ultimat3.tenancy import TenancyError, cross_tenant, operator_context, scoped, tenanted

__version__ = "0.1.0"

__all__ = [
    "JOB_STORE",
    "Actor",
    "AsyncStep",
    "BackfillError",
    "BackfillInput",
    "BackfillReport",
    "Batch",
    "ConfigError",
    "Ctx",
    "DriverError",
    "Interrupted",
    "JobAbortedError",
    "JobDuplicateError",
    "JobHandle",
    "JobInputError",
    "ManualClock",
    "RetryPolicy",
    "SyncStep",
    "TenancyError",
    "Worker",
    "WorkerEvent",
    "XError",
    "__version__",
    "backfill",
    "configure_limits",
    "create_driver",
    "cross_tenant",
    "current_ctx",
    "database_url",
    "job",
    "operator_context",
    "run_backfill",
    "scoped",
    "tenanted",
    "use_ctx",
]
