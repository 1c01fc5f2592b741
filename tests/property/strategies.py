"""Strategies and settings the property tests share, and the checks every property makes."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver

#: Modest: every property runs on three drivers and the suite must stay fast. deadline=None: a
#: database round trip is not a performance bug. No example database: nothing written to the tree.
PROPERTY = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: Strings that break naive quoting, formatting or storage, tried as every kind of identifier.
NASTY = [
    "'; DROP TABLE x_jobs; --",
    "Robert'); DROP TABLE x_job_steps;--",
    "' OR '1'='1",
    '"',
    '"; DROP TABLE "x_jobs',
    "\\",
    "\\'",
    "%s",
    "%(id)s",
    "$1",
    "?",
    ":name",
    "{}",
    "{0}",
    "\x00",
    "a\x00b",
    "\ud800",  # a lone surrogate: not encodable as UTF-8
    "\udcff",  # what a non-UTF-8 byte in argv decodes to (surrogateescape)
    "\u202e\ufeff",
    "ñ漢字🙂",
    "x" * 300,
    "",
    " ",
]

#: Text with NUL bytes and control characters (hypothesis includes them), bounded.
texts = st.text(max_size=12)
#: Text that can reach a process through argv: no NUL, but a non-UTF-8 byte arrives as a surrogate
#: escape (``x jobs show $'\xff'`` puts "\udcff" in sys.argv). The hostile strings come up often.
argv_texts = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
    st.sampled_from([value for value in NASTY if "\x00" not in value and "\ud800" not in value]),
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats()  # NaN and infinities included: they must be refused, coded
    | texts
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
payloads = st.dictionaries(texts, json_values, max_size=5)


def total_jobs(driver: JobDriver) -> int:
    """Rows in the job table, whatever their state."""
    return sum(sum(queue.counts.values()) for queue in driver.introspect.stats())


def assert_coded(error: BaseException) -> None:
    """A refusal must be an XError with an ``X_`` code; anything else is a bug report."""
    assert isinstance(error, XError), f"uncoded {type(error).__module__}.{type(error).__name__}: {error}"
    assert error.code.startswith("X_"), error.code


def same_json(a: Any, b: Any) -> bool:
    """JSON equality as a jsonb column keeps it: numbers by value (1e16 may come back as an int),
    -0.0 equal to 0.0, bools never equal to numbers, dict key order irrelevant."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if isinstance(a, float) or isinstance(b, float):
            return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=0.0) or float(a) == float(b)
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
