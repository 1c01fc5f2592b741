"""Fleet slots: at most ``limit`` holders of a key, expiring, fenced by their token."""

from __future__ import annotations

import pytest

from ultimat3.core.clock import ManualClock
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver

from .helpers import at


def test_acquire_up_to_the_limit(driver: JobDriver, clock: ManualClock) -> None:
    first = driver.leases.acquire("sync", "w1", 2, 30)
    second = driver.leases.acquire("sync", "w2", 2, 30)
    assert first is not None and second is not None
    assert (first.key, first.slot, first.holder) == ("sync", 0, "w1")
    assert (second.key, second.slot, second.holder) == ("sync", 1, "w2")
    assert first.expires_at == second.expires_at == at(clock.now() + 30)
    assert first.token != second.token
    assert driver.leases.acquire("sync", "w3", 2, 30) is None
    assert driver.leases.holders("sync") == [first, second]


def test_keys_are_independent(driver: JobDriver) -> None:
    assert driver.leases.acquire("a", "w1", 1, 30) is not None
    b = driver.leases.acquire("b", "w1", 1, 30)
    assert b is not None and b.slot == 0
    assert driver.leases.acquire("a", "w2", 1, 30) is None
    assert [lease.key for lease in driver.leases.holders("b")] == ["b"]


def test_expiry_frees_a_slot(driver: JobDriver, clock: ManualClock) -> None:
    lost = driver.leases.acquire("sync", "dead-worker", 1, 30)
    assert lost is not None
    clock.advance(29)
    assert driver.leases.acquire("sync", "w2", 1, 30) is None
    assert driver.leases.holders("sync") == [lost]
    clock.advance(2)
    assert driver.leases.holders("sync") == []

    taken = driver.leases.acquire("sync", "w2", 1, 30)
    assert taken is not None
    assert (taken.slot, taken.holder) == (0, "w2")
    assert taken.token != lost.token
    assert taken.expires_at == at(clock.now() + 30)
    assert driver.leases.holders("sync") == [taken]


def test_acquire_takes_the_lowest_free_slot(driver: JobDriver) -> None:
    leases = [driver.leases.acquire("sync", f"w{i}", 3, 30) for i in range(3)]
    assert [lease.slot for lease in leases if lease is not None] == [0, 1, 2]
    assert leases[1] is not None and driver.leases.release(leases[1])
    again = driver.leases.acquire("sync", "w9", 3, 30)
    assert again is not None and again.slot == 1
    assert [lease.holder for lease in driver.leases.holders("sync")] == ["w0", "w9", "w2"]


def test_renew_extends_a_held_lease(driver: JobDriver, clock: ManualClock) -> None:
    lease = driver.leases.acquire("sync", "w1", 1, 30)
    assert lease is not None
    clock.advance(20)
    renewed = driver.leases.renew(lease, 60)
    assert renewed is not None
    assert (renewed.key, renewed.slot, renewed.holder, renewed.token) == ("sync", 0, "w1", lease.token)
    assert renewed.expires_at == at(clock.now() + 60)
    clock.advance(50)  # past the original expiry, inside the renewed one
    assert driver.leases.acquire("sync", "w2", 1, 30) is None
    assert driver.leases.holders("sync") == [renewed]


def test_renew_of_an_expired_lease_nobody_retook(driver: JobDriver, clock: ManualClock) -> None:
    lease = driver.leases.acquire("sync", "w1", 1, 30)
    assert lease is not None
    clock.advance(45)
    renewed = driver.leases.renew(lease, 30)
    assert renewed is not None and renewed.expires_at == at(clock.now() + 30)
    assert driver.leases.holders("sync") == [renewed]


def test_a_lost_lease_can_neither_renew_nor_release(driver: JobDriver, clock: ManualClock) -> None:
    stale = driver.leases.acquire("sync", "w1", 1, 30)
    assert stale is not None
    clock.advance(31)
    fresh = driver.leases.acquire("sync", "w2", 1, 30)
    assert fresh is not None and fresh.slot == stale.slot

    assert driver.leases.renew(stale, 30) is None
    assert driver.leases.release(stale) is False
    assert driver.leases.holders("sync") == [fresh]
    assert driver.leases.renew(fresh, 30) is not None
    assert driver.leases.release(fresh) is True


def test_release_frees_the_slot_once(driver: JobDriver) -> None:
    lease = driver.leases.acquire("sync", "w1", 1, 30)
    assert lease is not None
    assert driver.leases.release(lease) is True
    assert driver.leases.holders("sync") == []
    assert driver.leases.release(lease) is False
    assert driver.leases.renew(lease, 30) is None
    assert driver.leases.acquire("sync", "w2", 1, 30) is not None


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_below_one_is_refused(driver: JobDriver, limit: int) -> None:
    with pytest.raises(XError) as caught:
        driver.leases.acquire("sync", "w1", limit, 30)
    assert caught.value.code == "X_LEASE_LIMIT"
    assert driver.leases.holders("sync") == []


def test_holders_of_an_unknown_key_is_empty(driver: JobDriver) -> None:
    assert driver.leases.holders("nothing") == []
