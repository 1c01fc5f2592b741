"""Flow control at claim time, decided once for every driver.

A job under flow control carries its keys on its row (written at enqueue): ``flow_key`` with
``flow_max`` (at most that many jobs under the key ``running`` at once) and ``rate_key`` with
``rate_per_second``/``rate_burst`` (a token bucket per key, kept in ``x_rates``). A claim that may
take such jobs (``ClaimRequest.flow``) does, in ONE transaction:

1. read candidates in claim order: waiting and due, in an unpaused queue, and not under a key
   that is full (counted from ``running`` rows) or a bucket that is empty -- so a job over its
   limit is claimable by nothing, burns no attempt, and never sits in front of other jobs;
2. on PostgreSQL, lock each candidate's concurrency key (a transaction-level advisory lock) and
   bucket row, in key order, then count ``running`` rows per key afresh: two claimers can never
   both see the last free slot (SQLite's write lock and the memory driver's lock do the same);
3. :func:`admit` walks the candidates in claim order, taking a slot and a token for each it can;
4. move the admitted ones to ``running`` and store the buckets back.

A slot is the ``running`` row itself, so whatever ends the attempt (ack, nack, cancel, a rescue
of a dead worker's jobs, a lapsed claim taken over) frees or keeps it with the row, fenced as
every write is; nothing else has to be released. A killed worker's slot comes back when its
liveness signal goes (instant rescue) or, at the latest, when its claim's visibility lapses and
another worker takes the job over (in the same slot).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["WHOLE_TOKEN", "Admission", "Bucket", "Candidate", "admit", "earliest", "scan_size"]

#: A bucket holding this much has a whole token: times round-trip through microsecond columns
#: and float epochs, so a refill that is due exactly now may read a hair under 1.
WHOLE_TOKEN = 1.0 - 1e-6


@dataclass(frozen=True)
class Candidate:
    """A due job under flow control, as the claim's first read sees it."""

    id: str
    flow_key: str | None
    flow_max: int | None
    rate_key: str | None
    rate_per_second: float | None
    rate_burst: int | None

    @classmethod
    def of(cls, row: Any) -> Candidate:
        """From a row (or object) carrying the job's id and flow columns by name."""
        get = row.__getitem__ if hasattr(row, "__getitem__") else lambda name: getattr(row, name)
        return cls(get("id"), get("flow_key"), get("flow_max"), get("rate_key"), get("rate_per_second"),
                   get("rate_burst"))


@dataclass(frozen=True)
class Bucket:
    """A token bucket as stored: ``tokens`` as of ``at`` (epoch seconds)."""

    key: str
    tokens: float
    at: float
    per_second: float
    burst: int

    @classmethod
    def of(cls, row: Any) -> Bucket:
        """From an ``x_rates`` row read by column name (``at`` as epoch seconds)."""
        return cls(row["key"], float(row["tokens"]), float(row["at"]), float(row["per_second"]), int(row["burst"]))

    def level(self, now: float) -> float:
        """Tokens available at ``now`` (refilled at the rate, never above the burst)."""
        return min(float(self.burst), self.tokens + max(0.0, now - self.at) * self.per_second)

    def next_token(self, now: float) -> float:
        """When the bucket holds a whole token (``now`` when it already does)."""
        return now + max(0.0, 1.0 - self.level(now)) / self.per_second


def earliest(*times: float | None) -> float | None:
    """The earliest of the given wake-up times, ``None`` when none is given."""
    given = [t for t in times if t is not None]
    return min(given) if given else None


@dataclass(frozen=True)
class Admission:
    """What :func:`admit` decided: the ids to start (in claim order), the buckets to store back,
    when a refused job gets its next token (``None``: none was refused for a token), and whether
    any candidate was turned away (a key this very claim filled, a bucket it emptied): the next
    claim leaves those keys out from the start, so it may find others (``ClaimBatch.more``)."""

    ids: list[str]
    buckets: list[Bucket]
    wake_at: float | None
    refused: bool = False


def scan_size(limit: int) -> int:
    """How many candidates a flow claim reads for ``limit`` starts: room for the ones a key's
    last slot or an empty bucket turns away within the same claim."""
    return limit * 4 + 16


def admit(candidates: Iterable[Candidate], running: Mapping[str, int], buckets: Mapping[str, Bucket],
          now: float, limit: int) -> Admission:
    """Take candidates in order while they fit: a slot under ``flow_max`` (``running`` counts the
    key's jobs running now) and a whole token in the key's bucket (one made full at the declared
    burst when the key has none yet). The declaration on the candidate wins over the stored
    bucket's rate and burst (a deploy that changed them)."""
    held = dict(running)
    levels: dict[str, Bucket] = {}
    touched: dict[str, Bucket] = {}
    ids: list[str] = []
    wake_at: float | None = None
    refused = False
    for job in candidates:
        if len(ids) >= limit:
            break
        if job.flow_key is not None and held.get(job.flow_key, 0) >= (job.flow_max or 1):
            refused = True
            continue
        if job.rate_key is not None:
            per_second = job.rate_per_second or 1.0
            burst = job.rate_burst or 1
            bucket = levels.get(job.rate_key)
            if bucket is None:
                stored = buckets.get(job.rate_key)
                tokens = float(burst) if stored is None else stored.level(now)
                bucket = Bucket(job.rate_key, min(tokens, float(burst)), now, per_second, burst)
            if bucket.tokens < WHOLE_TOKEN:
                refused = True
                levels[job.rate_key] = bucket
                wake_at = earliest(wake_at, bucket.next_token(now))
                continue
            bucket = Bucket(bucket.key, max(0.0, bucket.tokens - 1.0), now, per_second, burst)
            levels[job.rate_key] = touched[job.rate_key] = bucket
        if job.flow_key is not None:
            held[job.flow_key] = held.get(job.flow_key, 0) + 1
        ids.append(job.id)
    return Admission(ids, list(touched.values()), wake_at, refused)

