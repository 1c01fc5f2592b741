"""Progress events: every batch of every pass in this process, for progress bars and metrics."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ultimat3.backfill.definition import BackfillProgress

__all__ = [
    "ProgressListener",
    "add_progress_listener",
    "emit",
]

log = logging.getLogger("ultimat3.backfill")

ProgressListener = Callable[[BackfillProgress], None]
_listeners: list[ProgressListener] = []
_listeners_lock = threading.Lock()


def add_progress_listener(listener: ProgressListener) -> Callable[[], None]:
    """Call ``listener`` after every batch of every pass in this process; returns a remover.

    Called from the pass's worker thread. A listener that raises is logged and ignored.
    """
    with _listeners_lock:
        _listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


def emit(progress: BackfillProgress) -> None:
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(progress)
        except Exception:
            # A progress bar that breaks must not fail the pass it is drawing.
            log.exception("backfill progress listener failed")
