"""Enqueue from Django code: inside the request's transaction, or once it has committed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from pydantic import BaseModel

from ultimat3.contrib.django.settings import DjangoSetupError, load_settings
from ultimat3.contrib.django.store import get_driver, job_store_alias
from ultimat3.drivers.protocol import EnqueueResult
from ultimat3.jobs.job import JobHandle

__all__ = ["enqueue", "enqueue_many", "enqueue_on_commit"]

InT = TypeVar("InT", bound=BaseModel)


def _raw_connection(using: str | None) -> Any:
    """The DB-API connection under Django's connection ``using``, which must be the job store's."""
    from django.db import connections

    store = job_store_alias()
    alias = using or load_settings().database
    if store is None or alias != store:
        where = "its own DATABASE_URL" if store is None else f"the Django database {store!r}"
        raise DjangoSetupError(
            f"the job store is {where}, so a job cannot commit in the transaction of {alias!r}",
            "use enqueue_on_commit(job, input) to enqueue once that transaction has committed, or put the "
            "job store in that database (ULTIMAT3['DATABASE'])",
            code="X_DJANGO_TRANSACTION",
        )
    connection = connections[alias]
    connection.ensure_connection()
    return connection.connection


def enqueue(job: JobHandle[InT], input: InT | Mapping[str, Any] | None = None, *, using: str | None = None,
            **options: Any) -> EnqueueResult:
    """Enqueue ``job`` in Django's current transaction on ``using`` (default: the job store's
    alias): inside ``transaction.atomic()`` the job commits with the block and vanishes if it
    rolls back; outside one it commits at once, as Django's autocommit does. ``options`` are
    :meth:`JobHandle.enqueue`'s (``delay``, ``run_at``, ``priority``, ``on_conflict``)."""
    return job.enqueue(input, connection=_raw_connection(using), driver=get_driver(), **options)


def enqueue_many(job: JobHandle[InT], inputs: Sequence[InT | Mapping[str, Any] | None], *,
                 using: str | None = None, **options: Any) -> list[EnqueueResult]:
    """:func:`enqueue` for several inputs: all of them or none, in the same transaction."""
    return job.enqueue_many(inputs, connection=_raw_connection(using), driver=get_driver(), **options)


def enqueue_on_commit(job: JobHandle[InT], input: InT | Mapping[str, Any] | None = None, *,
                      using: str | None = None, **options: Any) -> None:
    """Enqueue ``job`` once the transaction open on ``using`` commits (``transaction.on_commit``);
    never if it rolls back. For a job store in another database than the data. The input is
    validated now, so a bad one fails in the request that made it, not after the commit."""
    from django.db import transaction

    parsed = job.parse_input(input)
    transaction.on_commit(partial(job.enqueue, parsed, driver=get_driver(), **options), using=using)
