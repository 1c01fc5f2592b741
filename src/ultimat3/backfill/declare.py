"""``backfill()``: a declared, paced, resumable pass over every row a select matches.

A FACTORY over :func:`~ultimat3.jobs.job.job`, not a second primitive: a backfill is durable
background work with an input, a retry policy, an idempotency key and a queue, which is what a
job is. So enqueue, cancel, retry, dead-letter and ``x jobs show`` work on it unchanged."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy.engine import Engine
from sqlalchemy.sql.elements import ColumnElement

from ultimat3.backfill.checksum import backfill_checksum
from ultimat3.backfill.definition import (
    DEFAULT_BACKFILL_BATCH,
    JOB_STORE,
    BackfillDefinition,
    BackfillInput,
    Count,
    EngineSource,
    Handle,
    Source,
)
from ultimat3.backfill.health import DEFAULT_HEALTH, Health
from ultimat3.backfill.pacer import DEFAULT_BACKFILL_RATE, Pacer, Sleep, is_valid_rate
from ultimat3.backfill.registry import _stamp
from ultimat3.backfill.requires import MigrationRequirement, as_requirement
from ultimat3.backfill.sizing import Adaptive
from ultimat3.backfill.sweep import run_pass
from ultimat3.core.clock import Clock
from ultimat3.core.context import ENVIRONMENTS, Ctx, Environment
from ultimat3.core.errors import check, fail
from ultimat3.drivers.protocol import DEFAULT_QUEUE, JobDriver, JobRecord
from ultimat3.jobs.duration import DurationInput
from ultimat3.jobs.job import NO_TENANT, JobHandle, Tenant, job
from ultimat3.jobs.retry import RetryPolicy
from ultimat3.jobs.steps import SyncStep

__all__ = [
    "backfill",
]

class _Missing:
    """The default of an argument that has none: refused coded, with the backfill's name."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _validate_environments(name: str, environments: Iterable[str] | None) -> tuple[Environment, ...] | None:
    if environments is None:
        return None
    hint = (
        f'write environments=["staging", "production"] on backfill(name="{name}") using '
        f"{', '.join(ENVIRONMENTS)} — or leave it out to allow every environment"
    )
    check(
        not isinstance(environments, str | bytes) and isinstance(environments, Iterable),
        f'backfill "{name}" declares environments={environments!r}, which is not a list of environments',
        hint,
        code="X_BACKFILL_ENVIRONMENTS",
    )
    values = list(environments)
    bad = [value for value in values if value not in ENVIRONMENTS]
    check(
        not bad,
        f'backfill "{name}" declares environments={values!r}; {bad!r} is not an environment',
        hint,
        code="X_BACKFILL_ENVIRONMENTS",
    )
    check(
        bool(values),
        f'backfill "{name}" declares environments=[] — it could never run anywhere',
        hint,
        code="X_BACKFILL_ENVIRONMENTS",
    )
    return tuple(cast(Environment, value) for value in dict.fromkeys(values))


def backfill(
    *,
    name: str | _Missing = _MISSING,
    tenant: Tenant | _Missing = _MISSING,
    source: Source | _Missing = _MISSING,
    handle: Handle | _Missing = _MISSING,
    batch: int | Adaptive = DEFAULT_BACKFILL_BATCH,
    rate: float = DEFAULT_BACKFILL_RATE,
    queue: str = DEFAULT_QUEUE,
    retry: RetryPolicy | None = None,
    timeout: DurationInput | None = None,
    requires: str | MigrationRequirement | None = None,
    environments: Iterable[Environment] | None = None,
    count: Count | None = None,
    engine: EngineSource | _Missing = _MISSING,
    key: ColumnElement[Any] | str | None = None,
    health: Health | None = DEFAULT_HEALTH,
    transactional: bool = False,
    clock: Clock | None = None,
    sleep: Sleep | None = None,
) -> JobHandle[BackfillInput]:
    """Declare a backfill: a job whose run is one paced keyset pass over ``source(ctx)``.

    - ``name`` (durable: queue row, steps and ledger carry it) and ``tenant`` (a callable
      ``input -> org id`` or ``'none'``, which grants the pass — and only it — cross-tenant reads)
      are required.
    - ``source(ctx) -> Select``: called inside the pass for every page; it must select the key.
      ``handle(batch)``: sync or async, idempotent (one batch may be handled twice).
    - ``batch``: rows per page/step, a whole number >= 1, or ``adaptive(target="500ms", min=100,
      max=10_000)`` to size each page from measured batch durations. ``rate``: batches per second, finite
      and > 0 (fractions allowed); there is no unthrottled mode.
    - ``requires``: an ``x_migrations`` id, or :func:`~ultimat3.backfill.requires.alembic_revision`.
      ``environments``: where it may run (omitted: everywhere). ``count(ctx)``: rows still
      matching, checked when the source is exhausted (``X_BACKFILL_STALLED``) and used by dry
      runs. Return a select and it is scoped to the pass's tenant and counted for you; return an
      int and the count is yours — build it with ``scoped(stmt, ctx)`` so it sees the same rows.
    - ``engine`` (required): the app database whose tables ``source`` reads — an Engine, a
      function returning one, or ``"job-store"`` to say they live in the job store's own database.
      There is no default: a guessed database is how a sweep reads the wrong rows.
    - ``key``: the primary-key column (inferred from a single-table source).
    - ``health``: the database-health throttle on PostgreSQL (:func:`~ultimat3.backfill.health.health`;
      on by default with its defaults), ``None`` to sweep without it.
    - ``transactional=True``: ``handle`` writes only through ``batch.connection``, given on any
      engine: each batch commits as one transaction, and ``x db backfill NAME --dry-run --sample N``
      may run real batches and roll them back.
    - ``clock``/``sleep``: the pacer's, injectable for tests.

    Bad values are refused here, with the backfill's name in the message; nothing is registered.
    """
    if not (isinstance(name, str) and name.strip() != ""):
        fail(
            f"backfill(name={name!r}) — a backfill needs a name",
            'write backfill(name="posts.fill_slug", ...); the name is the durable key its ledger rows carry',
            code="X_BACKFILL_NAME",
        )
    if isinstance(tenant, _Missing):
        fail(
            f'backfill "{name}" declares no tenant',
            "write tenant=lambda input: \"<org id>\" for a sweep of one org, or tenant='none' to sweep every org",
            code="X_BACKFILL_TENANT",
        )
    check(
        tenant == NO_TENANT or callable(tenant),
        f'backfill "{name}" declares tenant={tenant!r}',
        "write tenant=lambda input: \"<org id>\", or tenant='none'",
        code="X_BACKFILL_TENANT",
    )
    if isinstance(source, _Missing) or not callable(source):
        fail(
            f'backfill "{name}" declares source={source!r}, not a function',
            "write source=lambda ctx: select(posts).where(posts.c.slug.is_(None))",
            code="X_BACKFILL_SOURCE",
        )
    if isinstance(handle, _Missing) or not callable(handle):
        fail(
            f'backfill "{name}" declares handle={handle!r}, not a function',
            "write handle=fill_slugs, a function taking a Batch (batch.rows, batch.ctx, batch.signal, batch.index)",
            code="X_BACKFILL_HANDLE",
        )
    # Refused where it was written: a bad batch found inside the pass is a dead-lettered job.
    if isinstance(batch, Adaptive):
        batch = batch.validated(name)
    check(
        isinstance(batch, Adaptive) or (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1),
        f'backfill "{name}" declares batch={batch!r} — a batch is a whole number of rows, at least 1',
        f'write batch={DEFAULT_BACKFILL_BATCH} on backfill(name="{name}") — the rows one statement reads '
        "and one durable step records (or batch=adaptive(target=\"500ms\") to size it from batch durations)",
        code="X_BACKFILL_BATCH",
    )
    # Same voice and reason as batch — except an unpaced sweep is not a dead job but a saturated
    # pool, which the app's users find out about first.
    check(
        is_valid_rate(rate),
        f'backfill "{name}" declares rate={rate!r} — a rate is batches per second, a finite number '
        "greater than zero",
        f'write rate={DEFAULT_BACKFILL_RATE} on backfill(name="{name}") or leave it out (0.5 means one batch '
        "every two seconds); to sweep faster raise it — there is no unthrottled mode",
        code="X_BACKFILL_RATE",
    )
    allowed = _validate_environments(name, environments)
    check(
        requires is None
        or (isinstance(requires, str) and requires.strip() != "")
        or isinstance(requires, MigrationRequirement),
        f'backfill "{name}" declares requires={requires!r}',
        'write requires="<x_migrations id>" or requires=alembic_revision("<rev>", config="alembic.ini")',
        code="X_BACKFILL_REQUIRES",
    )
    check(
        count is None or callable(count),
        f'backfill "{name}" declares count={count!r}, not a function',
        "write count=lambda ctx: select(posts).where(posts.c.slug.is_(None)) — the rows source still matches",
        code="X_BACKFILL_COUNT",
    )
    if isinstance(engine, _Missing):
        fail(
            f'backfill "{name}" declares no engine= — which database holds the tables its source reads?',
            f'write engine=create_engine("postgresql+psycopg://...") (or a function returning one) on '
            f'backfill(name="{name}"), or engine="{JOB_STORE}" when they live in the job store\'s own database',
            code="X_BACKFILL_ENGINE",
        )
    check(
        engine == JOB_STORE or isinstance(engine, Engine) or (callable(engine) and not isinstance(engine, str)),
        f'backfill "{name}" declares engine={engine!r}',
        f'pass a sqlalchemy Engine, a function returning one, or engine="{JOB_STORE}"',
        code="X_BACKFILL_ENGINE",
    )
    check(
        key is None or (isinstance(key, str) and key != "") or isinstance(key, ColumnElement),
        f'backfill "{name}" declares key={key!r}',
        'pass the primary-key column (key=posts.c.id) or its name (key="id")',
        code="X_BACKFILL_KEY",
    )
    if health is not None:
        check(isinstance(health, Health),
              f'backfill "{name}" declares health={health!r}',
              'write health=health(max_transaction_age="2m") (from ultimat3.backfill), or health=None',
              code="X_BACKFILL_HEALTH")
        health = health.validated(name)
    check(isinstance(transactional, bool),
          f'backfill "{name}" declares transactional={transactional!r}',
          "write transactional=True when handle writes only through batch.connection, else leave it out",
          code="X_BACKFILL_TRANSACTIONAL")
    # Hashed once here: the code cannot change while the process runs. Not rate or batch — a
    # tuning knob does not make a completed sweep a different sweep.
    checksum = backfill_checksum(source, handle)
    # Built once per declaration: the pace belongs to the table and pool, so every attempt of
    # this backfill in the process shares it.
    pacer = Pacer(rate, name, clock=clock, sleep=sleep)
    definition = BackfillDefinition(
        name=name,
        tenant=tenant,
        source=source,
        handle=handle,
        batch=batch,
        rate=float(rate),
        checksum=checksum,
        pacer=pacer,
        requires=None if requires is None else as_requirement(requires),
        environments=allowed,
        count=count,
        engine=engine,
        key=key,
        health=health,
        transactional=transactional,
    )

    # A plain def: the pass uses SQLAlchemy synchronously, so it must run in the worker's thread
    # pool rather than on its event loop.
    def run(input: BackfillInput, ctx: Ctx, step: SyncStep) -> dict[str, Any]:
        return run_pass(definition, input, ctx, step).to_dict()

    run.__qualname__ = f"backfill[{name}]"
    run.__module__ = getattr(source, "__module__", None) or __name__

    declared: JobHandle[BackfillInput] = job(
        name=name,
        tenant=tenant,
        input=BackfillInput,
        retry=retry,
        queue=queue,
        timeout=timeout,
        # One live pass per name, forced or not: a second enqueue while it runs IS that pass,
        # never a second writer sweeping the same table.
        idempotency_key=lambda _input: name,
    )(run)
    declared.on_dead = _close_dead_pass
    # job() already refused a duplicate name, so the stamp never overwrites another backfill.
    _stamp(declared, definition)
    return declared


def _close_dead_pass(driver: JobDriver, job: JobRecord, error: str | None) -> None:
    """A dead-lettered pass must not leave its ledger row reading ``running`` forever.

    The pass closes its own row when it fails, but a run whose attempts were all spent by killed
    workers is dead-lettered without the pass ever running again, so the worker closes it here.
    """
    run = driver.backfills.get(job.run_id)
    if run is not None and run.status == "running":
        driver.backfills.finish(job.run_id, "failed", error or "dead-lettered")
