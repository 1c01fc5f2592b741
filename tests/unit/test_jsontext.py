"""The strict compact encoder built once: the same text as json.dumps with the same options."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from ultimat3.core.jsontext import strict_encoder


@pytest.mark.parametrize("value", [
    {"i": 1, "t": 0.5, "s": "é👋\"\\/\n", "n": None, "b": [True, False], "nested": {"x": [1, (2, 3)]}},
    {1: "int key", 2.5: "float key", None: "none key"},
    "a bare string", 12, -0.0, 1e300, [], {},
])
def test_it_writes_what_json_dumps_writes_with_the_same_options(value: Any) -> None:
    assert strict_encoder()(value) == json.dumps(value, allow_nan=False, separators=(",", ":"))


@pytest.mark.parametrize("value", [float("nan"), {"x": [float("inf")]}, -float("inf")])
def test_it_refuses_nan_and_infinity(value: Any) -> None:
    with pytest.raises(ValueError):
        strict_encoder()(value)


def test_what_json_has_no_type_for_goes_to_default_or_is_refused() -> None:
    assert strict_encoder(default=sorted)({"s": {3, 1}}) == '{"s":[1,3]}'
    with pytest.raises(TypeError, match="set"):
        strict_encoder()({"s": {1}})


def test_a_cycle_ends_in_recursion_error_not_a_hang() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(RecursionError):
        strict_encoder()(loop)


def test_one_encoder_serves_threads_at_once() -> None:
    encode = strict_encoder()
    values = [{"thread": n, "items": list(range(n, n + 50))} for n in range(8)]
    wrong: list[int] = []

    def run(n: int) -> None:
        for _ in range(2_000):
            if encode(values[n]) != json.dumps(values[n], separators=(",", ":")):
                wrong.append(n)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
