"""The abort signal an attempt's handler can watch: set on cancel, timeout, lost claim or shutdown."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from ultimat3.jobs.errors import JobAbortedError


class AbortSignal:
    """Thread-safe, awaitable "stop now" flag, shared by the worker and one attempt.

    Sync handlers poll :attr:`aborted` or block in :meth:`wait`; async handlers ``await``
    :meth:`wait_async` or race it against their own work.
    """

    def __init__(self, job: str = "job") -> None:
        # The threading.Event only a blocking wait() needs is made by the first one: an attempt
        # whose handler never blocks on its signal (most of them) pays for a flag and a lock.
        self._set = False
        self._event: threading.Event | None = None
        self._reason: str | None = None
        self._job = job
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @property
    def aborted(self) -> bool:
        """Whether the attempt must stop."""
        return self._set

    @property
    def reason(self) -> str | None:
        """Why (``cancelled``, ``timeout``, ``claim lost``, ``shutdown``), once aborted."""
        return self._reason

    def abort(self, reason: str) -> None:
        """Set the signal (first reason wins) and wake every waiter."""
        with self._lock:
            if self._set:
                return
            self._reason = reason
            self._set = True
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_abort(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from whichever thread aborts) once the signal is set."""
        with self._lock:
            if not self._set:
                self._callbacks.append(callback)
                return
        callback()

    def raise_if_aborted(self, step: str | None = None) -> None:
        """Raise :class:`JobAbortedError` when set."""
        if self._set:
            raise JobAbortedError(self._job, self._reason or "aborted", step)

    def wait(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds; True when aborted."""
        with self._lock:
            if self._event is None:
                self._event = threading.Event()
                if self._set:
                    self._event.set()
            event = self._event
        return event.wait(timeout)

    async def wait_async(self) -> None:
        """Return once the signal is set."""
        if self._set:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not future.done():
                future.set_result(None)

        def wake() -> None:
            loop.call_soon_threadsafe(resolve)

        self.on_abort(wake)
        await future
