"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ultimat3.core import Ctx
from ultimat3.tenancy import operator_context


@pytest.fixture(autouse=True)
def operator() -> Iterator[Ctx]:
    """Each test acts as an operator by default, as the x CLI does: it may enqueue work for any
    org. Tests of who may enqueue what install their own context (``use_ctx``) over this one."""
    with operator_context("test-suite", "tests enqueue as an operator unless they say otherwise") as ctx:
        yield ctx
