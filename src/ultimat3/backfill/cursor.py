"""A pass's cursor as its checkpoint stores it: the last key of a batch, kept as the value the
database returned and written to the step record so that reading it back gives that value again.

A JSON checkpoint turns a UUID or a datetime into a string. Compared with the key column as a
string, such a cursor pages wrongly: SQLite stores a SQLAlchemy ``Uuid`` as 32 hex digits and a
``DateTime`` as ``YYYY-MM-DD HH:MM:SS``, neither of which ``str()`` or ``isoformat()`` writes; so a
resumed pass would skip rows or hand them out twice. So the step records the key's type beside it
(``{"cursor": ..., "cursor_type": "uuid"}``; int and str keys need none) and a replay turns it back.
A key of any other type is refused when the first batch is recorded, naming the backfill.
"""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from ultimat3.backfill.definition import BackfillError

__all__ = ["decode_cursor", "decode_failure_key", "encode_cursor", "failure_key"]


def encode_cursor(value: Any, *, backfill: str) -> dict[str, Any]:
    """The checkpoint fields for key ``value``: ``cursor`` (JSON) and, unless it is an int or a
    str, ``cursor_type``."""
    if isinstance(value, bool):
        pass  # a bool is an int to Python, never a sensible key
    elif isinstance(value, int | str):
        return {"cursor": value}
    elif isinstance(value, uuid.UUID):
        return {"cursor": str(value), "cursor_type": "uuid"}
    elif isinstance(value, datetime):
        return {"cursor": value.isoformat(), "cursor_type": "datetime"}
    elif isinstance(value, date):
        return {"cursor": value.isoformat(), "cursor_type": "date"}
    elif isinstance(value, Decimal):
        return {"cursor": str(value), "cursor_type": "decimal"}
    raise BackfillError(
        f'backfill "{backfill}" pages by a key of type {type(value).__name__} ({value!r}), which its '
        "checkpoint cannot store and read back exactly",
        "page by an integer, text, UUID, date, datetime or numeric key (key= on backfill(...))",
        code="X_BACKFILL_KEY_TYPE",
    )


def decode_cursor(checkpoint: dict[str, Any]) -> Any:
    """The key value a checkpoint recorded, as the page query compares it."""
    value = checkpoint["cursor"]
    kind = checkpoint.get("cursor_type")
    if kind is None:
        return value
    if kind == "uuid":
        return uuid.UUID(value)
    if kind == "datetime":
        return datetime.fromisoformat(value)
    if kind == "date":
        return date.fromisoformat(value)
    if kind == "decimal":
        return Decimal(value)
    raise BackfillError(f"a recorded batch holds a cursor of unknown type {kind!r}",
                        "this checkpoint was written by a newer ultimat3: run the pass with that version",
                        code="X_BACKFILL_KEY_TYPE")


def failure_key(value: Any, *, backfill: str) -> str:
    """A row key's text in ``x_backfill_failures``: its checkpoint encoding as canonical JSON, so
    one row always has one text and reading it back gives the typed key."""
    return json.dumps(encode_cursor(value, backfill=backfill), sort_keys=True, separators=(",", ":"))


def decode_failure_key(text: str) -> Any:
    """The typed key a :func:`failure_key` text stands for."""
    return decode_cursor(json.loads(text))
