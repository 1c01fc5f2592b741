"""Writing a batch of staged jobs, as a sequence of statements that either connection kind runs.

:func:`batch_steps` is the batch's logic without I/O: a generator that yields each statement with
its parameters and receives the rows it returned. :func:`drive` runs it on a sync psycopg cursor
(``enqueue_many``), :func:`drive_async` on an async one (the async group commit), so both paths
share one reading of dedupe, races with finishing jobs, and retries after a lost connection.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import psycopg

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.postgres.rows import _Q, _RACE_RETRIES
from ultimat3.drivers.protocol import EnqueueRequest, EnqueueResult

if TYPE_CHECKING:
    from ultimat3.drivers.postgres.driver import _Staged

__all__ = ["Steps", "batch_steps", "drive", "drive_async", "race_lost"]

Steps = Generator[tuple[str, dict[str, Any]], list[tuple[Any, ...]], list[EnqueueResult]]


def race_lost(request: EnqueueRequest) -> DriverError:
    """The error after :data:`_RACE_RETRIES` rounds of colliding with live jobs that finished."""
    return DriverError(
        f'enqueue of "{request.name}" kept colliding with live jobs that finished before they could be read',
        "enqueue it again", code="X_DRIVER_RACE")


#: The columns ``enqueue_many`` takes as one scalar when a batch shares the value, else as an array.
_SHARED = ("name", "queue", "state", "priority", "max_attempts", "run_at", "idempotency_key", "tenant_id",
           "traceparent", "enqueued_by", "flow_key", "flow_max", "rate_key", "rate_per_second", "rate_burst")


#: The columns of :data:`_SHARED` read from the request as they are (``state`` and ``run_at``
#: depend on the staging time: see :class:`~ultimat3.drivers.staging.StagedJob`).
_AS_GIVEN = tuple(column for column in _SHARED if column not in ("state", "run_at"))
_READ_AS_GIVEN = attrgetter(*_AS_GIVEN)


def _params(staged: Sequence[_Staged], indexes: list[int], channel: str) -> dict[str, Any]:
    """``enqueue_many``'s parameters for ``staged[i]`` for ``i`` in ``indexes``: no value is dumped
    per item by the client but a column the items do not share (see the statement)."""
    items = [staged[i] for i in indexes]
    first = items[0]
    params: dict[str, Any] = {
        "ids": ",".join(item.id for item in items),
        "run_ids": ",".join(item.run_id for item in items),
        "payloads": "[" + ",".join(item.staged.payload for item in items) + "]",
        "now": to_datetime(first.now),
        "channel": channel,
    }
    rows = [(*_READ_AS_GIVEN(item.request), item.run_at) for item in items]
    if rows.count(rows[0]) == len(rows):  # the usual batch, one call's inputs: every column shared
        columns: list[tuple[Any, ...]] = [(value,) for value in rows[0]]
    else:
        columns = list(zip(*rows, strict=True))
    values_of = dict(zip((*_AS_GIVEN, "run_at"), columns, strict=True))
    run_ats = values_of["run_at"]
    values_of["state"] = tuple("delayed" if run_at > first.now else "ready" for run_at in run_ats)
    as_datetime = {run_at: to_datetime(run_at) for run_at in set(run_ats)}
    values_of["run_at"] = tuple(as_datetime[run_at] for run_at in run_ats)
    for column in _SHARED:
        values = values_of[column]
        shared = values[0]
        if values.count(shared) == len(values):
            params[column], params[f"{column}_each"] = shared, None
        else:
            params[column], params[f"{column}_each"] = None, list(values)
    return params


def batch_steps(staged: Sequence[_Staged], channel: str, *, retrying: bool) -> Steps:
    """The statements that write ``staged`` in the caller's transaction, results in request order.

    ``retrying``: the last try lost its connection and may have committed (a batch is atomic: then
    all of it did), so the ids are looked up first and never written twice.
    """
    results: list[EnqueueResult | None] = [None] * len(staged)
    inserted: set[str] = set()
    if retrying:
        rows = yield _Q["jobs_by_ids"], {"ids": [item.id for item in staged]}
        inserted.update(row[0] for row in rows)
    pending = list(range(len(staged)))
    for _ in range(_RACE_RETRIES):
        to_insert = [i for i in pending if staged[i].id not in inserted]
        if to_insert:
            rows = yield _Q["enqueue_many"], _params(staged, to_insert, channel)
            inserted.update(row[0] for row in rows if row[0] is not None)
        conflicted: list[int] = []
        for i in pending:
            if staged[i].id in inserted:
                results[i] = EnqueueResult(id=staged[i].id, run_id=staged[i].run_id, deduped=False)
            else:
                conflicted.append(i)
        if not conflicted:
            break
        # Skipped by the conflict clause: a live job holds the key (maybe one staged just now).
        names = [staged[i].request.name for i in conflicted]
        keys = [staged[i].request.idempotency_key for i in conflicted]
        rows = yield _Q["live_by_keys"], {"names": names, "keys": keys}
        live = {(row[0], row[1]): (row[2], row[3]) for row in rows}
        pending = []
        for i in conflicted:
            holder = live.get((staged[i].request.name, staged[i].request.idempotency_key))
            if holder is None:
                pending.append(i)  # it finished in between: insert again
                continue
            if staged[i].request.on_conflict == "error":
                raise staged[i].duplicate(holder[0])
            results[i] = EnqueueResult(id=holder[0], run_id=holder[1], deduped=True)
        if not pending:
            break
    else:
        raise race_lost(staged[pending[0]].request)
    return [result for result in results if result is not None]


def drive(cur: psycopg.Cursor[tuple[Any, ...]], steps: Steps, *, prepare: bool | None = None) -> list[EnqueueResult]:
    """Run ``steps`` on a sync cursor (inside the caller's transaction)."""
    try:
        query, params = next(steps)
        while True:
            query, params = steps.send(cur.execute(query, params, prepare=prepare).fetchall())
    except StopIteration as done:
        results: list[EnqueueResult] = done.value
        return results


async def drive_async(cur: psycopg.AsyncCursor[tuple[Any, ...]], steps: Steps) -> list[EnqueueResult]:
    """Run ``steps`` on an async cursor (inside the caller's transaction), never preparing."""
    try:
        query, params = next(steps)
        while True:
            await cur.execute(query, params, prepare=False)
            query, params = steps.send(await cur.fetchall())
    except StopIteration as done:
        results: list[EnqueueResult] = done.value
        return results
