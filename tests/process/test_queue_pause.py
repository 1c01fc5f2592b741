"""Queue pause and resume against real worker processes, on SQLite and PostgreSQL.

An operator pauses the queue a busy worker drains: no attempt starts more than about a second after
the pause (attempts already running finish), enqueues are still accepted, and nothing is lost.
Resume wakes the worker (PostgreSQL: the NOTIFY; SQLite: the worker's one-second poll) and it
drains the rest, every job exactly once.
"""

from __future__ import annotations

import time

import pytest

from tests.process import chaos_app
from tests.process.backends import Backend
from tests.process.harness import Fleet, job_counts, wait_for
from ultimat3.jobs import isolated_registry
from ultimat3.jobs.operator import pause_queue, resume_queue

pytestmark = pytest.mark.process

JOBS = 1_500
#: "About a second": what a claim that was already on its way when the pause committed may still
#: start, plus scheduling slack on a loaded 2-core box.
BOUND = 1.0


def started_after(backend: Backend, moment: float) -> list[float]:
    return [row[0] for row in backend.app.rows("SELECT started FROM chaos_attempts WHERE started > ?", (moment,))]


def test_a_pause_stops_new_attempts_within_a_second_and_resume_drains_the_rest(backend: Backend) -> None:
    with isolated_registry():
        jobs = chaos_app.declare()
        effect = jobs["chaos.effect"]
        effect.enqueue_many([{"n": n, "work_ms": 30} for n in range(JOBS)], driver=backend.driver)
    with Fleet(backend.root, backend.url, backend.app_url, concurrency=4, visibility=5.0, heartbeat=0.5,
               poll=1.0, grace=5.0) as fleet:
        fleet.start()
        wait_for(lambda: backend.app.scalar("SELECT count(*) FROM chaos_attempts") >= 100, timeout=30,
                 message="the worker to be busy on the queue", on_fail=fleet.logs)

        assert pause_queue(backend.driver, "default", actor="test:ops") is True
        paused_at = time.time()
        # Enqueue is still accepted while paused.
        with isolated_registry():
            late = chaos_app.declare()["chaos.effect"].enqueue_many(
                [{"n": JOBS + n, "work_ms": 30} for n in range(20)], driver=backend.driver)
        time.sleep(BOUND + 1.5)  # the bound, then long enough to see that nothing else starts
        fleet.check_healthy()
        late_starts = started_after(backend, paused_at + BOUND)
        assert late_starts == [], f"{len(late_starts)} attempts started more than {BOUND}s after the pause"
        counts = job_counts(backend.driver)
        assert counts["running"] == 0, counts  # what was running finished
        waiting = counts["ready"]
        assert waiting >= 20 + 100, counts  # the rest, and the late enqueues, wait
        done_while_paused = backend.app.scalar("SELECT count(*) FROM chaos_effects")
        assert all(backend.driver.introspect.get(r.id) is not None for r in late)

        assert resume_queue(backend.driver, "default", actor="test:ops") is True
        resumed_at = time.time()
        wait_for(lambda: job_counts(backend.driver)["done"] == JOBS + 20, timeout=120,
                 message="the resumed queue to drain", on_fail=fleet.logs)
        first = min(started_after(backend, resumed_at - 0.001))
        # PostgreSQL wakes the worker through the resume's NOTIFY; SQLite's worker polls each second.
        assert first - resumed_at < (BOUND if backend.kind == "postgres" else BOUND + 1.0)
        fleet.check_healthy()
    effects = backend.app.scalar("SELECT count(*) FROM chaos_effects")
    assert effects == JOBS + 20 and effects > done_while_paused
    assert job_counts(backend.driver) == {"ready": 0, "delayed": 0, "running": 0, "suspended": 0,
                                          "done": JOBS + 20, "dead": 0, "cancelled": 0}
    audit = [(e.action, e.actor, e.touched) for e in backend.driver.audit.list()]
    assert audit == [("resume", "test:ops", 1), ("pause", "test:ops", 1)]
