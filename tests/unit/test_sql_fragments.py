"""The query files' fragments: ``{{_name}}`` expands at load time, inside other fragments too."""

from __future__ import annotations

import pytest

from ultimat3.drivers.sql import parse_queries


def test_a_fragment_may_use_another_fragment() -> None:
    queries = parse_queries(
        "-- name: _columns\nid, name\n\n"
        "-- name: _returning\nRETURNING {{_columns}}, 1 AS head\n\n"
        "-- name: claim\nUPDATE t SET x = 1 {{_returning}}\n"
    )
    assert queries == {"claim": "UPDATE t SET x = 1 RETURNING id, name, 1 AS head"}


def test_a_fragment_that_uses_itself_is_refused_with_its_path() -> None:
    with pytest.raises(ValueError, match=r"fragment '_a' in queries.sql uses itself \(_a -> _b -> _a\)"):
        parse_queries("-- name: _a\n{{_b}}\n\n-- name: _b\n{{_a}}\n\n-- name: q\nSELECT {{_a}}\n")


def test_an_undefined_fragment_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"fragment '_missing' is used in queries.sql but not defined"):
        parse_queries("-- name: _a\n{{_missing}}\n\n-- name: q\nSELECT {{_a}}\n")
