"""Running what ``handle``/``count`` return when it is awaitable, from the pass's thread."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = [
    "Awaiter",
]

T = TypeVar("T")


class Awaiter:
    """Runs what ``handle``/``count`` return when it is awaitable, on one loop per pass."""

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None

    def resolve(self, value: Any) -> Any:
        if not inspect.isawaitable(value):
            return value
        if self._runner is None:
            self._runner = asyncio.Runner()
        # A fresh copy each time, so the pass's ambient context (cross-tenant scope included)
        # is what the coroutine sees.
        return self._runner.run(_wait_for(value), context=contextvars.copy_context())

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


async def _wait_for(value: Awaitable[T]) -> T:
    return await value
