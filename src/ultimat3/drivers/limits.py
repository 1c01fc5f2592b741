"""Limits every enqueue is held to, whichever driver stores it: a user can rely on them.

Each is refused at enqueue with a coded error that names the limit and its value. They are
process-wide settings: :func:`configure_limits` in code, or the ``X_MAX_*`` environment variables
read when the process starts.

- ``max_payload_bytes`` (``X_MAX_PAYLOAD_BYTES``, default 1 MiB): the JSON text of one payload.
  A queue row is not a blob store: a 10 MB payload slows every claim and every ``x jobs ls``.
- ``max_depth`` (``X_MAX_PAYLOAD_DEPTH``, default 64): nesting of lists/objects in a payload,
  checked without recursion before anything parses it.
- ``max_key_length`` (``X_MAX_KEY_LENGTH``, default 255): characters in a tenant id or an
  idempotency key (they are indexed, and shown in every listing).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ultimat3.core.errors import ConfigError

__all__ = ["Limits", "check_depth", "configure_limits", "current_limits", "limit_error"]


@dataclass(frozen=True)
class Limits:
    """The enqueue limits (see the module doc)."""

    max_payload_bytes: int = 1_048_576
    max_depth: int = 64
    max_key_length: int = 255


_ENV = {"max_payload_bytes": "X_MAX_PAYLOAD_BYTES", "max_depth": "X_MAX_PAYLOAD_DEPTH",
        "max_key_length": "X_MAX_KEY_LENGTH"}


def _positive(name: str, value: object, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{source}={value!r} is not a limit", f"set {name} to a whole number >= 1",
                          code="X_LIMIT_CONFIG")
    return value


def _from_environment() -> Limits:
    values: dict[str, int] = {}
    for field, variable in _ENV.items():
        raw = os.environ.get(variable)
        if raw is None or raw.strip() == "":
            continue
        try:
            parsed: object = int(raw.strip())
        except ValueError:
            parsed = raw
        values[field] = _positive(field, parsed, variable)
    return Limits(**values)


_lock = threading.Lock()
_current: Limits | None = None


def current_limits() -> Limits:
    """The limits in force (the environment's on first use, unless configured in code)."""
    global _current
    current = _current  # set once, then only replaced whole: read without the lock (every enqueue and attempt asks)
    if current is not None:
        return current
    with _lock:
        if _current is None:
            _current = _from_environment()
        return _current


def configure_limits(**changes: int) -> Limits:
    """Change some limits for this process (``max_payload_bytes=``, ``max_depth=``,
    ``max_key_length=``); returns the limits now in force. Bad values are refused, coded."""
    unknown = set(changes) - set(_ENV)
    if unknown:
        raise ConfigError(f"configure_limits() got {', '.join(sorted(unknown))}, which is not a limit",
                          f"configure one of {', '.join(_ENV)}", code="X_LIMIT_CONFIG")
    for name, value in changes.items():
        _positive(name, value, name)
    global _current
    updated = replace(current_limits(), **changes)
    with _lock:
        _current = updated
    return updated


def limit_error(what: str, limit: str, value: int, actual: str) -> ConfigError:
    """The one shape of a refusal for a limit: names the limit, its value and what was seen."""
    return ConfigError(
        f"{what} {actual}, over the limit {limit}={value}",
        f"keep it within {limit}={value} (store large data elsewhere and enqueue a reference to it), or raise "
        f"the limit with configure_limits({limit}=...) / {_ENV[limit]}",
        code="X_LIMIT_EXCEEDED",
    )


#: The leaf types of a JSON-like value: nothing to look into.
_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})


def check_depth(value: Any, *, what: str) -> None:
    """Refuse ``value`` nested deeper than ``max_depth`` lists/objects — iteratively, level by
    level, so a hostile payload cannot exhaust the stack of the check meant to stop it (and a
    plain dict of scalars, the common input, costs one pass over its values)."""
    limit = current_limits().max_depth
    level: list[Any] = [value]
    depth = 1
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind in _SCALARS:
                continue  # before the ABC checks below, which cost more than the rest of the walk
            if kind is dict:
                children: Any = item.values()
            elif kind is list or kind is tuple:
                children = item
            elif isinstance(item, Mapping):
                children = item.values()
            elif isinstance(item, list | tuple):
                children = item
            else:
                continue
            if depth > limit:
                raise limit_error(what, "max_depth", limit, f"is nested more than {limit} levels deep")
            below.extend(children)
        level = below
        depth += 1
