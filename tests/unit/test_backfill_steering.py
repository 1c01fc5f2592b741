"""The parts of steering a pass that need no database: health declarations and their refusals,
what a reading says, the throttle's sampling and backoff on the injectable clock, ``batch.fail``'s
refusals, and the retry-pass input."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Row

from ultimat3.backfill import BackfillInput, BackfillReport, Batch, backfill, health
from ultimat3.backfill.definition import BackfillError
from ultimat3.backfill.health import DEFAULT_HEALTH, Health
from ultimat3.backfill.pacer import Pacer
from ultimat3.backfill.throttle import Reading, Throttle
from ultimat3.core import ManualClock, XError
from ultimat3.core.context import Ctx
from ultimat3.jobs import AbortSignal, JobAbortedError, isolated_registry

items = sa.Table("items", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))


@pytest.fixture(autouse=True)
def registry() -> Iterator[None]:
    with isolated_registry():
        yield


def declare(**fields: Any) -> Any:
    spec: dict[str, Any] = {"name": "unit.control", "tenant": "none", "source": lambda ctx: sa.select(items),
                            "handle": lambda batch: None, "engine": "job-store"}
    spec.update(fields)
    return backfill(**spec)


# -- declarations -----------------------------------------------------------------------------------

def test_health_is_on_by_default_with_its_defaults() -> None:
    from ultimat3.backfill import backfill_origin

    definition = backfill_origin(declare())
    assert definition is not None and definition.health == DEFAULT_HEALTH
    assert (DEFAULT_HEALTH.max_transaction_age, DEFAULT_HEALTH.max_lock_waiters, DEFAULT_HEALTH.max_replica_lag) == (
        120.0, 0, 10.0)


def test_health_limits_are_written_as_durations() -> None:
    limits = health(max_transaction_age="90s", max_lock_waiters=3, max_replica_lag="1m", every="250ms",
                    max_backoff=5)
    assert limits == Health(90.0, 3, 60.0, 0.25, 5.0)


@pytest.mark.parametrize("limits", [
    Health(max_transaction_age=0), Health(max_replica_lag=-1), Health(every=float("nan")),
    Health(max_lock_waiters=-1), Health(max_lock_waiters=True), Health(every=10, max_backoff=1),
])
def test_bad_health_limits_are_refused_naming_the_backfill(limits: Health) -> None:
    with pytest.raises(XError) as refused:
        declare(health=limits)
    assert refused.value.code == "X_BACKFILL_HEALTH"
    assert '"unit.control"' in str(refused.value) and "health=None" in (refused.value.hint or "")


def test_a_health_that_is_not_a_declaration_is_refused() -> None:
    with pytest.raises(XError) as refused:
        declare(health={"max_transaction_age": 5})
    assert refused.value.code == "X_BACKFILL_HEALTH"
    with pytest.raises(XError) as unit:
        health(max_transaction_age="5 minutes")
    assert unit.value.code == "X_DURATION"


def test_transactional_must_be_a_bool() -> None:
    with pytest.raises(XError) as refused:
        declare(transactional="yes")
    assert refused.value.code == "X_BACKFILL_TRANSACTIONAL" and '"unit.control"' in str(refused.value)


def test_the_retry_pass_input_and_report_round_trip() -> None:
    assert BackfillInput.model_validate({"retry_failed": True}).retry_failed
    report = BackfillReport("n", 2, 10, failures=3, kind="retry")
    assert BackfillReport.from_dict(report.to_dict()) == report
    # A result written before these fields existed still reads.
    assert BackfillReport.from_dict({"name": "n", "batches": 1, "rows": 1}).kind == "pass"


# -- readings and the throttle -------------------------------------------------------------------

def test_a_reading_names_every_limit_it_exceeds() -> None:
    limits = Health(max_transaction_age=60, max_lock_waiters=0, max_replica_lag=5)
    assert Reading(59.0, 0, 4.9).reason(limits) is None
    assert Reading(75.4, 0, 0.0).reason(limits) == "a transaction has been open 75 s (limit 60 s)"
    both = Reading(0.0, 2, 12.25).reason(limits)
    assert both == ("2 session(s) wait for a lock on the swept table (limit 0); "
                    "replica replay lag is 12.2 s (limit 5 s)")


class Sampled(Throttle):
    """A throttle whose database answers from a script; the pacer sleeps on a ManualClock."""

    def __init__(self, readings: list[Reading], clock: ManualClock, limits: Health) -> None:
        self.slept: list[float] = []

        def sleep(seconds: float, signal: AbortSignal) -> None:
            self.slept.append(seconds)
            clock.advance(seconds)

        pacer = Pacer(1000, "unit.control", clock=clock, sleep=sleep)
        super().__init__(None, limits, None, [], pacer)  # type: ignore[arg-type]
        self.readings = readings
        self.samples = 0

    def sample(self) -> Reading:
        self.samples += 1
        return self.readings.pop(0)


def recorder(reports: list[str | None]) -> Callable[[str | None], bool]:
    """A report callback that keeps what it was told and never asks for a pause."""

    def report(reason: str | None) -> bool:
        reports.append(reason)
        return False

    return report


def test_the_throttle_samples_at_most_every_interval_while_healthy(clock: ManualClock) -> None:
    throttle = Sampled([Reading(0, 0, 0)] * 3, clock, Health(every=1.0))
    reports: list[str | None] = []
    signal = AbortSignal("unit")
    assert throttle.hold(signal, recorder(reports)) is False
    clock.advance(0.5)
    assert throttle.hold(signal, recorder(reports)) is False
    assert throttle.samples == 1
    clock.advance(0.6)
    throttle.hold(signal, recorder(reports))
    assert throttle.samples == 2 and reports == []  # healthy: nothing to report


def test_a_tripped_throttle_waits_with_backoff_and_clears_its_reason(clock: ManualClock) -> None:
    limits = Health(max_transaction_age=60, every=1.0, max_backoff=4.0)
    old = Reading(100, 0, 0)
    throttle = Sampled([old, old, old, old, old, Reading(0, 0, 0)], clock, limits)
    reports: list[str | None] = []
    assert throttle.hold(AbortSignal("unit"), recorder(reports)) is False
    assert throttle.slept == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert reports[:5] == ["a transaction has been open 100 s (limit 60 s)"] * 5 and reports[5] is None


def test_a_pause_asked_while_held_is_answered_at_once(clock: ManualClock) -> None:
    old = Reading(100, 0, 0)
    throttle = Sampled([old, old], clock, Health(max_transaction_age=60))
    answers = iter([False, True])
    assert throttle.hold(AbortSignal("unit"), lambda r: next(answers)) is True
    assert throttle.slept == [1.0]


def test_an_abort_ends_the_wait(clock: ManualClock) -> None:
    signal = AbortSignal("unit")
    throttle = Sampled([Reading(100, 0, 0)], clock, Health(max_transaction_age=60))
    def cancel(reason: str | None) -> bool:
        signal.abort("cancelled")
        return False

    with pytest.raises(JobAbortedError):
        throttle.hold(signal, cancel)


# -- batch.fail ---------------------------------------------------------------------------------------

def _batch(rows: list[Row[Any]]) -> Batch:
    return Batch(rows, Ctx(), AbortSignal("unit"), 4, None, "unit.control", 0)


def _rows(*ids: int) -> list[Row[Any]]:
    engine = sa.create_engine("sqlite://")
    try:
        items.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(items.insert(), [{"id": i} for i in ids])
            return list(conn.execute(sa.select(items)).all())
    finally:
        engine.dispose()


def test_fail_takes_a_row_or_its_key_and_keeps_the_last_reason() -> None:
    rows = _rows(1, 2, 3)
    batch = _batch(rows)
    batch.fail(rows[0], "first")
    batch.fail(3, "third")
    batch.fail(1, "first, again")
    assert batch.failed == {1: "first, again", 3: "third"}


@pytest.mark.parametrize(("key", "reason"), [(99, "not here"), (1, ""), (1, "   "), ([1], "unhashable")])
def test_fail_refuses_a_row_of_another_batch_and_an_empty_reason(key: Any, reason: Any) -> None:
    batch = _batch(_rows(1, 2))
    with pytest.raises(BackfillError) as refused:
        batch.fail(key, reason)
    assert refused.value.code == "X_BACKFILL_FAIL" and "unit.control" in str(refused.value)
    assert batch.failed == {}
