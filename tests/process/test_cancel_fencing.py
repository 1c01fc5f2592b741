"""Cancel and lost claims across processes, under load.

- A job cancelled from another process (here: the test's) while a worker process runs it stops
  within one heartbeat interval (plus slack), while the worker is busy with other jobs.
- A worker frozen (SIGSTOP) mid-job until its claim lapses, whose job another worker then
  re-claims and finishes, cannot settle it when it wakes: its ack/nack/heartbeat/step writes are
  refused and the row keeps what the second worker wrote.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.process import chaos_app
from tests.process.backends import Backend, get
from tests.process.harness import Fleet, wait_for
from ultimat3.jobs import NackRequest, isolated_registry

pytestmark = pytest.mark.process

HEARTBEAT = 0.3
#: Scheduling slack on a loaded 2-core box: the heartbeat round's own round trips, the lookup that
#: tells "cancelled" from "claim lost", the handler's next look at its signal and its app write.
SLACK = 0.6


def test_cancel_reaches_a_running_attempt_within_a_heartbeat_under_load(backend: Backend) -> None:
    with isolated_registry():
        jobs = chaos_app.declare()
        jobs["chaos.effect"].enqueue_many([{"n": n, "work_ms": 20} for n in range(1_500)], driver=backend.driver)
        # Higher priority: claimed first, so they run while the load keeps every other slot busy.
        blocked = [jobs["chaos.block"].enqueue({"tag": f"cancel-{i}"}, priority=10, driver=backend.driver)
                   for i in range(3)]
    latencies: list[float] = []
    with Fleet(backend.root, backend.url, backend.app_url, concurrency=4, visibility=3.0, heartbeat=HEARTBEAT,
               poll=0.2, grace=2.0) as fleet:
        fleet.start()
        fleet.start()
        for i, result in enumerate(blocked):
            tag = f"cancel-{i}"
            wait_for(lambda tag=tag: backend.marks(tag), timeout=30, message=f"{tag} to start", on_fail=fleet.logs)
            assert get(backend.driver, result.id).state == "running"
            assert backend.app.scalar("SELECT count(*) FROM chaos_attempts") < 1_500, "no load left to cancel under"
            row = backend.driver.cancel(result.id, "cancelled by the test")
            cancelled_at = time.time()
            assert row is not None and row.state == "cancelled"
            marks = wait_for(lambda tag=tag: [m for m in backend.marks(tag) if m[0] == "aborted"], timeout=10,
                             message=f"{tag}'s handler to see the abort", on_fail=fleet.logs)
            latencies.append(marks[0][3] - cancelled_at)
        # The worker settles nothing for a cancelled job: it stays cancelled, never "finished".
        for result in blocked:
            wait_for(lambda job_id=result.id: any(e.get("job_id") == job_id for e in fleet.events()),
                     timeout=10, message="the worker to report the aborted attempt")
            assert get(backend.driver, result.id).state == "cancelled"
        kinds = {e["kind"] for e in fleet.events() if e.get("job_id") in {r.id for r in blocked}}
        fleet.check_healthy()
        fleet.stop_all()
    for i in range(3):
        assert [m[0] for m in backend.marks(f"cancel-{i}")] == ["start", "aborted"]
    print(f"[cancel {backend.kind}] latencies={[round(x, 3) for x in latencies]}s "
          f"(limit {HEARTBEAT + SLACK:.2f}s) worker events={sorted(kinds)}")
    assert kinds == {"aborted"}
    assert max(latencies) <= HEARTBEAT + SLACK, latencies


def test_a_stale_worker_cannot_settle_a_reclaimed_job(backend: Backend, tmp_path: Path) -> None:
    release = tmp_path / "release"
    with isolated_registry():
        block = chaos_app.declare()["chaos.block"]
        result = block.enqueue({"tag": "stale", "release": str(release), "only_first": True}, driver=backend.driver)
    driver = backend.driver
    with Fleet(backend.root, backend.url, backend.app_url, names="chaos.block", concurrency=1, poll=0.1,
               grace=2.0) as fleet:
        fleet.start("A", visibility=1.5, heartbeat=0.25)
        wait_for(lambda: backend.marks("stale"), timeout=30, message="A to start the job", on_fail=fleet.logs)
        token_a = backend.claim_token(result.id)
        assert token_a is not None and get(driver, result.id).claimed_by == "A"

        # Frozen mid-job: no heartbeats, no progress. Not while it holds SQLite's write lock (a
        # heartbeat's transaction): everyone else would wait on a process that never lets go.
        for _ in range(50):
            fleet.signal("A", signal.SIGSTOP)
            if backend.writable():
                break
            fleet.signal("A", signal.SIGCONT)
        else:
            pytest.fail("could not freeze A outside a write")
        wait_for(lambda: get(driver, result.id).visible_at < datetime.now(UTC), timeout=10,
                 message="A's claim to lapse")
        fleet.start("B", visibility=30.0, heartbeat=1.0)
        second = wait_for(lambda: (row := get(driver, result.id)).state == "done" and row, timeout=30,
                          message="B to re-claim and finish the job", on_fail=fleet.logs)
        assert second.claimed_by == "B" and second.attempt == 2
        assert second.result == {"tag": "stale", "by": "B", "attempt": 2}

        # Every write under A's token is refused, whoever makes it.
        assert driver.ack(result.id, token_a, {"by": "A"}) is False
        assert driver.nack(result.id, token_a, NackRequest(error="stale")) is False
        assert driver.nack(result.id, token_a, NackRequest(error="stale", dead_letter=True)) is False
        assert driver.nack(result.id, token_a, NackRequest(delay=1, counts_as_attempt=False)) is False
        assert driver.heartbeat(result.id, token_a, 30.0) is False
        assert driver.steps.record(result.id, token_a, "late", {"by": "A"}) is False
        assert get(driver, result.id) == second

        # A wakes up, its handler finishes, and its own settlement is refused too.
        release.touch()
        fleet.signal("A", signal.SIGCONT)
        settled = wait_for(lambda: [e for e in fleet.events("A") if e.get("job_id") == result.id], timeout=15,
                           message="A to try to settle after waking", on_fail=fleet.logs)
        fleet.check_healthy()
        fleet.stop_all()
    assert settled[0]["kind"] in ("fenced", "aborted"), settled
    assert get(driver, result.id) == second, "the stale worker changed the re-claimed row"
    assert driver.steps.load(second.run_id) == {}
    print(f"[stale {backend.kind}] A's late settlement was {settled[0]['kind']}; row kept B's result "
          f"{second.result}; marks={[m[:3] for m in backend.marks('stale')]}")
