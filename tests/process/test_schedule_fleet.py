"""Schedules across a fleet of real worker processes, on SQLite and PostgreSQL.

Three workers all fire ``chaos.tick`` (``every("1s")``); one is SIGKILLed mid-run. Every tick from
the first to the last is enqueued exactly once: no tick twice (the store's compare-and-set), none
lost while at least one worker lived (no leader to lose).
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime

import pytest

from tests.process.backends import Backend
from tests.process.harness import Fleet, wait_for
from ultimat3.drivers.protocol import JobFilter
from ultimat3.jobs.schedule import tick_of

pytestmark = pytest.mark.process


def ticks(backend: Backend) -> list[float]:
    jobs = backend.driver.introspect.list(JobFilter(name="chaos.tick", limit=10_000))
    found = [tick_of(job.enqueued_by) for job in jobs]
    return sorted(t.timestamp() for t in found if isinstance(t, datetime))


def test_three_workers_fire_each_tick_once_and_a_kill_loses_none(backend: Backend) -> None:
    with Fleet(backend.root, backend.url, backend.app_url, concurrency=2, visibility=5.0, heartbeat=0.5,
               poll=1.0, grace=2.0, ticks=1) as fleet:
        for _ in range(3):
            fleet.start()
        fleet.wait_started()
        wait_for(lambda: len(ticks(backend)) >= 4, timeout=30, message="the fleet to fire a few ticks",
                 on_fail=fleet.logs)
        fleet.kill("w2")
        killed_at = time.time()
        wait_for(lambda: bool(ticks(backend)) and ticks(backend)[-1] >= killed_at + 5, timeout=30,
                 message="ticks to go on after the kill", on_fail=fleet.logs)
        fleet.check_healthy()
        codes = fleet.stop_all()
    assert all(code == 0 for wid, code in codes.items()), codes
    fired = ticks(backend)
    assert len(fired) == len(set(fired)), "a tick was enqueued twice"
    steps = {round(b - a, 6) for a, b in itertools.pairwise(fired)}
    assert steps == {1.0}, f"ticks missing between {fired[0]} and {fired[-1]}: steps {sorted(steps)}"
    assert len(fired) >= 9
    scheduled = [e for e in fleet.events() if e["kind"] == "scheduled"]
    # Each tick reported by the one worker that fired it (the killed one may have died between a
    # commit and its report line).
    assert len({e["job_id"] for e in scheduled}) == len(scheduled) >= len(fired) - 1
    assert len({e["worker"] for e in scheduled}) >= 2, "the ticks were not shared by the fleet"
