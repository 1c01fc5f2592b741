"""The step store: JSON results per (run, name), first write wins, fenced by the claim."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver, StepRecord

from .helpers import at, claim_one, enqueue_and_claim, retry_later


def test_record_then_load(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    clock.advance(2)
    assert driver.steps.record(claimed.job.id, claimed.claim_token, "fetch", {"rows": 3}) is True

    steps = driver.steps.load(claimed.job.run_id)
    assert steps == {
        "fetch": StepRecord(run_id=claimed.job.run_id, name="fetch", result={"rows": 3}, created_at=at(clock.now()))
    }


def test_first_write_wins(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.steps.record(claimed.job.id, claimed.claim_token, "pick", "first")
    first = driver.steps.load(claimed.job.run_id)["pick"]
    clock.advance(5)
    # A replay is not an error, and it does not rewrite what was recorded.
    assert driver.steps.record(claimed.job.id, claimed.claim_token, "pick", "second") is True
    assert driver.steps.load(claimed.job.run_id)["pick"] == first
    assert first.result == "first"


@pytest.mark.parametrize(
    "result",
    [
        None,
        0,
        -1.5,
        True,
        "naïve ✓",
        [],
        {},
        [1, "two", None, {"three": [3.0]}],
        {"nested": {"deep": {"list": [{"k": "ü"}], "flag": False}}, "n": 12345678901234567},
    ],
    ids=["null", "zero", "float", "bool", "unicode", "empty-list", "empty-dict", "list", "nested"],
)
def test_step_results_round_trip_as_json(driver: JobDriver, result: Any) -> None:
    claimed = enqueue_and_claim(driver)
    assert driver.steps.record(claimed.job.id, claimed.claim_token, "s", result)
    assert driver.steps.load(claimed.job.run_id)["s"].result == result


@pytest.mark.parametrize(
    "result", [object(), {1, 2}, b"bytes", math.nan, math.inf], ids=["object", "set", "bytes", "nan", "inf"]
)
def test_non_json_result_is_refused(driver: JobDriver, result: Any) -> None:
    claimed = enqueue_and_claim(driver)
    with pytest.raises(XError) as caught:
        driver.steps.record(claimed.job.id, claimed.claim_token, "bad", result)
    assert caught.value.code == "X_STEP_RESULT"
    assert "JSON" in caught.value.hint
    assert driver.steps.load(claimed.job.run_id) == {}
    # The refusal does not cost the claim: the attempt can still record and settle.
    assert driver.steps.record(claimed.job.id, claimed.claim_token, "good", 1)
    assert driver.ack(claimed.job.id, claimed.claim_token)


def test_load_of_an_unknown_run_is_empty(driver: JobDriver) -> None:
    assert driver.steps.load("00000000-0000-4000-8000-000000000000") == {}


def test_steps_belong_to_their_own_run(driver: JobDriver) -> None:
    first = enqueue_and_claim(driver)
    second = enqueue_and_claim(driver)
    assert driver.steps.record(first.job.id, first.claim_token, "s", 1)
    assert driver.steps.record(second.job.id, second.claim_token, "s", 2)
    assert driver.steps.load(first.job.run_id)["s"].result == 1
    assert driver.steps.load(second.job.run_id)["s"].result == 2


def test_steps_survive_into_the_next_attempt(driver: JobDriver) -> None:
    first = enqueue_and_claim(driver)
    assert driver.steps.record(first.job.id, first.claim_token, "a", "from attempt 1")
    assert driver.nack(first.job.id, first.claim_token, retry_later())

    second = claim_one(driver)
    assert second.job.run_id == first.job.run_id
    assert driver.steps.record(second.job.id, second.claim_token, "a", "replayed")
    assert driver.steps.record(second.job.id, second.claim_token, "b", "from attempt 2")
    steps = driver.steps.load(first.job.run_id)
    assert {name: step.result for name, step in steps.items()} == {"a": "from attempt 1", "b": "from attempt 2"}
