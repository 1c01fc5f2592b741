"""One reading of a :class:`~ultimat3.drivers.protocol.JobFilter` for every driver.

The SQL drivers bind the same named parameters into one static ``WHERE`` (``_job_where`` in each
``queries.sql``); the memory driver asks :func:`matches`. A name pattern's ``*`` becomes each
dialect's wildcard with every other character escaped, so ``billing_%`` matches only itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ultimat3.core.clock import to_datetime
from ultimat3.core.errors import ConfigError
from ultimat3.drivers.protocol import JobFilter, JobState
from ultimat3.drivers.values import filter_is_storable, text_problem

__all__ = ["FilterParams", "error_code", "filter_params", "matches", "name_matches", "storable_filter",
           "validate_filter"]

#: A leading ``X_CODE:`` in an error's first line (after an exception type, if any).
_CODE = re.compile(r"^(?:[A-Za-z_][\w.]*: )?(X_[A-Z0-9_]+):")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Cancelled|Warning)):")


def error_code(message: str) -> str | None:
    """The code of an error's first line: its ``X_...`` code, else its exception type, else ``None``."""
    found = _CODE.match(message)
    if found is not None:
        return found.group(1)
    found = _EXCEPTION.match(message)
    return None if found is None else found.group(1)


def validate_filter(flt: JobFilter) -> None:
    """Refuse a filter no driver could apply (coded ``X_FILTER_VALUE``, naming the field)."""
    fields: list[tuple[str, str | None]] = [("queue", flt.queue), ("name", flt.name),
                                            ("tenant", flt.tenant_id), ("error", flt.error)]
    fields += [("ids", job_id) for job_id in flt.ids or ()]
    for field, value in fields:
        if value is None:
            continue
        problem = "is not text" if not isinstance(value, str) else text_problem(value)
        if problem is None and value == "":
            problem = "is empty"
        if problem is not None:
            raise ConfigError(f"filter {field}={value!r} {problem}",
                              f"give {field} as plain, non-empty text (no NUL or unpaired surrogates)",
                              code="X_FILTER_VALUE")
    for field, when in (("since", flt.since), ("until", flt.until)):
        if when is None:
            continue
        try:
            to_datetime(when)
        except (OverflowError, OSError, ValueError, TypeError) as error:
            raise ConfigError(f"filter {field}={when!r} is not a time a row can hold",
                              "give a time within years 1970..9999", code="X_FILTER_VALUE") from error


@dataclass(frozen=True)
class FilterParams:
    """The filter as bind parameters: ``name`` when exact, ``name_like`` (LIKE, ``\\`` escapes) or
    ``name_glob`` (SQLite GLOB) when it holds a ``*``; ``states`` as a list."""

    queue: str | None
    name: str | None
    name_like: str | None
    name_glob: str | None
    states: list[str] | None
    tenant_id: str | None
    error: str | None
    since: float | None
    until: float | None
    ids: list[str] | None

    def bind(self) -> dict[str, object]:
        """The parameters by name."""
        return dict(self.__dict__)


def _like(pattern: str) -> str:
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")


def _glob(pattern: str) -> str:
    # GLOB has no escape character: a special character stands for itself inside brackets.
    out = []
    for char in pattern:
        out.append("*" if char == "*" else f"[{char}]" if char in "?[" else char)
    return "".join(out)


def filter_params(flt: JobFilter, states: Iterable[JobState] | None = None) -> FilterParams:
    """``flt`` as bind parameters; ``states`` (when given) replaces ``flt.state``."""
    chosen = list(states) if states is not None else ([flt.state] if flt.state is not None else None)
    pattern = flt.name is not None and "*" in flt.name
    return FilterParams(
        queue=flt.queue,
        name=None if pattern else flt.name,
        name_like=_like(flt.name) if pattern and flt.name is not None else None,
        name_glob=_glob(flt.name) if pattern and flt.name is not None else None,
        states=sorted(chosen) if chosen is not None else None,
        tenant_id=flt.tenant_id,
        error=flt.error,
        since=flt.since,
        until=flt.until,
        ids=list(flt.ids) if flt.ids is not None else None,
    )


def storable_filter(flt: JobFilter) -> bool:
    """Whether every text of ``flt`` could match a stored row (else nothing matches it)."""
    return filter_is_storable(flt.queue, flt.name, flt.tenant_id, flt.error, *(flt.ids or ()))


def name_matches(pattern: str | None, name: str) -> bool:
    """Whether ``name`` matches the filter's exact name or ``*`` pattern."""
    if pattern is None:
        return True
    if "*" not in pattern:
        return name == pattern
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, name, flags=re.DOTALL) is not None


def matches(flt: JobFilter, *, queue: str, name: str, state: str, tenant_id: str | None,
            last_error: str | None, updated_at: float, job_id: str,
            states: Iterable[JobState] | None = None) -> bool:
    """Whether a row with these values matches ``flt`` (``states`` replacing ``flt.state``)."""
    allowed = set(states) if states is not None else ({flt.state} if flt.state is not None else None)
    return (
        (flt.queue is None or queue == flt.queue)
        and name_matches(flt.name, name)
        and (allowed is None or state in allowed)
        and (flt.tenant_id is None or tenant_id == flt.tenant_id)
        and (flt.error is None or (last_error is not None and flt.error in last_error))
        and (flt.since is None or updated_at >= flt.since)
        and (flt.until is None or updated_at < flt.until)
        and (flt.ids is None or job_id in flt.ids)
    )
