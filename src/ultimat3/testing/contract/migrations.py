"""The migrations ledger and ``migrate()``."""

from __future__ import annotations

from ultimat3.core.clock import ManualClock
from ultimat3.drivers.protocol import JobDriver

from .helpers import at

#: The library's own migrations, in order (every driver records the same ids).
LIBRARY_MIGRATIONS = ("x:0001_init", "x:0002_workers", "x:0003_operations", "x:0004_schedules",
                      "x:0005_claim_any_index", "x:0006_backfill_control", "x:0007_flow_control", "x:0008_attempts",
                      "x:0009_lean_indexes")


def test_migrate_applies_the_library_schema_once(driver: JobDriver, first_migrate: list[str]) -> None:
    if driver.name in ("memory", "sqlite"):  # a fresh store every test
        assert first_migrate == list(LIBRARY_MIGRATIONS)
    assert driver.migrate() == []
    assert driver.migrate() == []
    applied = [m.id for m in driver.migrations.applied()]
    for migration_id in LIBRARY_MIGRATIONS:
        assert driver.migrations.is_applied(migration_id)
        assert migration_id in applied


def test_mark_applied_is_idempotent_and_oldest_first(driver: JobDriver, clock: ManualClock) -> None:
    assert not driver.migrations.is_applied("app:0002_b")
    clock.advance(10)
    driver.migrations.mark_applied("app:0002_b")
    marked_at = clock.now()
    clock.advance(10)
    driver.migrations.mark_applied("app:0001_a")
    clock.advance(10)
    driver.migrations.mark_applied("app:0002_b")

    assert driver.migrations.is_applied("app:0002_b")
    assert driver.migrations.is_applied("app:0001_a")
    applied = [m for m in driver.migrations.applied() if m.id.startswith("app:")]
    assert [m.id for m in applied] == ["app:0002_b", "app:0001_a"]
    assert applied[0].applied_at == at(marked_at)  # the second mark kept the first time
    assert applied[1].applied_at == at(marked_at + 10)
    library = [m.id for m in driver.migrations.applied() if m.id.startswith("x:")]
    assert library and library[0] == "x:0001_init"


def test_unknown_migration_is_not_applied(driver: JobDriver) -> None:
    assert driver.migrations.is_applied("app:never") is False
