"""The tenant guard on SQLAlchemy selects, and the cross-tenant grant only a
``backfill(tenant='none')`` pass receives."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ultimat3.backfill import BackfillInput, Batch, backfill, backfill_origin, run_pass
from ultimat3.core import CROSS_TENANT_SCOPE, Actor, Ctx, Grant, ManualClock, XError, current_ctx, use_ctx
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import AbortSignal, ClaimRequest, SyncStep, Worker, job
from ultimat3.jobs.execute import run_ctx
from ultimat3.tenancy import NO_CROSS_TENANT_REASON, cross_tenant, scoped, tenant_column, tenanted

metadata = sa.MetaData()
notes = tenanted(sa.Table(
    "notes", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("org_id", sa.String, nullable=False),
    sa.Column("author_id", sa.Integer, nullable=False),
))
people = tenanted(sa.Table(
    "people", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("tenant", sa.String, nullable=False),
), column="tenant")
countries = sa.Table("countries", metadata, sa.Column("id", sa.Integer, primary_key=True))

ORG_A = Ctx(actor=Actor(id="user:1", org_id="org-a"))
NOBODY = Ctx(actor=Actor(id="user:2"))
CROSS = Ctx(actor=Actor(id="sweeper"), grants=(Grant(CROSS_TENANT_SCOPE, "tests of the guard"),))


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    built = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    metadata.create_all(built)
    with built.begin() as conn:
        conn.execute(people.insert(), [{"id": i, "tenant": "org-a" if i % 2 else "org-b"} for i in range(1, 7)])
        conn.execute(notes.insert(), [
            {"id": i, "org_id": "org-a" if i % 2 else "org-b", "author_id": ((i - 1) % 6) + 1} for i in range(1, 21)
        ])
        conn.execute(countries.insert(), [{"id": 1}, {"id": 2}])
    yield built
    built.dispose()


def read(engine: Engine, stmt: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(stmt).all())


# -- the guard ----------------------------------------------------------------------------------------


def test_tenanted_checks_its_table_and_column() -> None:
    assert tenant_column(notes) == "org_id" and tenant_column(people) == "tenant"
    assert tenant_column(countries) is None
    with pytest.raises(XError) as caught:
        tenanted(sa.Table("x", sa.MetaData(), sa.Column("id", sa.Integer)), column="org_id")
    assert caught.value.code == "X_TENANCY_COLUMN" and '"x"' in caught.value.message
    with pytest.raises(XError) as caught:
        tenanted(sa.select(countries))  # type: ignore[arg-type]
    assert caught.value.code == "X_TENANCY_TABLE"


def test_a_select_is_filtered_to_the_actor_org(engine: Engine) -> None:
    original = sa.select(notes)
    rows = read(engine, scoped(original, ORG_A))
    assert len(rows) == 10 and {r.org_id for r in rows} == {"org-a"}
    assert len(read(engine, original)) == 20, "the caller's statement is not modified"
    with use_ctx(ORG_A):
        assert len(read(engine, scoped(sa.select(notes)))) == 10, "the ambient ctx by default"


def test_joins_aliases_and_nested_selects_are_all_filtered(engine: Engine) -> None:
    author = people.alias("author")
    joined = sa.select(notes.c.id, author.c.tenant).join_from(notes, author, notes.c.author_id == author.c.id)
    assert {r.tenant for r in read(engine, scoped(joined, ORG_A))} == {"org-a"}
    sql = str(scoped(joined, ORG_A))
    assert "notes.org_id = " in sql and "author.tenant = " in sql

    inner = sa.select(notes.c.id, notes.c.org_id).subquery()
    assert {r.org_id for r in read(engine, scoped(sa.select(inner), ORG_A))} == {"org-a"}

    in_subselect = sa.select(countries.c.id).where(countries.c.id.in_(sa.select(people.c.id)))
    assert [r.id for r in read(engine, scoped(in_subselect, ORG_A))] == [1]  # person 2 is org-b

    exists = sa.select(countries.c.id).where(sa.exists().where(people.c.id == countries.c.id))
    assert [r.id for r in read(engine, scoped(exists, ORG_A))] == [1]

    cte = sa.select(people.c.id).cte("visible")
    with_cte = sa.select(countries.c.id).join(cte, cte.c.id == countries.c.id)
    assert [r.id for r in read(engine, scoped(with_cte, ORG_A))] == [1]


def test_untenanted_selects_need_no_org(engine: Engine) -> None:
    assert len(read(engine, scoped(sa.select(countries), NOBODY))) == 2


def test_no_org_and_no_capability_is_refused() -> None:
    with pytest.raises(XError) as caught:
        scoped(sa.select(notes), NOBODY)
    error = caught.value
    assert error.code == "X_TENANCY_CROSS_DENIED"
    assert "notes" in error.message and "user:2" in error.message
    assert NO_CROSS_TENANT_REASON in error.message
    assert error.hint
    reasoned = Ctx(actor=Actor(id="user:2"), cross_tenant_reason="quarterly report")
    with pytest.raises(XError) as caught:
        scoped(sa.select(notes), reasoned)
    assert "quarterly report" in caught.value.message


def test_the_capability_without_an_org_reads_every_tenant(engine: Engine) -> None:
    assert len(read(engine, scoped(sa.select(notes), CROSS))) == 20


def test_cross_tenant_needs_the_capability_and_a_reason() -> None:
    with use_ctx(NOBODY), pytest.raises(XError) as caught, cross_tenant("because"):
        pass
    assert caught.value.code == "X_TENANCY_CROSS_DENIED" and "user:2" in caught.value.message
    with use_ctx(CROSS), pytest.raises(XError) as caught, cross_tenant("  "):
        pass
    assert caught.value.code == "X_TENANCY_REASON"
    with use_ctx(CROSS):
        with cross_tenant("nightly rollup") as inner:
            assert current_ctx() is inner and inner.cross_tenant_reason == "nightly rollup"
        assert current_ctx().cross_tenant_reason is None


# -- backfills ----------------------------------------------------------------------------------------


def drain(driver: MemoryDriver) -> None:
    worker = Worker(driver, environment="test", concurrency=1)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()


def no_wait(seconds: float, signal: AbortSignal) -> None:
    return None


def sweep(name: str, tenant: Any, engine: Engine, seen: list[Any], clock: ManualClock) -> Any:
    def handle(batch: Batch) -> None:
        ambient = current_ctx()
        seen.append((
            [row.org_id for row in batch.rows],
            ambient.holds(CROSS_TENANT_SCOPE),
            ambient.cross_tenant_reason,
            batch.ctx.actor.org_id,
        ))

    return backfill(name=name, tenant=tenant, source=lambda ctx: sa.select(notes), handle=handle, batch=4,
                    engine=engine, clock=clock, sleep=no_wait)


def test_a_tenanted_backfill_sees_only_its_org(memory: MemoryDriver, engine: Engine, clock: ManualClock) -> None:
    seen: list[Any] = []
    queued = sweep("notes.org_a", lambda _input: "org-a", engine, seen, clock).enqueue(driver=memory)
    drain(memory)
    job_row = memory.introspect.get(queued.id)
    assert job_row is not None and job_row.state == "done" and job_row.result["rows"] == 10
    assert {org for orgs, *_ in seen for org in orgs} == {"org-a"}
    assert all(not cross and reason is None and org == "org-a" for _, cross, reason, org in seen)


def test_a_tenant_none_backfill_sees_every_org_under_its_own_reason(memory: MemoryDriver, engine: Engine,
                                                                   clock: ManualClock) -> None:
    seen: list[Any] = []
    queued = sweep("notes.all", "none", engine, seen, clock).enqueue(driver=memory)
    drain(memory)
    job_row = memory.introspect.get(queued.id)
    assert job_row is not None and job_row.state == "done" and job_row.result["rows"] == 20
    assert {org for orgs, *_ in seen for org in orgs} == {"org-a", "org-b"}
    assert all(cross and reason is not None and '"notes.all"' in reason for _, cross, reason, _org in seen)


def test_a_plain_tenant_none_job_is_refused(memory: MemoryDriver, engine: Engine, clock: ManualClock) -> None:
    @job(name="plain.sweep", tenant="none")
    def plain(input: Any, ctx: Ctx, step: SyncStep) -> int:
        return len(read(engine, scoped(sa.select(notes))))

    seen: list[Any] = []
    sweep("notes.all", "none", engine, seen, clock).enqueue(driver=memory)
    plain_job = plain.enqueue(driver=memory)
    drain(memory)  # the backfill and the plain job share the worker's one thread
    job_row = memory.introspect.get(plain_job.id)
    assert job_row is not None and job_row.state == "dead" and job_row.attempt == 1
    assert "X_TENANCY_CROSS_DENIED" in (job_row.last_error or "")
    assert NO_CROSS_TENANT_REASON in (job_row.last_error or "")
    assert seen, "the backfill itself ran"


def test_the_capability_dies_with_the_pass(memory: MemoryDriver, engine: Engine, clock: ManualClock) -> None:
    seen: list[Any] = []
    declared = sweep("notes.all", "none", engine, seen, clock)
    declared.enqueue(driver=memory)
    [claimed] = memory.claim(ClaimRequest(worker_id="test"))
    ctx = run_ctx(claimed, "test")
    origin = backfill_origin(declared)
    assert origin is not None
    with use_ctx(ctx):
        report = run_pass(origin, BackfillInput(), ctx, SyncStep(memory, claimed, AbortSignal("x"), clock))
        after = current_ctx()
    assert report.rows == 20 and seen and all(cross for _, cross, _r, _o in seen)
    assert after is ctx and not after.holds(CROSS_TENANT_SCOPE) and after.cross_tenant_reason is None
    assert not current_ctx().holds(CROSS_TENANT_SCOPE)
    with pytest.raises(XError):
        scoped(sa.select(notes), after)
