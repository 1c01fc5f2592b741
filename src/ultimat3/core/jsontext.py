"""Strict, compact JSON text from one encoder built once, not one per call.

``json.dumps`` with any option other than its defaults builds a fresh ``JSONEncoder`` (and its C
encoder) on every call: ~2.5 us of a 4 us dump of a small payload, paid twice per enqueued job
(the NaN check and the stored text) and once per job result. :func:`strict_encoder` builds the
C encoder once. It is the standard library's own (``json.encoder.c_make_encoder``), so the text
is byte for byte what ``json.dumps(value, allow_nan=False, separators=(",", ":"))`` writes; an
interpreter without the C accelerator gets the pure-Python ``JSONEncoder`` instead.

The encoder keeps no state between calls, so one instance serves every thread. It is built
without a circular-reference table (a table shared by threads would be a race): a cycle ends in
``RecursionError``, as nesting deeper than the interpreter allows already does, and every caller
treats both as "cannot be stored".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _encoder
from typing import Any

__all__ = ["strict_encoder"]


def _refuse(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def strict_encoder(default: Callable[[Any], Any] | None = None) -> Callable[[Any], str]:
    """A function turning a value into compact JSON text: no NaN or Infinity (``ValueError``),
    ASCII only (``\\uXXXX`` escapes), ``default`` asked for what JSON has no type for (``TypeError``
    without one), ``RecursionError`` on a cycle or on nesting too deep."""
    fallback = default or _refuse
    make = getattr(_encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has the accelerator
        slow = json.JSONEncoder(allow_nan=False, separators=(",", ":"), default=fallback, check_circular=False)
        return slow.encode
    # c_make_encoder(markers, default, encoder, indent, key_separator, item_separator, sort_keys,
    # skipkeys, allow_nan): the arguments JSONEncoder.iterencode passes for these options.
    fast = make(None, fallback, _encoder.encode_basestring_ascii, None, ":", ",", False, False, False)

    def encode(value: Any) -> str:
        if isinstance(value, str):  # as JSONEncoder.encode: a bare string is one escape
            return _encoder.encode_basestring_ascii(value)
        return "".join(fast(value, 0))

    return encode
