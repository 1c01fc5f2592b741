"""``@job``: a declared, named, typed unit of durable background work, and its process registry."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from pydantic import BaseModel, ConfigDict, ValidationError

from ultimat3.core.clock import to_seconds
from ultimat3.core.context import Ctx, current_ctx
from ultimat3.core.errors import XError, check, fail
from ultimat3.core.jsontext import strict_encoder
from ultimat3.core.tracing import enqueue_span
from ultimat3.drivers.limits import check_depth
from ultimat3.drivers.protocol import DEFAULT_QUEUE, EnqueueRequest, EnqueueResult, JobDriver, JobRecord, OnConflict
from ultimat3.jobs.duration import DurationInput, parse_duration
from ultimat3.jobs.errors import JobInputError
from ultimat3.jobs.flow import SINGLETON_KEY, FlowControl, FlowFields, Limit, RateLimit, SingletonMode
from ultimat3.jobs.retry import DEFAULT_RETRY, RetryPolicy
from ultimat3.jobs.schedule import Schedule
from ultimat3.tenancy.enqueue import check_enqueue

if TYPE_CHECKING:
    from ultimat3.jobs.steps import AsyncStep, SyncStep

InT = TypeVar("InT", bound=BaseModel)

#: ``tenant='none'``: the job belongs to no org (it runs with no org on its actor).
NO_TENANT: Literal["none"] = "none"
Tenant = Literal["none"] | Callable[[Any], str | None]
AsyncHandler = Callable[[Any, Ctx, "AsyncStep"], Awaitable[Any]]
SyncHandler = Callable[[Any, Ctx, "SyncStep"], Any]
Handler = AsyncHandler | SyncHandler

#: Priorities are stored in a 32-bit integer column (Postgres ``integer``).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-/]{0,199}$")
#: A ``singleton="replace"`` enqueue cancels the live run and tries again at most this often.
_REPLACE_TRIES = 5


class NoInput(BaseModel):
    """The input model of a job declared without ``input=``: an empty object."""

    model_config = ConfigDict(extra="forbid")


class _Registry:
    """Every job declared in this process, by name. Backfills are found here too (no second registry)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobHandle[Any]] = {}

    def add(self, handle: JobHandle[Any]) -> None:
        existing = self.jobs.get(handle.name)
        if existing is not None:
            fail(
                f'job "{handle.name}" is declared twice (first by {existing.origin}, again by {handle.origin})',
                "give each job a unique name; names are durable keys stored on every queued row",
                code="X_JOB_DUPLICATE_NAME",
            )
        self.jobs[handle.name] = handle


_registry = _Registry()


def registered_jobs() -> list[JobHandle[Any]]:
    """Every job declared in this process, in declaration order."""
    return list(_registry.jobs.values())


def get_job(name: str) -> JobHandle[Any] | None:
    """The handle declared under ``name``, if any."""
    return _registry.jobs.get(name)


@contextmanager
def isolated_registry() -> Iterator[None]:
    """Run a block with an empty registry and restore the previous one after (for tests)."""
    saved = dict(_registry.jobs)
    _registry.jobs.clear()
    try:
        yield
    finally:
        _registry.jobs.clear()
        _registry.jobs.update(saved)


def _describe_validation(name: str, error: ValidationError) -> JobInputError:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(input)"
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(input)'}: {e['msg']}" for e in error.errors()[:5]
    )
    return JobInputError(
        f'job "{name}" input field "{where}" is invalid — {problems}',
        f'pass a value for "{where}" that the job\'s input model accepts ({first["type"]})',
        field=where,
    )


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call enqueue options (see :meth:`JobHandle.enqueue`)."""

    delay: DurationInput | None = None
    run_at: datetime | None = None
    priority: int | None = None
    on_conflict: OnConflict = "return"


@dataclass(slots=True)
class _Shared:
    """What every input of one enqueue call shares (its options, resolved), and the orgs whose
    enqueue the acting context was already allowed in this call."""

    run_at: float | None
    priority: int
    on_conflict: OnConflict
    allowed: set[str | None]


#: The flow fields of a job that declares no flow control.
_NO_FLOW = FlowFields()


class JobHandle(Generic[InT]):
    """A declared job: call :meth:`enqueue` to queue a run. Built by :func:`job`."""

    def __init__(
        self,
        *,
        name: str,
        handler: Handler,
        input_model: type[InT],
        tenant: Tenant,
        retry: RetryPolicy,
        queue: str,
        timeout: float | None,
        idempotency_key: Callable[[InT], str] | None,
        priority: int,
        origin: str,
    ) -> None:
        self.name = name
        self.handler = handler
        self.input_model = input_model
        self.tenant = tenant
        self.retry = retry
        self.queue = queue
        self.timeout = timeout
        self.idempotency_key = idempotency_key
        self.priority = priority
        self.origin = origin
        self.is_async = inspect.iscoroutinefunction(handler)
        #: False for a handler declared as ``(input, ctx)``: it is called without the step.
        self.takes_step = True
        #: Called by the worker (from an I/O thread) once a run is dead-lettered, with the driver,
        #: the row as claimed and the error kept on it. A run can die without its handler running
        #: (its attempts spent by lost workers), so cleanup that the handler cannot do lives here.
        self.on_dead: Callable[[JobDriver, JobRecord, str | None], None] | None = None
        #: The schedules that enqueue this job periodically (see :mod:`ultimat3.jobs.schedule`).
        self.schedules: tuple[Schedule, ...] = ()
        #: Declared flow control (per-key concurrency, rate, singleton), ``None`` when there is none.
        self.flow: FlowControl | None = None

    def __repr__(self) -> str:
        return f"<job {self.name!r} queue={self.queue!r}>"

    def parse_input(self, value: InT | Mapping[str, Any] | None) -> InT:
        """Validate ``value`` against the input model; :class:`JobInputError` names the field."""
        if type(value) is dict:  # a claimed payload, the common input: no ABC instance checks
            data: Any = value
        elif isinstance(value, self.input_model):
            data = value.model_dump()
        elif value is None:
            data = {}
        elif isinstance(value, BaseModel):
            fail(
                f'job "{self.name}" takes {self.input_model.__name__}, not {type(value).__name__}',
                f"pass a {self.input_model.__name__} or a dict of its fields",
                code="X_JOB_INPUT",
            )
        else:
            data = value
        # Before pydantic sees it: a hostile depth would otherwise surface as its ValueError or a
        # RecursionError instead of one coded line.
        check_depth(data, what=f'input of job "{self.name}"')
        try:
            return self.input_model.model_validate(data)
        except ValidationError as error:
            raise _describe_validation(self.name, error) from None
        except (ValueError, RecursionError) as error:
            raise JobInputError(f'job "{self.name}" input cannot be read: {type(error).__name__}: {error}',
                                f"pass a JSON-like value its input model ({self.input_model.__name__}) accepts",
                                field="(input)") from None

    def tenant_of(self, value: InT) -> str | None:
        """The org a run belongs to (``None`` for ``tenant='none'``)."""
        if self.tenant == NO_TENANT:
            return None
        org = self.tenant(value)
        check(
            isinstance(org, str) and org != "",
            f'job "{self.name}": its tenant function returned {org!r} for this input, not an org id',
            "return the org id (a non-empty string) from tenant=..., or declare tenant='none'",
            code="X_JOB_TENANT",
        )
        return org

    def build_request(
        self,
        value: InT | Mapping[str, Any] | None,
        options: EnqueueOptions,
        *,
        now: float,
        ctx: Ctx,
    ) -> EnqueueRequest:
        """Validate and turn one input into the row a driver writes. Raises before anything is written."""
        return self._request(value, self._shared(options, now), ctx)

    def _shared(self, options: EnqueueOptions, now: float) -> _Shared:
        """What every input of one enqueue call shares, checked once for the call."""
        check(
            options.delay is None or options.run_at is None,
            f'job "{self.name}" was enqueued with both delay= and run_at=',
            "pass one of them: delay=30 (seconds from now) or run_at=<aware datetime>",
            code="X_JOB_SCHEDULE",
        )
        run_at: float | None = None
        if options.delay is not None:
            run_at = now + parse_duration(options.delay, what=f'job "{self.name}" delay')
        elif options.run_at is not None:
            check(
                isinstance(options.run_at, datetime) and options.run_at.tzinfo is not None,
                f'job "{self.name}" run_at={options.run_at!r} is not an aware datetime',
                "pass an aware datetime, e.g. datetime.now(UTC) + timedelta(minutes=5)",
                code="X_JOB_SCHEDULE",
            )
            run_at = to_seconds(options.run_at)
        check(
            options.on_conflict in ("return", "error"),
            f'job "{self.name}" on_conflict={options.on_conflict!r}',
            "pass on_conflict='return' (get the live run back) or 'error' (raise JobDuplicateError)",
            code="X_JOB_ON_CONFLICT",
        )
        # run_at's range and the priority's are the drivers' value rules (drivers/values.py),
        # checked once, on the request, before anything is written.
        priority = self.priority if options.priority is None else options.priority
        return _Shared(run_at, priority, options.on_conflict, set())

    def _request(self, value: InT | Mapping[str, Any] | None, shared: _Shared, ctx: Ctx) -> EnqueueRequest:
        model = self.parse_input(value)
        tenant_id = self.tenant_of(model)
        # A request acting for one org must not queue work for another (the job would run with
        # the other org's data under this request's authority), and a context that lost its
        # request must not queue work for anyone. Asked once per org in one call.
        if tenant_id not in shared.allowed:
            check_enqueue(ctx, self.name, tenant_id)
            shared.allowed.add(tenant_id)
        key = None
        if self.idempotency_key is not None:
            key = self.idempotency_key(model)
            check(
                isinstance(key, str) and key != "",
                f'job "{self.name}": idempotency_key returned {key!r}, not a non-empty string',
                "return a string that identifies the unit of work, e.g. f\"invoice:{input.invoice_id}\"",
                code="X_JOB_IDEMPOTENCY_KEY",
            )
        # jsonb (and strict JSON) has no NaN or Infinity: refuse here, coded, before any write.
        # Looked for before the JSON dump too: pydantic's JSON mode silently turns a NaN held
        # in an Any/dict field into null, which would change the input without a word.
        where = _non_finite(model.model_dump())
        if where is not None:
            fail(
                f'job "{self.name}" input field "{where or "(input)"}" holds NaN or Infinity, which JSON cannot store',
                "pass finite numbers (or None) in the input",
                code="X_JOB_INPUT",
            )
        flow = self.flow.fields(model) if self.flow is not None else _NO_FLOW
        if self.flow is not None and self.flow.singleton in ("skip", "replace"):
            key = SINGLETON_KEY
        # JSON-ready Python, not text: the driver serialises the payload once (check_request).
        payload = model.model_dump(mode="json")
        return _enqueue_request(
            name=self.name,
            payload=payload,
            queue=self.queue,
            idempotency_key=key,
            run_at=shared.run_at,
            priority=shared.priority,
            max_attempts=self.retry.max_attempts,
            tenant_id=tenant_id,
            traceparent=ctx.traceparent,
            enqueued_by=ctx.actor.id,
            on_conflict=shared.on_conflict,
            flow_key=flow.flow_key,
            flow_max=flow.flow_max,
            rate_key=flow.rate_key,
            rate_per_second=flow.rate_per_second,
            rate_burst=flow.rate_burst,
        )

    def _driver(self, driver: JobDriver | None) -> JobDriver:
        if driver is not None:
            return driver
        from ultimat3.jobs.runtime import get_driver

        return get_driver()

    def _now(self, driver: JobDriver) -> float:
        return driver.clock.now()

    def enqueue(
        self,
        input: InT | Mapping[str, Any] | None = None,
        *,
        delay: DurationInput | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        on_conflict: OnConflict = "return",
        connection: Any = None,
        driver: JobDriver | None = None,
    ) -> EnqueueResult:
        """Validate ``input`` and queue one run.

        ``connection``: the caller's open psycopg/sqlite3/SQLAlchemy connection; the job is
        written in its transaction (and vanishes on rollback). ``driver``: defaults to the
        process driver (``X_DATABASE_URL``). Returns :class:`EnqueueResult` (``deduped`` when a
        live run under the same idempotency key was returned instead).
        """
        target = self._driver(driver)
        options = EnqueueOptions(delay=delay, run_at=run_at, priority=priority, on_conflict=on_conflict)
        ctx = current_ctx()
        with enqueue_span(self.name, self.queue, 1, ctx.traceparent) as traceparent:
            request = _traced(self.build_request(input, options, now=self._now(target), ctx=ctx), traceparent)
            if self._replacing(1, connection):
                return self._replace(target, request)
            return target.enqueue(request, connection=connection)

    async def aenqueue(
        self,
        input: InT | Mapping[str, Any] | None = None,
        *,
        delay: DurationInput | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        on_conflict: OnConflict = "return",
        connection: Any = None,
        driver: JobDriver | None = None,
    ) -> EnqueueResult:
        """:meth:`enqueue` from async code, on the event loop (no thread hop per job).

        ``connection``: the caller's open ASYNC transaction (a SQLAlchemy ``AsyncConnection`` or
        ``AsyncSession`` on ``postgresql+psycopg``, ``postgresql+asyncpg`` or ``sqlite+aiosqlite``,
        a ``psycopg.AsyncConnection``, an ``asyncpg.Connection``): the job exists if and only if
        that transaction commits. Validation, tenancy and idempotency are the sync form's.
        """
        return (await self.aenqueue_many([input], delay=delay, run_at=run_at, priority=priority,
                                         on_conflict=on_conflict, connection=connection, driver=driver))[0]

    async def aenqueue_many(
        self,
        inputs: Sequence[InT | Mapping[str, Any] | None],
        *,
        delay: DurationInput | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        on_conflict: OnConflict = "return",
        connection: Any = None,
        driver: JobDriver | None = None,
    ) -> list[EnqueueResult]:
        """:meth:`enqueue_many` from async code: every input validated first, then all or nothing."""
        target = self._driver(driver)
        with enqueue_span(self.name, self.queue, len(inputs), current_ctx().traceparent) as traceparent:
            requests = self._requests(inputs, EnqueueOptions(delay=delay, run_at=run_at, priority=priority,
                                                             on_conflict=on_conflict), target)
            traced = [_traced(r, traceparent) for r in requests]
            if self._replacing(len(traced), connection):
                return [await asyncio.to_thread(contextvars.copy_context().run, self._replace, target, traced[0])]
            return await target.aenqueue_many(traced, connection=connection)

    def enqueue_many(
        self,
        inputs: Sequence[InT | Mapping[str, Any] | None],
        *,
        delay: DurationInput | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        on_conflict: OnConflict = "return",
        connection: Any = None,
        driver: JobDriver | None = None,
    ) -> list[EnqueueResult]:
        """Validate every input first, then queue them all in one transaction (all or nothing)."""
        target = self._driver(driver)
        with enqueue_span(self.name, self.queue, len(inputs), current_ctx().traceparent) as traceparent:
            requests = self._requests(inputs, EnqueueOptions(delay=delay, run_at=run_at, priority=priority,
                                                             on_conflict=on_conflict), target)
            traced = [_traced(r, traceparent) for r in requests]
            if self._replacing(len(traced), connection):
                return [self._replace(target, traced[0])]
            return target.enqueue_many(traced, connection=connection)

    def _replacing(self, count: int, connection: Any) -> bool:
        """Whether this enqueue replaces a live run (a ``singleton="replace"`` job), refusing what a
        replacement cannot do: join a caller's transaction (the cancel of the live run commits on
        its own) or take several inputs at once (each would replace the one before)."""
        if self.flow is None or self.flow.singleton != "replace":
            return False
        check(connection is None, f'job "{self.name}" is singleton="replace" and was enqueued with connection=',
              "enqueue it without connection= (replacing cancels the live run, which commits on its own), "
              'or declare singleton="skip"', code="X_FLOW_SINGLETON")
        check(count == 1, f'job "{self.name}" is singleton="replace" and was given {count} inputs at once',
              "enqueue one input: each would replace the one before it", code="X_FLOW_SINGLETON")
        return True

    def _replace(self, target: JobDriver, request: EnqueueRequest) -> EnqueueResult:
        """Enqueue ``request``, cancelling the live run that holds the singleton first. Another
        enqueuer may slip a run in between the cancel and the insert: that one is replaced in turn."""
        request = replace(request, on_conflict="return")
        for _ in range(_REPLACE_TRIES):
            result = target.enqueue(request)
            if not result.deduped:
                return result
            target.cancel(result.id, reason=f'X_JOB_REPLACED: a newer enqueue of singleton job "{self.name}" '
                                            "replaced this run")
        return result

    def _requests(self, inputs: Sequence[InT | Mapping[str, Any] | None], options: EnqueueOptions,
                  target: JobDriver) -> list[EnqueueRequest]:
        ctx = current_ctx()
        shared = self._shared(options, self._now(target))
        requests = []
        for index, value in enumerate(inputs):
            try:
                requests.append(self._request(value, shared, ctx))
            except XError as error:
                if len(inputs) > 1:
                    error.message = f"inputs[{index}]: {error.message}"
                    error.args = (error.message,)
                raise
        return requests


#: Every field of :class:`EnqueueRequest`: :func:`_enqueue_request` must be given each one.
_REQUEST_FIELDS = frozenset(field.name for field in fields(EnqueueRequest))


def _enqueue_request(**values: Any) -> EnqueueRequest:
    """An :class:`EnqueueRequest` built by filling its ``__dict__``: the frozen dataclass's
    ``__init__`` sets its 17 fields one ``object.__setattr__`` at a time (3 us, paid per input of
    an ``enqueue_many``); this is the same request (equal, frozen afterwards) for a third of that.
    Every field must be given (asserted: a field added to the class cannot be left unset)."""
    assert values.keys() == _REQUEST_FIELDS, sorted(values.keys() ^ _REQUEST_FIELDS)
    request: EnqueueRequest = object.__new__(EnqueueRequest)
    request.__dict__.update(values)
    return request


def _traced(request: EnqueueRequest, traceparent: str | None) -> EnqueueRequest:
    """``request`` carrying the enqueue span's traceparent (unchanged when there is none)."""
    return request if traceparent is None or traceparent == request.traceparent else replace(
        request, traceparent=traceparent)


def _non_finite(value: Any) -> str | None:
    """:func:`_non_finite_at` from the top, asked only when there is one: the C JSON encoder walks
    a clean dump (every input but a broken one) faster than Python can, and refuses a NaN."""
    try:
        _walk(value)
    except (ValueError, TypeError, RecursionError):
        return _non_finite_at(value, "")
    return None


def _anything(value: object) -> Any:
    """For :func:`_non_finite`'s walk: the containers :func:`_non_finite_at` looks into, as JSON
    ones; any other value that is not JSON holds no float, so a null."""
    if isinstance(value, set | frozenset):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return None


_walk = strict_encoder(default=_anything)


def _non_finite_at(value: Any, path: str) -> str | None:
    """The dotted path of the first NaN/Infinity float inside ``value`` (a python-mode dump), if any."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, Mapping):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list | tuple | set | frozenset):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite_at(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def _origin_of(handler: Callable[..., Any]) -> str:
    module = getattr(handler, "__module__", "?")
    qualname = getattr(handler, "__qualname__", repr(handler))
    return f"{module}.{qualname}"


class _Missing:
    """The default of an argument that has none: refused coded, with the job's name, when omitted."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()
M = TypeVar("M", bound=BaseModel)


@overload
def job(
    *,
    name: str,
    tenant: Literal["none"] | Callable[[NoInput], str | None],
    input: None = None,
    retry: RetryPolicy | None = None,
    queue: str = DEFAULT_QUEUE,
    timeout: DurationInput | None = None,
    idempotency_key: Callable[[NoInput], str] | None = None,
    priority: int = 0,
    schedule: Schedule | Sequence[Schedule] | None = None,
    concurrency: Limit | None = None,
    rate: RateLimit | None = None,
    singleton: SingletonMode | Literal[False] | None = None,
) -> Callable[[Handler], JobHandle[NoInput]]: ...


@overload
def job(
    *,
    name: str,
    tenant: Literal["none"] | Callable[[M], str | None],
    input: type[M],
    retry: RetryPolicy | None = None,
    queue: str = DEFAULT_QUEUE,
    timeout: DurationInput | None = None,
    idempotency_key: Callable[[M], str] | None = None,
    priority: int = 0,
    schedule: Schedule | Sequence[Schedule] | None = None,
    concurrency: Limit | None = None,
    rate: RateLimit | None = None,
    singleton: SingletonMode | Literal[False] | None = None,
) -> Callable[[Handler], JobHandle[M]]: ...


def job(
    *,
    name: str | _Missing = _MISSING,
    tenant: Tenant | _Missing = _MISSING,
    input: type[BaseModel] | None = None,
    retry: RetryPolicy | None = None,
    queue: str = DEFAULT_QUEUE,
    timeout: DurationInput | None = None,
    idempotency_key: Callable[[Any], str] | None = None,
    priority: int = 0,
    schedule: Schedule | Sequence[Schedule] | None = None,
    concurrency: Limit | None = None,
    rate: RateLimit | None = None,
    singleton: SingletonMode | Literal[False] | None = None,
) -> Callable[[Handler], JobHandle[Any]]:
    """Declare a job over an ``async def`` or plain ``def`` handler ``(input, ctx, step)``.

    ``name`` (unique per process, a durable key) and ``tenant`` (a callable ``input -> org_id``,
    or ``'none'``) are required. ``input`` is a pydantic model validated at enqueue. ``timeout``
    is per attempt. ``idempotency_key(input) -> str`` dedupes live runs per (name, key).
    ``schedule``: one :func:`~ultimat3.jobs.schedule.cron` or :func:`~ultimat3.jobs.schedule.every`
    (or a list of them, each with a ``name=``) that workers fire once per tick.
    ``concurrency=limit(max=2, key=lambda i: i.org_id)``, ``rate=rate_limit("14/s", burst=14)`` and
    ``singleton=True`` (or ``"skip"``/``"replace"``) are flow control, enforced by every claim
    across the fleet (see :mod:`ultimat3.jobs.flow`).
    """
    if not (isinstance(name, str) and _NAME.match(name) is not None):
        fail(
            f"job(name={name!r}) — a job needs a name of letters, digits and _ . : - / (up to 200)",
            'write job(name="billing.send_invoice", ...); the name is stored on every queued row',
            code="X_JOB_NAME",
        )
    if isinstance(tenant, _Missing):
        fail(
            f'job "{name}" declares no tenant',
            "write tenant=lambda input: input.org_id, or tenant='none' for work that belongs to no org",
            code="X_JOB_TENANT",
        )
    check(
        tenant == NO_TENANT or callable(tenant),
        f'job "{name}" declares tenant={tenant!r}',
        "write tenant=lambda input: input.org_id, or tenant='none'",
        code="X_JOB_TENANT",
    )
    check(
        input is None or (isinstance(input, type) and issubclass(input, BaseModel)),
        f'job "{name}" declares input={input!r}, which is not a pydantic model class',
        "declare class MyInput(pydantic.BaseModel): ... and pass input=MyInput",
        code="X_JOB_INPUT_MODEL",
    )
    check(
        isinstance(queue, str) and _NAME.match(queue) is not None,
        f'job "{name}" declares queue={queue!r}',
        'write a short name of letters, digits and _ . : - /, e.g. queue="emails"',
        code="X_JOB_QUEUE",
    )
    check(
        retry is None or isinstance(retry, RetryPolicy),
        f'job "{name}" declares retry={retry!r}',
        "write retry=RetryPolicy(max_attempts=5)",
        code="X_RETRY_POLICY",
    )
    seconds = None if timeout is None else parse_duration(timeout, what=f'job "{name}" timeout')
    flow = FlowControl.declare(name, concurrency, rate, singleton)
    check(
        idempotency_key is None or flow is None or flow.singleton not in ("skip", "replace"),
        f'job "{name}" declares singleton={singleton!r} and an idempotency_key',
        "keep one: a skip/replace singleton is deduplicated by its name alone",
        code="X_FLOW_SINGLETON",
    )
    check(
        seconds is None or seconds > 0,
        f'job "{name}" declares timeout={timeout!r}; a timeout is greater than zero',
        'write timeout="30s", or leave it out for no per-attempt limit',
        code="X_DURATION",
    )

    def declare(handler: Handler) -> JobHandle[Any]:
        check(
            callable(handler),
            f'@job(name="{name}") decorates {handler!r}, which is not callable',
            "decorate a function (input, ctx, step)",
            code="X_JOB_HANDLER",
        )
        takes_step = _takes_step(name, handler)
        handle: JobHandle[Any] = JobHandle(
            name=name,
            handler=handler,
            input_model=input or NoInput,
            tenant=tenant,
            retry=retry or DEFAULT_RETRY,
            queue=queue,
            timeout=seconds,
            idempotency_key=idempotency_key,
            priority=priority,
            origin=_origin_of(handler),
        )
        handle.takes_step = takes_step
        handle.flow = flow
        handle.schedules = _checked_schedules(handle, schedule)
        _registry.add(handle)
        return handle

    return declare


def _checked_schedules(handle: JobHandle[Any], schedule: Schedule | Sequence[Schedule] | None) -> tuple[Schedule, ...]:
    """The job's schedules, refused where they are declared when they could never fire."""
    name = handle.name
    if schedule is None:
        return ()
    schedules = (schedule,) if isinstance(schedule, Schedule) else tuple(schedule) if isinstance(
        schedule, Sequence) and not isinstance(schedule, str) else None
    if schedules is None or not all(isinstance(s, Schedule) for s in schedules):
        fail(f'job "{name}" declares schedule={schedule!r}',
             'write schedule=cron("0 3 * * *") or every("5m") (or a list of them), from ultimat3.jobs',
             code="X_SCHEDULE")
    for s in schedules:
        if s.invalid is not None:
            fail(f'job "{name}" declares {s.invalid.message}', s.invalid.hint, code=s.invalid.code)
    keys = [s.key(name) for s in schedules]
    if len(set(keys)) != len(keys):
        fail(f'job "{name}" declares {len(schedules)} schedules that share a name',
             'name each: schedule=[cron("0 3 * * *", name="nightly"), every("1h", name="hourly")]',
             code="X_SCHEDULE_NAME")
    for s in schedules:
        if callable(s.input):
            try:
                inspect.signature(s.input).bind(None)
            except TypeError:
                fail(f'job "{name}" schedule {s.describe()}: input={s.input!r} cannot be called with the tick',
                     "pass input=lambda tick: {...} (tick is an aware UTC datetime), or a fixed dict",
                     code="X_SCHEDULE_INPUT")
            except ValueError:  # no signature to read (a builtin): called as it is
                pass
            continue
        try:
            handle.parse_input(s.build_input(0.0))
        except XError as error:
            hint = ("give the schedule an input: cron(..., input={...}) or input=lambda tick: {...}"
                    if s.input is None else "give an input the job's model accepts")
            fail(f'job "{name}" schedule {s.describe()} cannot build its input: {error.message}', hint,
                 code="X_SCHEDULE_INPUT")
    return schedules


def _takes_step(name: str, handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` takes ``(input, ctx, step)`` (True) or ``(input, ctx)`` (False); anything
    else is refused here, where it was written, not at its first run."""
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return True  # a builtin or C callable with no signature to read: called with all three
    for arity in (3, 2):
        try:
            signature.bind(*range(arity))
        except TypeError:
            continue
        return arity == 3
    fail(
        f'@job(name="{name}") decorates {_origin_of(handler)}{signature}, which cannot be called as '
        "(input, ctx, step) or (input, ctx)",
        "declare the handler as def handler(input, ctx, step) (or (input, ctx) when it records no steps)",
        code="X_JOB_HANDLER",
    )

