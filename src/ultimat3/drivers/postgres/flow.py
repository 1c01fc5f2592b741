"""The PostgreSQL half of a flow-controlled claim (the rules are :mod:`ultimat3.drivers.flow`'s).

Runs inside the claim's transaction. Two claimers meeting the same key serialise on its advisory
lock, taken before the running rows are counted in a statement of their own (READ COMMITTED: a
new snapshot, which sees every claim made under that lock before); buckets are row-locked in key
order after the concurrency keys, so no two claimers can wait on each other in a circle.
"""

from __future__ import annotations

from typing import Any

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.flow import Bucket, Candidate, admit, earliest, scan_size
from ultimat3.drivers.postgres.rows import _Q, ClaimedRow, Conn, _claimed, _rows


def claim_flow(conn: Conn, base: dict[str, Any], queues: list[str] | None, limit: int,
               now: float) -> tuple[list[ClaimedRow], float | None, bool]:
    """Claim up to ``limit`` due jobs under flow control within their limits; the claimed rows, the
    wake-up hint (when a bucket this claim found empty gets a token back) and whether any
    candidate was turned away (see :class:`~ultimat3.drivers.flow.Admission`)."""
    cur = _rows(conn)
    found = cur.execute(_Q["flow_candidates"], {**base, "queues": queues, "scan": scan_size(limit)}).fetchall()
    if not found:
        return [], _next_token(cur, base), False
    candidates = [Candidate.of(row) for row in found]
    flow_keys = sorted({c.flow_key for c in candidates if c.flow_key is not None})
    shapes = {c.rate_key: (c.rate_per_second, c.rate_burst) for c in candidates if c.rate_key is not None}
    rate_keys = sorted(shapes)
    running: dict[str, int] = {}
    if flow_keys:
        cur.execute(_Q["flow_lock"], {"keys": flow_keys})
        running = {row["flow_key"]: row["n"] for row in cur.execute(_Q["flow_running"], {"keys": flow_keys})}
    buckets: dict[str, Bucket] = {}
    if rate_keys:
        cur.execute(_Q["flow_bucket_init"], {"keys": rate_keys, "now": base["now"],
                                             "per_seconds": [shapes[k][0] for k in rate_keys],
                                             "bursts": [shapes[k][1] for k in rate_keys]})
        buckets = {row["key"]: Bucket.of(row) for row in cur.execute(_Q["flow_buckets"], {"keys": rate_keys})}
    decided = admit(candidates, running, buckets, now, limit)
    # A claim that filled its limit is followed by another at once: it needs no wake-up hint.
    wake_at = None if len(decided.ids) >= limit else earliest(decided.wake_at, _next_token(cur, base))
    if decided.buckets:
        cur.execute(_Q["flow_bucket_store"], {
            "keys": [b.key for b in decided.buckets], "tokens": [b.tokens for b in decided.buckets],
            "ats": [to_datetime(b.at) for b in decided.buckets],
            "per_seconds": [b.per_second for b in decided.buckets], "bursts": [b.burst for b in decided.buckets]})
    if not decided.ids:
        return [], wake_at, decided.refused
    return _claimed(conn).execute(_Q["flow_claim"], {**base, "ids": decided.ids}).fetchall(), wake_at, decided.refused


def _next_token(cur: Any, base: dict[str, Any]) -> float | None:
    """When the first bucket that is empty now (this claim's candidates left it out) refills."""
    row = cur.execute(_Q["flow_next_token"], {"now": base["now"]}).fetchone()
    return None if row is None or row["wake_at"] is None else float(row["wake_at"])
