"""Queue pause and resume, and the per-queue overview."""

from __future__ import annotations

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver

from .helpers import Wakeups, at, claim, claim_one, dead_letter, enqueue, retry_later


def test_a_paused_queue_is_skipped_by_every_claim_and_still_takes_enqueues(driver: JobDriver) -> None:
    assert driver.queues.pause("billing", "ops:ann") is True
    held = enqueue(driver, queue="billing", priority=100).id  # enqueue is still accepted
    other = enqueue(driver, queue="mail").id
    assert [c.job.id for c in claim(driver, limit=10)] == [other]
    assert claim(driver, limit=10, queues=("billing",)) == []
    assert claim(driver, limit=10, queues=("billing", "mail")) == []
    assert driver.queues.paused() == ["billing"]

    assert driver.queues.resume("billing", "ops:ann") is True
    assert [c.job.id for c in claim(driver, limit=10, queues=("billing",))] == [held]
    assert driver.queues.paused() == []


def test_a_paused_queue_does_not_hand_out_its_lapsed_claims_either(driver: JobDriver, clock: ManualClock) -> None:
    job_id = enqueue(driver, queue="billing").id
    claim_one(driver, visibility_timeout=5)
    driver.queues.pause("billing", "ops")
    clock.advance(60)  # the claim lapsed: normally anyone may take it over
    assert claim(driver, limit=10) == []
    driver.queues.resume("billing", "ops")
    assert [c.job.id for c in claim(driver, limit=10)] == [job_id]


def test_pause_and_resume_say_whether_they_changed_anything_and_are_audited(driver: JobDriver) -> None:
    assert driver.queues.resume("q", "ops") is False  # never paused
    assert driver.queues.pause("q", "ops:ann") is True
    assert driver.queues.pause("q", "ops:bob") is False
    assert driver.queues.resume("q", "ops:bob") is True
    entries = driver.audit.list()
    assert [(e.action, e.actor, e.touched, e.status) for e in entries] == [
        ("resume", "ops:bob", 1, "completed"),
        ("pause", "ops:bob", 0, "completed"),
        ("pause", "ops:ann", 1, "completed"),
        ("resume", "ops", 0, "completed"),
    ]
    assert all(e.target == {"queue": "q"} and e.finished_at is not None for e in entries)


def test_resume_wakes_the_workers_of_the_queue(driver: JobDriver) -> None:
    driver.queues.pause("billing", "ops")
    enqueue(driver, queue="billing")
    seen = Wakeups()
    unsubscribe = driver.subscribe(seen)
    try:
        seen.clear()
        driver.queues.resume("billing", "ops")
        assert seen.wait_for("billing")
    finally:
        unsubscribe()


def test_the_overview_shows_state_depth_age_and_the_last_hour(driver: JobDriver, clock: ManualClock) -> None:
    start = clock.now()
    enqueue(driver, queue="billing")
    clock.advance(30)
    enqueue(driver, queue="billing")
    enqueue(driver, queue="billing", run_at=clock.now() + 600)  # waiting, not due
    for outcome in ("done", "dead", "retry", "running"):
        enqueue(driver, queue="work")
        claimed = claim_one(driver, queues=("work",))
        if outcome == "done":
            assert driver.ack(claimed.job.id, claimed.claim_token)
        elif outcome == "dead":
            assert driver.nack(claimed.job.id, claimed.claim_token, dead_letter("X_DOWN"))
        elif outcome == "retry":
            assert driver.nack(claimed.job.id, claimed.claim_token, retry_later(600, "TimeoutError: slow"))
    driver.queues.pause("idle", "ops:ann")
    clock.advance(10)

    overview = {info.queue: info for info in driver.queues.overview(window=3600)}
    assert sorted(overview) == ["billing", "idle", "work"]
    billing = overview["billing"]
    assert (billing.paused, billing.due, billing.counts["ready"], billing.counts["delayed"]) == (False, 2, 2, 1)
    assert billing.oldest_due_age is not None and abs(billing.oldest_due_age - 40) < 0.01
    assert billing.changed_at is None and billing.changed_by is None
    work = overview["work"]
    assert (work.counts["running"], work.done_recent, work.dead_recent, work.failed_recent) == (1, 1, 1, 1)
    assert work.due == 0 and work.oldest_due_age is None
    idle = overview["idle"]
    assert (idle.paused, idle.changed_by, idle.changed_at) == (True, "ops:ann", at(start + 30))
    assert sum(idle.counts.values()) == 0
    clock.advance(7200)
    work = {info.queue: info for info in driver.queues.overview(window=3600)}["work"]
    assert (work.done_recent, work.dead_recent, work.failed_recent) == (0, 0, 0)



def test_names_no_driver_can_store_are_refused_coded_before_any_write(driver: JobDriver) -> None:
    from ultimat3.core.errors import XError

    for call, code in ((lambda: driver.queues.pause("q\x00", "ops"), "X_QUEUE_NAME"),
                       (lambda: driver.queues.resume("q", "ops\ud800"), "X_AUDIT_ACTOR"),
                       (lambda: driver.schedules.register("s\x00", 0.0), "X_SCHEDULE_KEY"),
                       (lambda: driver.schedules.set_paused("s", True, "a\x00"), "X_AUDIT_ACTOR"),
                       (lambda: driver.audit.open("a\x00", "retry", {}), "X_AUDIT_ACTOR")):
        try:
            call()
        except XError as error:
            assert error.code == code and error.hint, (code, error)
        else:
            raise AssertionError(f"{code}: accepted")
    assert driver.queues.paused() == [] and driver.schedules.list() == [] and driver.audit.list() == []
