"""The database-health throttle a backfill sweeps under: ``health=health(...)`` on ``backfill()``.

A pace is a guess made when the backfill was written; the database's state is a fact of the
moment. Before a batch (sampled at most every ``every`` seconds) a pass over PostgreSQL asks the
database itself -- no Prometheus, no exporter -- three questions, and waits while any answer is
over its limit:

- the oldest open transaction in the database (``pg_stat_activity.xact_start``): while one is
  open, vacuum cannot remove the dead rows each batch leaves behind, so sweeping on bloats the
  table and every index the app reads;
- sessions waiting for a lock on a table the pass reads: the table is contended right now, and a
  batch's writes only lengthen the queue (between batches the pass itself holds no lock);
- replica replay lag (``pg_stat_replication``), where replicas exist: a batch's WAL adds to it,
  and reads the app sends to a replica go stale.

A tripped check holds the pass with backoff (``every`` doubling up to ``max_backoff``); the reason
is written to the pass's ledger row and progress, and cleared when the pass goes on. Checks are
PostgreSQL's: a pass over another database (SQLite, the embedded default) has none of these
signals and is held by its pace alone. Fail closed: a role that cannot see every session (no
``pg_monitor``/``pg_read_all_stats``) cannot tell, so the pass refuses with
``X_BACKFILL_HEALTH_BLIND`` instead of sweeping blind; ``health=None`` opts out explicitly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ultimat3.core.errors import check
from ultimat3.jobs.duration import DurationInput, parse_duration

__all__ = ["DEFAULT_HEALTH", "Health", "health"]


@dataclass(frozen=True)
class Health:
    """Declared health limits (see the module docstring); build it with :func:`health`."""

    #: Seconds the oldest open transaction may have been open.
    max_transaction_age: float = 120.0
    #: Sessions that may be waiting for a lock on a table the pass reads.
    max_lock_waiters: int = 0
    #: Seconds of replica replay lag.
    max_replica_lag: float = 10.0
    #: Seconds between samples while healthy, and the first backoff once tripped.
    every: float = 1.0
    #: The longest single wait while tripped.
    max_backoff: float = 30.0

    def validated(self, backfill: str) -> Health:
        """Itself, or a coded error naming ``backfill`` (``X_BACKFILL_HEALTH``)."""
        hint = (f'write health=health(max_transaction_age="2m", max_lock_waiters=0, max_replica_lag="10s") '
                f'on backfill(name="{backfill}"), or health=None to sweep without the checks')
        for label, value in (("max_transaction_age", self.max_transaction_age),
                             ("max_replica_lag", self.max_replica_lag), ("every", self.every),
                             ("max_backoff", self.max_backoff)):
            check(math.isfinite(value) and value > 0,
                  f'backfill "{backfill}" declares health({label}={value!r}) — a positive duration', hint,
                  code="X_BACKFILL_HEALTH")
        check(isinstance(self.max_lock_waiters, int) and not isinstance(self.max_lock_waiters, bool)
              and self.max_lock_waiters >= 0,
              f'backfill "{backfill}" declares health(max_lock_waiters={self.max_lock_waiters!r}) — a whole '
              "number of sessions, 0 or more", hint, code="X_BACKFILL_HEALTH")
        check(self.every <= self.max_backoff,
              f'backfill "{backfill}" declares health(every={self.every}, max_backoff={self.max_backoff}) — '
              "the first wait is longer than the longest", hint, code="X_BACKFILL_HEALTH")
        return self


#: What a backfill sweeps under when it declares no ``health=``.
DEFAULT_HEALTH = Health()


def health(*, max_transaction_age: DurationInput = "2m", max_lock_waiters: int = 0,
           max_replica_lag: DurationInput = "10s", every: DurationInput = "1s",
           max_backoff: DurationInput = "30s") -> Health:
    """Health limits for ``backfill(health=...)``: durations as ``"2m"``, ``30``, a timedelta.
    Checked by ``backfill()``, which names itself."""
    return Health(
        max_transaction_age=parse_duration(max_transaction_age, what="health(max_transaction_age=...)"),
        max_lock_waiters=max_lock_waiters,
        max_replica_lag=parse_duration(max_replica_lag, what="health(max_replica_lag=...)"),
        every=parse_duration(every, what="health(every=...)"),
        max_backoff=parse_duration(max_backoff, what="health(max_backoff=...)"),
    )
