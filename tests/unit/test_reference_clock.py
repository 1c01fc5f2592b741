"""ReferenceClock: another machine's time, read without a round trip, immune to this host's wall clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ultimat3.core import clock as clock_module
from ultimat3.core.clock import ReferenceClock


class Host:
    """This host's two clocks and a reference server, all moved by hand."""

    def __init__(self) -> None:
        self.tick = 1000.0  # CLOCK_BOOTTIME
        self.wall = 1_800_000_000.0  # this host's wall clock
        self.server = 1_800_000_000.0  # the reference's wall clock
        self.trips: list[float] = []  # round trip of each next sample (server answers mid-trip)
        self.samples = 0

    def advance(self, seconds: float) -> None:
        self.tick += seconds
        self.wall += seconds
        self.server += seconds

    def sample(self) -> float:
        self.samples += 1
        trip = self.trips.pop(0) if self.trips else 0.0
        self.advance(trip / 2)
        answer = self.server
        self.advance(trip / 2)
        return answer


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    fake = Host()
    monkeypatch.setattr(clock_module, "_elapsed", lambda: fake.tick)
    monkeypatch.setattr(clock_module.time, "time", lambda: fake.wall)
    yield fake


def test_it_reads_the_reference_not_this_hosts_wall_clock(host: Host) -> None:
    host.wall += 45  # this host is 45 s ahead
    clock = ReferenceClock(host.sample)
    assert clock.now() == pytest.approx(host.server)
    assert clock.offset() == pytest.approx(45)
    host.advance(10)
    assert clock.now() == pytest.approx(host.server)


def test_it_keeps_the_sample_with_the_shortest_round_trip(host: Host) -> None:
    host.trips = [0.200, 0.002, 0.050]
    clock = ReferenceClock(host.sample, samples=3)
    assert host.samples == 3
    assert clock.round_trip == pytest.approx(0.002)
    # Pinned to the middle of its round trip: the error is at most half of the best trip.
    assert abs(clock.now() - host.server) <= 0.001 + 1e-9


def test_a_step_of_this_hosts_wall_clock_changes_nothing_read(host: Host) -> None:
    clock = ReferenceClock(host.sample)
    host.wall -= 30  # NTP steps this host's clock back
    host.advance(1)
    assert clock.now() == pytest.approx(host.server)
    assert clock.offset() == pytest.approx(-30)


def test_the_offset_is_reported_after_each_measurement(host: Host) -> None:
    seen: list[float] = []
    host.wall -= 2
    clock = ReferenceClock(host.sample, on_measure=seen.append)
    host.wall -= 3
    clock.measure()
    assert seen == [pytest.approx(-2), pytest.approx(-5)]


def test_a_failed_measurement_keeps_the_last_anchor(host: Host) -> None:
    clock = ReferenceClock(host.sample)

    def broken() -> float:
        raise OSError("server gone")

    clock._sample = broken
    with pytest.raises(OSError):
        clock.measure()
    host.advance(5)
    assert clock.now() == pytest.approx(host.server)


def test_a_wall_clock_jump_wakes_the_refresher_at_once(host: Host) -> None:
    measured = threading.Event()
    clock = ReferenceClock(host.sample, refresh=3600.0)
    clock._on_measure = lambda _offset: measured.set()
    clock.start()
    try:
        host.wall += 120  # e.g. a VM resumed from a pause: its wall clock moved, its interval clock did not
        clock.now()
        assert measured.wait(5.0), "the jump did not trigger a new measurement"
    finally:
        clock.stop()


def test_stop_ends_the_refresher(host: Host) -> None:
    clock = ReferenceClock(host.sample, refresh=3600.0)
    clock.start()
    thread = clock._thread
    assert thread is not None and thread.is_alive()
    clock.stop()
    assert not thread.is_alive()
    clock.stop()  # idempotent
