"""The worker registry: rows, liveness that the database or the OS reports, and the fenced rescue
of a dead worker's running jobs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.errors import DriverError
from ultimat3.drivers.protocol import WORKER_LOST, JobDriver, NackRequest, WorkerInfo

from .helpers import at, claim, enqueue, get


def info(worker_id: str, **fields: object) -> WorkerInfo:
    """A worker's self-description for the tests."""
    values: dict[str, object] = {"host": "test-host", "pid": os.getpid(), "concurrency": 4, "queues": None}
    values.update(fields)
    return WorkerInfo(id=worker_id, **values)  # type: ignore[arg-type]


@pytest.fixture
def registered(driver: JobDriver) -> Iterator[list[str]]:
    """Ids registered by a test; unregistered afterwards (a lock or a connection must not outlive it)."""
    ids: list[str] = []
    yield ids
    for worker_id in ids:
        driver.workers.unregister(worker_id)


def _register(driver: JobDriver, registered: list[str], worker_id: str, **fields: object) -> None:
    driver.workers.register(info(worker_id, **fields))
    registered.append(worker_id)


def test_a_registered_worker_is_listed_alive(driver: JobDriver, clock: ManualClock, registered: list[str]) -> None:
    _register(driver, registered, "w1", concurrency=8, queues=("billing", "mail"))
    [record] = driver.workers.list()
    assert (record.id, record.host, record.pid, record.concurrency) == ("w1", "test-host", os.getpid(), 8)
    assert record.queues == ("billing", "mail")
    assert record.alive and record.why
    assert record.started_at == record.last_seen_at == at(clock.now())
    assert record.running == () and record.clock_offset is None and record.wakeups is None


def test_beat_records_the_time_and_the_clock_offset(driver: JobDriver, clock: ManualClock,
                                                    registered: list[str]) -> None:
    _register(driver, registered, "w1")
    clock.advance(5)
    assert driver.workers.beat("w1", clock_offset=-1.5, wakeups="notify") is True
    [record] = driver.workers.list()
    assert record.last_seen_at == at(clock.now())
    assert record.started_at == at(clock.now() - 5)
    assert record.clock_offset == -1.5
    assert record.wakeups == "notify"


def test_list_shows_what_each_worker_runs(driver: JobDriver, registered: list[str]) -> None:
    _register(driver, registered, "w1")
    _register(driver, registered, "w2")
    first, second = enqueue(driver).id, enqueue(driver).id
    claim(driver, "w1", limit=2)
    by_id = {record.id: record for record in driver.workers.list()}
    assert list(by_id) == ["w1", "w2"]
    assert by_id["w1"].running == tuple(sorted([first, second]))
    assert by_id["w2"].running == ()


def test_unregister_removes_the_row_and_is_idempotent(driver: JobDriver) -> None:
    driver.workers.register(info("w1"))
    driver.workers.unregister("w1")
    driver.workers.unregister("w1")
    assert driver.workers.list() == []
    driver.workers.register(info("w1"))  # the id is free again
    driver.workers.unregister("w1")


def test_an_id_held_by_a_live_worker_is_refused(driver: JobDriver, registered: list[str]) -> None:
    _register(driver, registered, "w1")
    with pytest.raises(DriverError) as caught:
        driver.workers.register(info("w1", pid=12345))
    assert caught.value.code == "X_WORKER_ID_TAKEN"
    assert "w1" in str(caught.value)
    [record] = driver.workers.list()
    assert record.pid == os.getpid()  # nothing half-written


def test_a_worker_whose_signal_is_gone_is_listed_dead(driver: JobDriver, registered: list[str]) -> None:
    _register(driver, registered, "w1")
    driver.workers.register(info("w2"))
    driver.workers.abandon("w2")
    by_id = {record.id: record for record in driver.workers.list()}
    assert by_id["w1"].alive
    assert not by_id["w2"].alive and by_id["w2"].why
    assert driver.workers.list() == list(by_id.values())  # listing changed nothing


def test_rescue_puts_a_dead_workers_running_jobs_back_at_once(driver: JobDriver, clock: ManualClock,
                                                              registered: list[str]) -> None:
    _register(driver, registered, "alive")
    driver.workers.register(info("dead"))
    kept = enqueue(driver, priority=9).id
    [held_by_alive] = claim(driver, "alive")
    lost = [enqueue(driver).id, enqueue(driver).id]
    held_by_dead = claim(driver, "dead", limit=2)
    assert {c.job.id for c in held_by_dead} == set(lost)
    assert held_by_alive.job.id == kept
    foreign = enqueue(driver).id
    claim(driver, "never-registered")  # a claimer with no row: left to its visibility timeout
    driver.workers.abandon("dead")
    clock.advance(1)

    rescued = driver.workers.rescue("alive")

    assert sorted((r.job_id, r.queue, r.worker_id) for r in rescued) == sorted(
        (job_id, "default", "dead") for job_id in lost
    )
    for job_id in lost:
        record = get(driver, job_id)
        assert record.state == "ready"
        assert record.attempt == 1  # the attempt counts, as a lapse does
        assert record.claimed_by is None and record.visible_at is None
        assert record.last_error is not None and record.last_error.startswith(WORKER_LOST)
        assert "dead" in record.last_error
        assert record.updated_at == at(clock.now())
    assert get(driver, kept).state == "running"
    assert get(driver, foreign).state == "running"
    assert [record.id for record in driver.workers.list()] == ["alive"]
    assert driver.workers.rescue("alive") == []


def test_a_rescued_job_is_fenced_against_its_old_claim(driver: JobDriver, registered: list[str]) -> None:
    driver.workers.register(info("dead"))
    enqueue(driver)
    [old] = claim(driver, "dead")
    driver.workers.abandon("dead")
    assert len(driver.workers.rescue("rescuer")) == 1
    # The worker only looked dead (a partition, a paused VM): none of its writes land.
    assert driver.ack(old.job.id, old.claim_token, {"late": True}) is False
    assert driver.nack(old.job.id, old.claim_token, NackRequest(error="late")) is False
    assert driver.heartbeat(old.job.id, old.claim_token, 30) is False
    assert driver.steps.record(old.job.id, old.claim_token, "s", 1) is False
    [again] = claim(driver, "rescuer")
    assert again.job.id == old.job.id and again.claim_token != old.claim_token
    assert again.job.attempt == 2
    assert driver.ack(again.job.id, again.claim_token, "ok") is True


def test_rescue_takes_every_dead_worker_in_one_call(driver: JobDriver, registered: list[str]) -> None:
    for worker_id in ("d1", "d2"):
        driver.workers.register(info(worker_id))
        enqueue(driver)
        claim(driver, worker_id)
        driver.workers.abandon(worker_id)
    assert sorted(r.worker_id for r in driver.workers.rescue("me")) == ["d1", "d2"]
    assert driver.workers.list() == []


def test_a_worker_taken_for_dead_re_registers_on_its_next_beat(driver: JobDriver, registered: list[str]) -> None:
    _register(driver, registered, "w1")
    driver.workers.abandon("w1")
    driver.workers.rescue("other")
    assert driver.workers.list() == []
    # The registry still knows what w1 said of itself (it registered through this driver).
    driver.workers.register(info("w1"))
    assert driver.workers.beat("w1") is True
    [record] = driver.workers.list()
    assert record.alive


def test_beat_of_a_worker_never_registered_here_is_refused(driver: JobDriver) -> None:
    with pytest.raises(DriverError) as caught:
        driver.workers.beat("stranger")
    assert caught.value.code == "X_WORKER_UNKNOWN"
