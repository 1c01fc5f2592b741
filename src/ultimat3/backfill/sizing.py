"""Time-target batch sizing: ``batch=adaptive(target="500ms", min=100, max=10_000)``.

A fixed batch is either too small for a cheap table (a statement and a checkpoint per handful of
rows) or too big for an expensive one (a transaction that holds locks for seconds). An adaptive
pass measures each batch (page read, handler, checkpoint) and sizes the next one so it takes about
``target``: the rows the last batch handled per second times the target, moved at most 2x up or
down from the current size per batch (one slow batch must not collapse the size, nor one fast
batch make the next one huge), and held within ``[min, max]``. It starts at ``min``: a pass learns
the table's cost from small batches before it takes big ones. Only the page size changes; the
cursor, the checkpoints and the pacer's ``rate`` (batches per second) are as for a fixed batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ultimat3.core.errors import check
from ultimat3.jobs.duration import DurationInput, parse_duration

__all__ = ["Adaptive", "BatchSizer", "adaptive"]

#: The most one batch may grow or shrink the next one's size.
MAX_STEP = 2.0


@dataclass(frozen=True)
class Adaptive:
    """A declared time-target batch size (see the module docstring); build it with :func:`adaptive`."""

    target: float
    min: int
    max: int

    def validated(self, backfill: str) -> Adaptive:
        """Itself, or a coded error naming ``backfill`` (``X_BACKFILL_BATCH``)."""
        hint = f'write batch=adaptive(target="500ms", min=100, max=10_000) on backfill(name="{backfill}")'
        for label, value in (("min", self.min), ("max", self.max)):
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                  f'backfill "{backfill}" declares adaptive({label}={value!r}) — a whole number of rows, at least 1',
                  hint, code="X_BACKFILL_BATCH")
        check(self.min <= self.max,
              f'backfill "{backfill}" declares adaptive(min={self.min}, max={self.max}) — min is above max',
              hint, code="X_BACKFILL_BATCH")
        check(math.isfinite(self.target) and self.target > 0,
              f'backfill "{backfill}" declares adaptive(target={self.target!r}) — the target is a positive duration',
              hint, code="X_BACKFILL_BATCH")
        return self


def adaptive(target: DurationInput = "500ms", *, min: int = 100, max: int = 10_000) -> Adaptive:
    """A batch size that follows measured batch durations toward ``target`` (``"500ms"``, ``2``,
    a timedelta), within ``[min, max]`` rows. Checked by ``backfill()``, which names itself."""
    return Adaptive(parse_duration(target, what="adaptive(target=...)"), min, max)


class BatchSizer:
    """The page size of one pass: fixed, or following an :class:`Adaptive` declaration."""

    def __init__(self, batch: int | Adaptive) -> None:
        self._adaptive = batch if isinstance(batch, Adaptive) else None
        self._size = batch.min if isinstance(batch, Adaptive) else batch

    @property
    def size(self) -> int:
        """Rows the next page may hold."""
        return self._size

    def observe(self, rows: int, seconds: float) -> None:
        """A batch of ``rows`` took ``seconds`` (page read, handler and checkpoint)."""
        spec = self._adaptive
        if spec is None or rows <= 0:
            return
        # Too fast to measure: grow as fast as allowed.
        ideal = self._size * MAX_STEP if seconds <= 0 else rows / seconds * spec.target
        bounded = min(self._size * MAX_STEP, max(self._size / MAX_STEP, ideal))
        self._size = int(min(spec.max, max(spec.min, round(bounded))))
