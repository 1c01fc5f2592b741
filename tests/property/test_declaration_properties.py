"""Declarations with arbitrary field values: accepted, or refused at declaration with a coded
XError naming the job/backfill, and a refused declaration registers nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from ultimat3.backfill import backfill
from ultimat3.core.errors import XError
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import RetryPolicy, isolated_registry, job, registered_jobs

from .strategies import PROPERTY, assert_coded

numbers = st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.booleans()
durations = numbers | st.text(max_size=8) | st.sampled_from(["30s", "250ms", "2m", "1.5h", "0s", "-1s", " 5 s "]) \
    | st.timedeltas(min_value=timedelta(days=-3), max_value=timedelta(days=3)) | st.none()
names = st.text(max_size=20) | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:\-/]{0,30}", fullmatch=True)
anything = st.none() | numbers | st.text(max_size=5) | st.lists(st.integers(), max_size=2)

#: Declarations touch no database: afford many more examples.
DECLARATIONS = settings(PROPERTY, max_examples=300)

items = sa.Table("prop_items", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))


def _noop(input: Any, ctx: Any, step: Any) -> None:
    """Never run."""


@DECLARATIONS
@given(max_attempts=numbers | anything, base=numbers, factor=numbers, cap=numbers, jitter=numbers)
def test_retry_policies_are_valid_or_refused_coded(max_attempts: Any, base: Any, factor: Any, cap: Any,
                                                    jitter: Any) -> None:
    try:
        policy = RetryPolicy(max_attempts=max_attempts, base=base, factor=factor, cap=cap, jitter=jitter)
    except Exception as error:
        assert_coded(error)
        assert error.code == "X_RETRY_POLICY"  # type: ignore[attr-defined]
        return
    # An accepted policy always yields a usable delay.
    for attempt in (1, 2, 50, 10_000):
        for rand in (0.0, 0.5, 1.0):
            delay = policy.delay(attempt, lambda rand=rand: rand)
            assert 0.0 <= delay <= policy.cap


@DECLARATIONS
@given(name=names, queue=names, timeout=durations, priority=anything, max_attempts=st.integers(-2, 5))
def test_job_declarations_are_accepted_or_refused_coded(name: str, queue: str, timeout: Any, priority: Any,
                                                         max_attempts: int) -> None:
    with isolated_registry():
        try:
            retry = RetryPolicy(max_attempts=max_attempts)
            handle = job(name=name, tenant="none", queue=queue, timeout=timeout, retry=retry,
                         priority=priority)(_noop)
        except Exception as error:
            assert_coded(error)
            assert registered_jobs() == [], "a refused declaration was registered"
            return
        assert registered_jobs() == [handle]
        assert (handle.name, handle.queue) == (name, queue)
        assert handle.timeout is None or handle.timeout > 0
    # What the declaration let through, enqueue either takes or refuses, coded and unwritten.
    driver = MemoryDriver()
    try:
        result = handle.enqueue(driver=driver)
    except Exception as error:
        assert_coded(error)
        assert driver.introspect.list() == []
        return
    row = driver.introspect.get(result.id)
    assert row is not None and (row.name, row.queue, row.max_attempts) == (name, queue, max_attempts)


@DECLARATIONS
@given(name=names, batch=anything, rate=anything, timeout=durations)
def test_backfill_declarations_are_accepted_or_refused_coded(name: str, batch: Any, rate: Any, timeout: Any) -> None:
    with isolated_registry():
        try:
            handle = backfill(
                engine="job-store", name=name, tenant="none", source=lambda ctx: sa.select(items),
                handle=lambda b: None, batch=batch, rate=rate, timeout=timeout)
        except Exception as error:
            assert_coded(error)
            assert registered_jobs() == [], "a refused backfill was registered"
            if isinstance(error, XError) and error.code in ("X_BACKFILL_BATCH", "X_BACKFILL_RATE"):
                assert name in error.message, "the refusal names the backfill"
                assert error.hint
            return
        assert registered_jobs() == [handle]
        assert isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1
        assert not isinstance(rate, bool) and float(rate) > 0 and float(rate) != float("inf")
