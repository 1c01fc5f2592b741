"""Durations as users write them: seconds, a ``timedelta``, or a string like ``"250ms"``, ``"5s"`` or ``"3d"``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from ultimat3.core.errors import fail

DurationInput = float | int | timedelta | str

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def parse_duration(value: DurationInput, *, what: str) -> float:
    """Seconds for ``value``; ``what`` names the field in the error (e.g. ``'job "x" timeout'``)."""
    seconds: float
    if isinstance(value, bool):
        fail(f"{what} is {value!r}, not a duration", 'write seconds (30), a timedelta or a string like "30s"',
             code="X_DURATION")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            fail(f"{what} is {value!r}, which is not a duration",
                 'write a number with a unit: "250ms", "30s", "5m", "1h" or "2d"', code="X_DURATION")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        fail(f"{what} is {value!r}, not a duration", 'write seconds (30), a timedelta or a string like "30s"',
             code="X_DURATION")
    if not math.isfinite(seconds) or seconds < 0:
        fail(f"{what} is {value!r}; a duration is finite and not negative", 'write e.g. 30 or "30s"',
             code="X_DURATION")
    return seconds
