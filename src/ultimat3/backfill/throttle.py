"""Holding a pass while its database is unhealthy: the sampling and backoff behind ``health=``
(the limits and why each matters are in :mod:`ultimat3.backfill.health`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.sql.selectable import Select

from ultimat3.backfill.checks import tables_read
from ultimat3.backfill.definition import BackfillDefinition, BackfillError
from ultimat3.backfill.health import Health
from ultimat3.backfill.pacer import Pacer
from ultimat3.drivers.sql import load_queries
from ultimat3.jobs.signal import AbortSignal

__all__ = ["Reading", "Throttle"]

_Q = load_queries("ultimat3.backfill", "health.sql")


@dataclass(frozen=True)
class Reading:
    """One sample of the database's health."""

    oldest_transaction: float
    lock_waiters: int
    replica_lag: float

    def reason(self, limits: Health) -> str | None:
        """Why the pass must wait, or ``None`` when every value is within ``limits``."""
        reasons = []
        if self.oldest_transaction > limits.max_transaction_age:
            reasons.append(f"a transaction has been open {self.oldest_transaction:.0f} s "
                           f"(limit {limits.max_transaction_age:g} s)")
        if self.lock_waiters > limits.max_lock_waiters:
            reasons.append(f"{self.lock_waiters} session(s) wait for a lock on the swept table "
                           f"(limit {limits.max_lock_waiters})")
        if self.replica_lag > limits.max_replica_lag:
            reasons.append(f"replica replay lag is {self.replica_lag:.1f} s (limit {limits.max_replica_lag:g} s)")
        return "; ".join(reasons) or None


class Throttle:
    """Samples the swept database at most every ``health.every`` seconds (the pacer's clock) and
    holds the pass while a limit is exceeded."""

    def __init__(self, definition: BackfillDefinition, health: Health, engine: Engine, tables: list[str],
                 pacer: Pacer) -> None:
        self._definition = definition
        self._health = health
        self._engine = engine
        self._tables = tables
        self._pacer = pacer
        self._sampled_at: float | None = None

    @classmethod
    def for_pass(cls, definition: BackfillDefinition, engine: Engine, statement: Select[Any]) -> Throttle | None:
        """The throttle of a pass reading ``statement`` through ``engine``; ``None`` when the
        backfill declared ``health=None`` or the database is not PostgreSQL (no such signals)."""
        if definition.health is None or engine.dialect.name != "postgresql":
            return None
        preparer = engine.dialect.identifier_preparer
        tables = [preparer.format_table(table) for table in tables_read(statement)]
        return cls(definition, definition.health, engine, tables, definition.pacer)

    def sample(self) -> Reading:
        """Ask the database now; refuses (``X_BACKFILL_HEALTH_BLIND``) when this role cannot see
        every session or replica, since the answer would then be a guess."""
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            row = conn.execute(text(_Q["health"]), {"tables": self._tables}).one()
        if row.hidden:
            name = self._definition.name
            raise BackfillError(
                f'backfill "{name}" cannot check the database\'s health: its role sees {row.hidden} session(s) '
                "or replica(s) only as <insufficient privilege>, so an old transaction or a lagging replica "
                "could go unseen",
                f"GRANT pg_monitor TO the role the backfill connects as, or declare health=None on "
                f'backfill(name="{name}") to sweep without the checks',
                code="X_BACKFILL_HEALTH_BLIND",
            )
        return Reading(float(row.oldest_transaction), int(row.lock_waiters), float(row.replica_lag))

    def hold(self, signal: AbortSignal, report: Callable[[str | None], bool]) -> bool:
        """Return once the database is healthy (``False``), or ``True`` as soon as ``report``
        says an operator asked the pass to pause. While tripped: ``report(reason)`` then a wait of
        ``every``, doubling up to ``max_backoff``; on recovery ``report(None)`` clears the reason.
        Raises :class:`~ultimat3.jobs.errors.JobAbortedError` (via the pacer) once ``signal`` aborts."""
        now = self._pacer.monotonic()
        if self._sampled_at is not None and now - self._sampled_at < self._health.every:
            return False
        wait = self._health.every
        tripped = False
        while True:
            self._sampled_at = self._pacer.monotonic()
            reason = self.sample().reason(self._health)
            if reason is None:
                return report(None) if tripped else False
            tripped = True
            if report(reason):
                return True
            self._pacer.sleep(wait, signal)
            signal.raise_if_aborted("health")
            wait = min(wait * 2, self._health.max_backoff)
