"""Wake-ups: writes that may make a job runnable call subscribers with its queue."""

from __future__ import annotations

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver

from .helpers import Wakeups, dead_letter, enqueue, enqueue_and_claim, request, retry_later


def test_enqueue_wakes_subscribers_with_the_queue(driver: JobDriver) -> None:
    seen = Wakeups()
    unsubscribe = driver.subscribe(seen)
    try:
        enqueue(driver, queue="mail")
        assert seen.wait_for("mail")
    finally:
        unsubscribe()


def test_enqueue_many_wakes_every_queue(driver: JobDriver) -> None:
    seen = Wakeups()
    unsubscribe = driver.subscribe(seen)
    try:
        driver.enqueue_many([request(queue="q1"), request(queue="q2")])
        assert seen.wait_for("q1")
        assert seen.wait_for("q2")
    finally:
        unsubscribe()


def test_nack_wakes_subscribers(driver: JobDriver) -> None:
    claimed = enqueue_and_claim(driver, queue="retries")
    seen = Wakeups()
    unsubscribe = driver.subscribe(seen)
    try:
        assert driver.nack(claimed.job.id, claimed.claim_token, retry_later())
        assert seen.wait_for("retries")
    finally:
        unsubscribe()


def test_retry_wakes_subscribers(driver: JobDriver, clock: ManualClock) -> None:
    claimed = enqueue_and_claim(driver, queue="ops")
    assert driver.nack(claimed.job.id, claimed.claim_token, dead_letter())
    seen = Wakeups()
    unsubscribe = driver.subscribe(seen)
    try:
        assert driver.retry(claimed.job.id) is not None
        assert seen.wait_for("ops")
    finally:
        unsubscribe()


def test_unsubscribe_stops_wakeups(driver: JobDriver) -> None:
    gone = Wakeups()
    kept = Wakeups()
    unsubscribe_gone = driver.subscribe(gone)
    unsubscribe_kept = driver.subscribe(kept)
    try:
        unsubscribe_gone()
        enqueue(driver, queue="q")
        assert kept.wait_for("q")
        assert gone.queues == []
    finally:
        unsubscribe_kept()
