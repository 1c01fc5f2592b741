"""Durable background jobs: declarations, steps, the attempt runner and the worker (backfills, one
layer up, are in :mod:`ultimat3.backfill`; storage, one layer down, in :mod:`ultimat3.drivers`)."""

from ultimat3.drivers import create_driver, database_url
from ultimat3.drivers.protocol import (
    DEFAULT_QUEUE,
    FINAL_STATES,
    JOB_STATES,
    LIVE_STATES,
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    JobDriver,
    JobFilter,
    JobRecord,
    JobState,
    NackRequest,
    QueueStats,
)
from ultimat3.jobs.errors import (
    DriverError,
    JobAbortedError,
    JobDuplicateError,
    JobInputError,
    StepDuplicateError,
)
from ultimat3.jobs.flow import Limit, RateLimit, limit, rate_limit
from ultimat3.jobs.job import NO_TENANT, JobHandle, NoInput, get_job, isolated_registry, job, registered_jobs
from ultimat3.jobs.retry import DEFAULT_RETRY, RetryPolicy
from ultimat3.jobs.runtime import get_driver, set_driver, set_driver_factory
from ultimat3.jobs.signal import AbortSignal
from ultimat3.jobs.steps import AsyncStep, SyncStep
from ultimat3.jobs.worker import Worker, WorkerEvent

__all__ = [
    "DEFAULT_QUEUE",
    "DEFAULT_RETRY",
    "FINAL_STATES",
    "JOB_STATES",
    "LIVE_STATES",
    "NO_TENANT",
    "AbortSignal",
    "AsyncStep",
    "ClaimRequest",
    "ClaimedJob",
    "DriverError",
    "EnqueueRequest",
    "EnqueueResult",
    "JobAbortedError",
    "JobDriver",
    "JobDuplicateError",
    "JobFilter",
    "JobHandle",
    "JobInputError",
    "JobRecord",
    "JobState",
    "Limit",
    "NackRequest",
    "NoInput",
    "QueueStats",
    "RateLimit",
    "RetryPolicy",
    "StepDuplicateError",
    "SyncStep",
    "Worker",
    "WorkerEvent",
    "create_driver",
    "database_url",
    "get_driver",
    "get_job",
    "isolated_registry",
    "job",
    "limit",
    "rate_limit",
    "registered_jobs",
    "set_driver",
    "set_driver_factory",
]
