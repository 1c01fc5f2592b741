"""The backfill registry: derived from the job registry, plain JSON, backfills only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ultimat3.backfill import (
    alembic_revision,
    backfill,
    backfill_origin,
    declaration_of,
    get_backfill,
    is_backfill,
    registered_backfills,
)
from ultimat3.core import Ctx
from ultimat3.jobs import SyncStep, isolated_registry, job, registered_jobs

items = sa.Table("items", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))


def declare(name: str, **fields: Any) -> Any:
    return backfill(
        engine="job-store", name=name, tenant="none", source=lambda ctx: sa.select(items), handle=lambda b: None,
                    **fields)


def test_every_declared_backfill_is_listed_as_json(tmp_path: Path) -> None:
    @job(name="plain", tenant="none")
    def plain(input: Any, ctx: Ctx, step: SyncStep) -> None:
        return None

    first = declare("items.first")
    declare("items.second", requires="app:0002", environments=["production"], count=lambda ctx: 0)
    declare("items.third", requires=alembic_revision("ae10", script_location=tmp_path))

    # Typed declarations; their JSON is what x db backfill --json prints.
    listed = [d.to_json() for d in registered_backfills()]
    assert [d["name"] for d in listed] == ["items.first", "items.second", "items.third"]
    origin = backfill_origin(first)
    assert origin is not None
    assert listed[0] == {
        "kind": "backfill",
        "name": "items.first",
        "checksum": origin.checksum,
        "requires": None,
        "environments": None,
        "counts": False,
    }
    assert listed[1]["requires"] == "app:0002"
    assert listed[1]["environments"] == ["production"]
    assert listed[1]["counts"] is True
    assert listed[2]["requires"] == "alembic:ae10"
    assert json.loads(json.dumps(listed)) == listed
    assert len(registered_jobs()) == 4, "backfills are jobs: one registry holds all four"


def test_get_backfill_finds_backfills_only() -> None:
    @job(name="plain", tenant="none")
    def plain(input: Any, ctx: Ctx, step: SyncStep) -> None:
        return None

    declared = declare("items.fill")
    assert get_backfill("items.fill") is declared
    assert get_backfill("plain") is None
    assert get_backfill("nope") is None
    assert is_backfill(declared)
    assert not is_backfill(plain)
    assert not is_backfill("items.fill")
    assert declaration_of(plain) is None


def test_a_look_alike_job_is_not_a_backfill() -> None:
    declared = declare("items.fill")
    origin = backfill_origin(declared)

    @job(name="look.alike", tenant="none")
    def look_alike(input: Any, ctx: Ctx, step: SyncStep) -> None:
        return None

    look_alike.checksum = origin.checksum if origin else ""  # type: ignore[attr-defined]
    assert not is_backfill(look_alike)
    assert [d.name for d in registered_backfills()] == ["items.fill"]


def test_an_isolated_registry_hides_and_restores_declarations() -> None:
    declare("items.outer")
    with isolated_registry():
        assert registered_backfills() == []
        declare("items.inner")
        assert [d.name for d in registered_backfills()] == ["items.inner"]
    assert [d.name for d in registered_backfills()] == ["items.outer"]
    assert get_backfill("items.inner") is None
