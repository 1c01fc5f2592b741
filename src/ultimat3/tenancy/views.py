"""Which names in a database are views: the guard refuses a view not declared tenanted.

A view hides the table it reads, so a select over an undeclared view could return every org's
rows while looking like a select over a harmless table. Looked up once per engine and schema,
and again after :data:`VIEW_CACHE_SECONDS` so a view created by a later migration is seen.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref

from sqlalchemy import inspect
from sqlalchemy.engine import Connection, Engine

__all__ = ["VIEW_CACHE_SECONDS", "is_view"]

#: How long one engine's list of views is trusted before it is read again.
VIEW_CACHE_SECONDS = 60.0

_cache: weakref.WeakKeyDictionary[Engine, dict[str | None, tuple[float, frozenset[str]]]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def _read(bind: Engine | Connection, schema: str | None) -> frozenset[str]:
    inspector = inspect(bind)
    names = set(inspector.get_view_names(schema=schema))
    with contextlib.suppress(NotImplementedError):  # SQLite has no materialized views
        names.update(inspector.get_materialized_view_names(schema=schema))
    return frozenset(names)


def is_view(bind: Engine | Connection, schema: str | None, name: str) -> bool:
    """Whether ``schema.name`` is a view (or materialized view) in the database ``bind`` reaches."""
    engine = bind.engine if isinstance(bind, Connection) else bind
    now = time.monotonic()
    with _lock:
        per_schema = _cache.setdefault(engine, {})
        cached = per_schema.get(schema)
    if cached is None or now - cached[0] > VIEW_CACHE_SECONDS:
        names = _read(bind, schema)
        with _lock:
            per_schema[schema] = (now, names)
    else:
        names = cached[1]
    return name in names
