"""What every driver refuses before it writes, in one place, so the three agree to the letter.

Postgres text cannot hold NUL, no UTF-8 column can hold a lone surrogate, ``jsonb`` refuses NaN,
Infinity and ``\\u0000``, and the integer columns are 32 bits. Checking here (not in each
driver's error handling) gives every driver the same coded error and guarantees nothing is
half-written: a request is refused whole, before any statement runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, TypeVar, cast

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import ConfigError
from ultimat3.core.jsontext import strict_encoder
from ultimat3.drivers.limits import check_depth, current_limits, limit_error
from ultimat3.drivers.protocol import MAX_REASON_LENGTH, EnqueueRequest

#: Bounds of the 32-bit ``integer`` columns (priority, attempt, max_attempts).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text in every driver, or ``None``."""
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which is not UTF-8"
    return None


def is_storable_text(value: object) -> bool:
    """Whether ``value`` is a string every driver can store and compare (ids, names, keys)."""
    return isinstance(value, str) and text_problem(value) is None


def _check_json_strings(value: Any, where: str) -> None:
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(f"{where} {problem}")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and text_problem(key) is not None:
                raise ValueError(f"key {key!r} at {where} {text_problem(key)}")
            _check_json_strings(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json_strings(item, f"{where}[{index}]")


_dumps = strict_encoder()


def strict_dumps(value: Any) -> str:
    """Compact JSON text every driver stores alike; ``TypeError``/``ValueError`` when it cannot be."""
    try:
        text = _dumps(value)
        # The text is ASCII (ensure_ascii): a NUL or a surrogate anywhere in a key or a string shows
        # as a \u0000 or \udXXX escape, so only a text holding one (a backslash-u sequence written
        # literally, a non-BMP character) is walked to find the string and name it.
        if "\\u0000" in text or "\\ud" in text:
            _check_json_strings(value, "$")
    except RecursionError as error:
        raise ValueError("nested too deeply") from error
    return text


def json_text(value: Any, *, what: str, code: str, hint: str) -> str:
    """``value`` as compact JSON text every driver stores alike, or a coded :class:`ConfigError`."""
    try:
        return strict_dumps(value)
    except (TypeError, ValueError, RecursionError) as error:
        raise ConfigError(f"{what} is not storable JSON: {error}", hint, code=code) from error


def payload_text(request: EnqueueRequest) -> str:
    """The request's payload as JSON text (coded ``X_JOB_PAYLOAD`` when it cannot be stored)."""
    return json_text(request.payload, what=f'payload of job "{request.name}"', code="X_JOB_PAYLOAD",
                     hint="pass JSON data: str (no NUL), finite numbers, bool, None, lists and dicts")


class Serialized:
    """A value already turned into JSON text by :func:`strict_dumps` (the worker does it once, to
    decide whether a result can be stored at all); drivers store the text as it is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Serialized({self.text!r})"


def result_text(value: Any, *, what: str) -> str:
    """A job or step result as JSON text (coded ``X_JOB_RESULT``); a :class:`Serialized` value is
    not serialised again."""
    if isinstance(value, Serialized):
        return value.text
    return json_text(value, what=what, code="X_JOB_RESULT",
                     hint="return JSON data: str (no NUL), finite numbers, bool, None, lists and dicts")


#: The text columns of a request, each checked storable by :func:`check_request`.
_TEXT_FIELDS = ("name", "queue", "idempotency_key", "tenant_id", "traceparent", "enqueued_by")


#: Every field of a request but its payload and ``on_conflict``: what :func:`_check_envelope` reads.
_ENVELOPE = attrgetter("name", "queue", "idempotency_key", "tenant_id", "traceparent", "enqueued_by", "priority",
                       "max_attempts", "run_at", "flow_key", "flow_max", "rate_key", "rate_per_second", "rate_burst")


def check_request(request: EnqueueRequest, storable: set[Any] | None = None) -> str:
    """Refuse a request any driver would fail to store, with a coded error naming the field.

    Returns the payload as JSON text: drivers store that instead of serialising it again.
    ``storable``: what this batch already found storable, filled as it is found: the strings (its
    requests mostly share their name, queue, traceparent and actor) and whole envelopes (every
    field but the payload, with each value's type: ``True == 1``, but a bool is no priority).
    Either is not looked at again; the payload always is.
    """
    if storable is None:
        _check_envelope(request, None)
    else:
        values = _ENVELOPE(request)
        envelope = (values, tuple(map(type, values)))
        try:
            seen = envelope in storable
        except TypeError:  # an unhashable value, which the checks refuse by name
            _check_envelope(request, storable)
        else:
            if not seen:
                _check_envelope(request, storable)
                storable.add(envelope)
    if not isinstance(request.payload, dict):
        raise ConfigError(f'job "{request.name}" payload is {type(request.payload).__name__}, not a dict',
                          "pass the payload as a JSON object", code="X_JOB_PAYLOAD")
    limits = current_limits()
    check_depth(request.payload, what=f'payload of job "{request.name}"')
    text = payload_text(request)
    size = len(text)  # ASCII (strict_dumps escapes the rest): one byte a character
    if size > limits.max_payload_bytes:
        raise limit_error(f'payload of job "{request.name}"', "max_payload_bytes", limits.max_payload_bytes,
                          f"is {size:,} bytes of JSON")
    return text


def _check_envelope(request: EnqueueRequest, storable: set[Any] | None) -> None:
    """:func:`check_request` for every field but the payload."""
    for field in _TEXT_FIELDS:
        value = getattr(request, field)
        if value is None and field not in ("name", "queue"):
            continue
        if storable is not None and type(value) is str and value in storable:
            continue
        if not isinstance(value, str) or text_problem(value) is not None:
            problem = "is not a string" if not isinstance(value, str) else text_problem(value)
            raise ConfigError(f'job "{request.name!r}" {field}={value!r} {problem}',
                              f"pass {field} as plain text without NUL or unpaired surrogates",
                              code="X_JOB_FIELD")
        if storable is not None and type(value) is str:
            storable.add(value)
    priority = request.priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not INT32_MIN <= priority <= INT32_MAX:
        raise ConfigError(f'job "{request.name}" priority={priority!r} is not an integer in {INT32_MIN}..{INT32_MAX}',
                          "pass priority as a (32-bit) int; higher runs first, 0 is the default",
                          code="X_JOB_PRIORITY")
    attempts = request.max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= INT32_MAX:
        raise ConfigError(f'job "{request.name}" max_attempts={attempts!r} is outside 1..{INT32_MAX}',
                          "pass max_attempts as a 32-bit integer", code="X_JOB_FIELD")
    if request.run_at is not None:
        try:
            ok = math.isfinite(request.run_at) and to_datetime(request.run_at) is not None
        except (OverflowError, OSError, ValueError, TypeError):
            ok = False
        if not ok:
            raise ConfigError(f'job "{request.name}" would run at {request.run_at!r} (epoch seconds), past any '
                              "date a row can hold",
                              "pass a delay or run_at within years 1970..9999", code="X_JOB_SCHEDULE")
    _check_flow(request)
    limits = current_limits()
    for field in ("tenant_id", "idempotency_key"):
        value = getattr(request, field)
        if value is not None and len(value) > limits.max_key_length:
            raise limit_error(f'job "{request.name}" {field}', "max_key_length", limits.max_key_length,
                              f"is {len(value)} characters")


def _check_flow(request: EnqueueRequest) -> None:
    """Flow-control fields come in pairs a claim can enforce: a key with its bound, both or neither."""
    problem = None
    for key, bound in (("flow_key", "flow_max"), ("rate_key", "rate_per_second")):
        if (getattr(request, key) is None) != (getattr(request, bound) is None):
            problem = f"{key}={getattr(request, key)!r} with {bound}={getattr(request, bound)!r}"
        elif getattr(request, key) is not None and not is_storable_text(getattr(request, key)):
            problem = f"{key}={getattr(request, key)!r} is not storable text"
    for field, top in (("flow_max", INT32_MAX), ("rate_burst", INT32_MAX)):
        value = getattr(request, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top):
            problem = f"{field}={value!r} is outside 1..{top}"
    rate = request.rate_per_second
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not (math.isfinite(rate) and rate > 0)):
        problem = f"rate_per_second={rate!r} is not a positive finite number"
    if request.rate_key is not None and request.rate_burst is None:
        problem = "rate_key without rate_burst"
    if problem is not None:
        raise ConfigError(f'job "{request.name}" flow control: {problem}',
                          "declare flow control on the job (concurrency=limit(...), rate=rate_limit(...)) and let "
                          "the enqueue fill these fields", code="X_FLOW_FIELDS")


def storable(text: str) -> str:
    """``text`` made storable by escaping what no driver can hold (for error messages and reasons)."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


F = TypeVar("F", bound=Callable[..., Any])


def _guard(default: Callable[[], object], keys: int) -> Callable[[F], F]:
    def wrap(method: F) -> F:
        @functools.wraps(method)
        def guarded(self: object, *args: Any, **kwargs: Any) -> Any:
            if not all(is_storable_text(key) for key in args[:keys]):
                return default()
            return method(self, *args, **kwargs)

        return cast(F, guarded)

    return wrap


def unknown_key(default: Callable[[], object]) -> Callable[[F], F]:
    """A lookup by a key no driver could have stored (NUL, lone surrogate) finds nothing.

    Answering "unknown" (``default()``) instead of letting the database raise keeps an operator's
    typo or a hostile id on the same path as any other id that does not exist. The key is the
    method's first positional argument.
    """
    return _guard(default, 1)


def fenced_key(default: Callable[[], object]) -> Callable[[F], F]:
    """As :func:`unknown_key` for (job id, claim token): a token no driver minted holds no claim."""
    return _guard(default, 2)


def filter_is_storable(*values: str | None) -> bool:
    """Whether every given filter value could match a stored row (``None`` means "any")."""
    return all(value is None or is_storable_text(value) for value in values)


def check_step_name(name: str) -> None:
    """Refuse a step name no driver can store, coded ``X_STEP_NAME``."""
    if not is_storable_text(name):
        raise ConfigError(f"step name {name!r} is not storable text",
                          "name steps with plain text (no NUL or unpaired surrogates)", code="X_STEP_NAME")


def require_text(code: str, **fields: str | None) -> None:
    """Refuse (coded ``code``) any given field no driver can store; ``None`` values are skipped."""
    for field, value in fields.items():
        if value is not None and not is_storable_text(value):
            raise ConfigError(f"{field}={value!r} is not storable text",
                              f"pass {field} as plain text (no NUL or unpaired surrogates)", code=code)


def quarantine_rows(failed: Sequence[tuple[str, str]], handled: Sequence[str]) -> tuple[list[tuple[str, str]],
                                                                                         list[str]]:
    """What :meth:`BackfillLedger.quarantine` stores, the same on every driver: keys checked as
    storable text (``X_BACKFILL_FAIL``), reasons made storable and cut to :data:`MAX_REASON_LENGTH`,
    the last reason of a key given twice kept, and a key both failed and handled left failed."""
    reasons: dict[str, str] = {}
    for key, reason in failed:
        require_text("X_BACKFILL_FAIL", key=key)
        reasons[key] = storable(str(reason))[:MAX_REASON_LENGTH] or "failed"
    for key in handled:
        require_text("X_BACKFILL_FAIL", key=key)
    return list(reasons.items()), sorted({key for key in handled if key not in reasons})


def check_backfill_kind(kind: str) -> None:
    """Refuse a ledger kind other than ``pass`` or ``retry`` (``X_BACKFILL_LEDGER``)."""
    if kind not in ("pass", "retry"):
        raise ConfigError(f"backfill kind={kind!r} is not one the ledger keeps",
                          "open a pass with kind='pass' or kind='retry'", code="X_BACKFILL_LEDGER")


def check_bucket(bucket: float) -> None:
    """A throughput bucket must be a positive, finite number of seconds (``X_BUCKET``)."""
    if isinstance(bucket, bool) or not isinstance(bucket, int | float) or not math.isfinite(bucket) or bucket <= 0:
        raise ConfigError(f"a completions bucket must be a positive number of seconds, not {bucket!r}",
                          "pass bucket=60 for one bar per minute", code="X_BUCKET")
