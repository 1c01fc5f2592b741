"""Staging a request: the ids minted in bulk and the payload's JSON checks that every driver shares."""

from __future__ import annotations

import time
import uuid

import pytest

from ultimat3.core.errors import ConfigError
from ultimat3.drivers.protocol import EnqueueRequest
from ultimat3.drivers.staging import new_ids, stage, stage_many
from ultimat3.drivers.values import strict_dumps


def test_new_ids_are_distinct_time_ordered_uuids_in_canonical_text() -> None:
    before = time.time_ns() // 1_000_000
    ids = new_ids(10_000)  # past 4,096: the millisecond steps, the order holds
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 10_000
    assert ids == sorted(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, text)
        assert before <= parsed.int >> 80 <= after + 10_000 // 4096
    assert new_ids(0) == []


def test_ids_of_a_later_millisecond_sort_after_earlier_ones() -> None:
    assert max(new_ids(3, millis=1_700_000_000_000)) < min(new_ids(3, millis=1_700_000_000_001))
    assert uuid.UUID(new_ids(1, millis=1_700_000_000_000)[0]).int >> 80 == 1_700_000_000_000


def test_stage_many_gives_every_request_its_own_two_ids_in_order() -> None:
    requests = [EnqueueRequest(name=f"n{i}", payload={"i": i}) for i in range(5)]
    staged = stage_many(requests)
    assert [job.request for job in staged] == requests
    assert [job.payload for job in staged] == [f'{{"i":{i}}}' for i in range(5)]
    assert len({job.id for job in staged} | {job.run_id for job in staged}) == 10


def test_stage_many_refuses_the_whole_batch_for_one_bad_payload() -> None:
    requests = [EnqueueRequest(name="ok", payload={}), EnqueueRequest(name="bad", payload={"x": "a\x00b"})]
    with pytest.raises(ConfigError) as caught:
        stage_many(requests)
    assert caught.value.code == "X_JOB_PAYLOAD" and '"bad"' in caught.value.message


@pytest.mark.parametrize("value, where", [
    ({"x": "a\x00b"}, "$.x"),
    ({"k\x00": 1}, "key"),
    ({"list": ["ok", "\ud800"]}, "$.list[1]"),
    ({"deep": {"\udfff": "v"}}, "key"),
])
def test_strict_dumps_names_a_nul_or_lone_surrogate_wherever_it_is(value: object, where: str) -> None:
    with pytest.raises(ValueError) as caught:
        strict_dumps(value)
    assert where in str(caught.value)


@pytest.mark.parametrize("value", [
    {"escaped": "\\u0000 written out", "also": "\\ud800"},  # backslash-u text, not the characters
    {"emoji": "👋", "accents": "é"},  # non-BMP characters escape as a surrogate pair: fine
])
def test_strict_dumps_keeps_text_that_only_looks_like_a_bad_escape(value: object) -> None:
    text = strict_dumps(value)
    assert text.isascii()
    assert stage(EnqueueRequest(name="n", payload=value)).payload == text  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["queue", "traceparent", "enqueued_by", "tenant_id", "idempotency_key"])
def test_a_batch_checks_each_distinct_text_once_and_still_refuses_a_bad_one_after_good_ones(field: str) -> None:
    # The batch's shared strings are checked once; a request whose own value differs is checked
    # in full, wherever it sits in the batch, and the whole batch is refused.
    good = [EnqueueRequest(name="n", payload={}, **{field: "fine"}) for _ in range(3)]
    bad = EnqueueRequest(name="n", payload={}, **{field: "bad\x00text"})
    for batch in ([*good, bad], [bad, *good], [good[0], bad, good[1]]):
        with pytest.raises(ConfigError) as caught:
            stage_many(batch)
        assert caught.value.code == "X_JOB_FIELD" and field in caught.value.message
    assert [job.request for job in stage_many(good)] == good


@pytest.mark.parametrize("field, good, bad, code", [
    ("priority", 1, True, "X_JOB_PRIORITY"),  # True == 1, but a bool is no priority
    ("max_attempts", 1, True, "X_JOB_FIELD"),
    ("flow_max", 2, 2.0, "X_FLOW_FIELDS"),  # 2.0 == 2, but a float is no bound
])
def test_a_batch_does_not_take_an_equal_value_of_another_type_for_one_it_checked(
        field: str, good: object, bad: object, code: str) -> None:
    # A request equal to one already checked in the batch is not checked again: equal must
    # include the type of every field, or a bool slips in behind the int it equals.
    flow = {"flow_key": "f"} if field == "flow_max" else {}
    first = EnqueueRequest(name="n", payload={}, **flow, **{field: good})  # type: ignore[arg-type]
    second = EnqueueRequest(name="n", payload={}, **flow, **{field: bad})  # type: ignore[arg-type]
    assert first == second
    with pytest.raises(ConfigError) as caught:
        stage_many([first, second])
    assert caught.value.code == code and field in caught.value.message


def test_a_batch_refuses_an_unhashable_field_by_name() -> None:
    bad = EnqueueRequest(name="n", payload={}, queue=["q"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        stage_many([EnqueueRequest(name="n", payload={}), bad])
    assert caught.value.code == "X_JOB_FIELD" and "queue" in caught.value.message


def test_a_batch_still_checks_every_payload_behind_one_shared_envelope() -> None:
    requests = [EnqueueRequest(name="n", payload={"i": i}) for i in range(3)]
    requests.append(EnqueueRequest(name="n", payload={"i": float("nan")}))
    with pytest.raises(ConfigError) as caught:
        stage_many(requests)
    assert caught.value.code == "X_JOB_PAYLOAD"
