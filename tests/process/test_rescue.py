"""A dead worker's jobs run again in about a second, on SQLite and PostgreSQL, without a timer:

- SIGKILL a worker running long jobs under a 30 s visibility timeout: a live worker starts every
  one of them within 2 s (the liveness signal, an advisory lock or an flock, died with the
  process), nothing is lost, and the dead worker leaves the registry.
- SIGSTOP a worker past several probes: it is alive to the database and the OS, so nobody rescues
  it early (no false rescue of a slow worker); its job comes back only when its visibility lapses,
  and once resumed it cannot settle the job that was taken from it.
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
from ultimat3.jobs import isolated_registry

pytestmark = pytest.mark.process

#: The promise: a killed worker's jobs start again within this many seconds.
RESCUE_BOUND = 2.0


def test_a_killed_workers_jobs_start_again_within_two_seconds(backend: Backend) -> None:
    with isolated_registry():
        block = chaos_app.declare()["chaos.block"]
        results = [block.enqueue({"tag": f"held-{i}", "only_first": True}, driver=backend.driver) for i in range(4)]
    with Fleet(backend.root, backend.url, backend.app_url, names="chaos.block", concurrency=4, poll=0.2,
               visibility=30.0, heartbeat=1.0) as fleet:
        fleet.start("A")
        for i in range(4):
            wait_for(lambda i=i: backend.marks(f"held-{i}"), timeout=30, message=f"A to start held-{i}",
                     on_fail=fleet.logs)
        fleet.start("B")
        wait_for(lambda: {w.id for w in backend.driver.workers.list()} == {"A", "B"}, timeout=30,
                 message="both workers to register", on_fail=fleet.logs)
        assert all(w.alive for w in backend.driver.workers.list())
        if backend.kind == "postgres":
            # A fleet in its steady state: B's liveness session is older than the settling time
            # (a session younger than that rescues nobody, for the sake of server restarts).
            wait_for(lambda: _session_age(backend.url, "B") > 3.2, timeout=30, message="B's session to settle")

        killed_at = time.time()
        fleet.kill("A")
        for i in range(4):
            wait_for(lambda i=i: any(m[0] == "finish" for m in backend.marks(f"held-{i}")), timeout=15,
                     message=f"B to run held-{i} again", on_fail=fleet.logs)
        restarted = [next(m[3] for m in backend.marks(f"held-{i}") if m[0] == "start" and m[1] == "B")
                     for i in range(4)]
        delays = [at - killed_at for at in restarted]
        for result in results:
            row = wait_for(lambda job_id=result.id: (r := get(backend.driver, job_id)).state == "done" and r,
                           timeout=10, message="every job done")
            assert row.attempt == 2 and row.result["by"] == "B"
        rescued = [e for e in fleet.events("B") if e["kind"] == "rescued"]
        assert sorted(e["job_id"] for e in rescued) == sorted(r.id for r in results)
        assert [w.id for w in backend.driver.workers.list()] == ["B"]
        fleet.check_healthy()
        fleet.stop_all()
    assert backend.driver.workers.list() == []  # B left on its clean stop
    print(f"[rescue {backend.kind}] restart after SIGKILL: {[round(d, 3) for d in delays]}s "
          f"(bound {RESCUE_BOUND}s, visibility 30s)")
    assert max(delays) < RESCUE_BOUND, delays


def _session_age(url: str, worker_id: str) -> float:
    """Seconds since worker ``worker_id``'s liveness session began, by the server (0 when absent)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM now() - backend_start)::float8 FROM pg_stat_activity"
                           " WHERE application_name = %s", (f"ultimat3 worker {worker_id}",)).fetchone()
    return 0.0 if row is None else float(row[0])


def test_a_frozen_worker_is_not_rescued_early_and_cannot_settle_after(backend: Backend, tmp_path: Path) -> None:
    release = tmp_path / "release"
    with isolated_registry():
        block = chaos_app.declare()["chaos.block"]
        result = block.enqueue({"tag": "frozen", "release": str(release), "only_first": True}, driver=backend.driver)
    visibility = 4.0
    with Fleet(backend.root, backend.url, backend.app_url, names="chaos.block", concurrency=1, poll=0.1,
               grace=2.0) as fleet:
        fleet.start("A", visibility=visibility, heartbeat=0.3)
        wait_for(lambda: backend.marks("frozen"), timeout=30, message="A to start the job", on_fail=fleet.logs)
        fleet.start("B", visibility=30.0, heartbeat=1.0)
        wait_for(lambda: {w.id for w in backend.driver.workers.list()} == {"A", "B"}, timeout=30,
                 message="both workers to register", on_fail=fleet.logs)
        for _ in range(50):  # not while A holds SQLite's write lock: nobody could write then
            fleet.signal("A", signal.SIGSTOP)
            if backend.writable():
                break
            fleet.signal("A", signal.SIGCONT)
        else:
            pytest.fail("could not freeze A outside a write")
        frozen_at = time.time()
        lapse = get(backend.driver, result.id).visible_at
        second = wait_for(lambda: (row := get(backend.driver, result.id)).state == "done" and row, timeout=30,
                          message="B to take the job once A's claim lapsed", on_fail=fleet.logs)
        taken_at = next(m[3] for m in backend.marks("frozen") if m[1] == "B")
        # Frozen is alive: B probed A several times and left it alone until the claim lapsed.
        assert [e for e in fleet.events("B") if e["kind"] == "rescued"] == []
        assert taken_at >= lapse.timestamp() - 0.05, (taken_at, lapse)
        assert taken_at - frozen_at >= 2.0, "B took the job from a frozen (alive) worker before several probes"
        assert any(w.id == "A" and w.alive for w in backend.driver.workers.list())
        assert second.claimed_by == "B" and second.result == {"tag": "frozen", "by": "B", "attempt": 2}

        release.touch()
        fleet.signal("A", signal.SIGCONT)
        settled = wait_for(lambda: [e for e in fleet.events("A") if e.get("job_id") == result.id], timeout=15,
                           message="A to try to settle after waking", on_fail=fleet.logs)
        fleet.check_healthy()
        fleet.stop_all()
    assert settled[0]["kind"] in ("fenced", "aborted"), settled
    assert get(backend.driver, result.id) == second, "the frozen worker changed the re-taken row"
    print(f"[frozen {backend.kind}] B took the job {taken_at - frozen_at:.2f}s after the freeze "
          f"(lapse at +{lapse.timestamp() - frozen_at:.2f}s); A's late settlement was {settled[0]['kind']}; "
          f"now={datetime.now(UTC).isoformat()}")
