"""Who may enqueue what, and what the worker trusts: the org of the actor, live grants only, and
the tenant the input resolves to (never a tenant_id written around the declaration)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from ultimat3.backfill import backfill
from ultimat3.core import CROSS_TENANT_SCOPE, Actor, Ctx, XError, current_ctx, use_ctx
from ultimat3.drivers.memory import MemoryDriver
from ultimat3.jobs import EnqueueRequest, SyncStep, Worker, job
from ultimat3.tenancy import and_where, granted, operator_context


class Invoice(BaseModel):
    org_id: str
    n: int = 0


def declare_pair() -> tuple[Any, Any]:
    @job(name="t.invoice", tenant=lambda i: i.org_id, input=Invoice)
    def invoice(input: Invoice, ctx: Ctx, step: SyncStep) -> str:
        return f"{ctx.actor.org_id}:{input.org_id}"

    @job(name="t.rollup", tenant="none")
    def rollup(input: Any, ctx: Ctx, step: SyncStep) -> str:
        return "ok"

    return invoice, rollup


def code_of(fn: Any) -> str:
    with pytest.raises(XError) as caught:
        fn()
    assert caught.value.hint, "every refusal says what to do instead"
    return caught.value.code


def drain(driver: MemoryDriver) -> None:
    worker = Worker(driver, environment="test", concurrency=1)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()


def test_an_org_actor_enqueues_for_its_own_org_only(memory: MemoryDriver) -> None:
    invoice, rollup = declare_pair()
    with use_ctx(Ctx(actor=Actor(id="user:1", org_id="org-a"))):
        invoice.enqueue({"org_id": "org-a"}, driver=memory)
        assert code_of(lambda: invoice.enqueue({"org_id": "org-b"}, driver=memory)) == "X_TENANCY_MISMATCH"
        # b) a tenant='none' job is work over every org: an org's request cannot start one.
        assert code_of(lambda: rollup.enqueue(driver=memory)) == "X_TENANCY_ENQUEUE_DENIED"
    assert [j.tenant_id for j in memory.introspect.list()] == ["org-a"]


def test_async_enqueue_checks_tenancy_and_input_exactly_as_the_sync_form(memory: MemoryDriver) -> None:
    invoice, rollup = declare_pair()

    async def body() -> None:
        with use_ctx(Ctx(actor=Actor(id="user:1", org_id="org-a"))):
            await invoice.aenqueue({"org_id": "org-a"}, driver=memory)
            for call, code in ((invoice.aenqueue({"org_id": "org-b"}, driver=memory), "X_TENANCY_MISMATCH"),
                               (rollup.aenqueue(driver=memory), "X_TENANCY_ENQUEUE_DENIED"),
                               (invoice.aenqueue({"org_id": "org-a", "n": "x"}, driver=memory), "X_JOB_INPUT"),
                               (invoice.aenqueue_many([{"org_id": "org-a"}, {"org_id": "org-b"}], driver=memory),
                                "X_TENANCY_MISMATCH")):
                with pytest.raises(XError) as caught:
                    await call
                assert caught.value.code == code and caught.value.hint

    asyncio.run(body())
    assert [j.tenant_id for j in memory.introspect.list()] == ["org-a"]


def test_a_context_with_no_org_and_no_grant_enqueues_nothing_tenanted(memory: MemoryDriver) -> None:
    invoice, rollup = declare_pair()
    # a) The default ambient context (what a thread falls back to) is not "the system".
    with use_ctx(Ctx()):
        assert code_of(lambda: invoice.enqueue({"org_id": "org-b"}, driver=memory)) == "X_TENANCY_NO_ACTOR"
        assert code_of(lambda: rollup.enqueue(driver=memory)) == "X_TENANCY_ENQUEUE_DENIED"
    assert memory.introspect.list() == []


def test_a_thread_that_lost_its_request_context_cannot_enqueue_for_another_org(memory: MemoryDriver) -> None:
    invoice, _ = declare_pair()
    errors: list[str] = []

    def in_thread() -> None:  # a plain thread does not inherit the request's contextvars
        try:
            invoice.enqueue({"org_id": "org-b"}, driver=memory)
        except XError as error:
            errors.append(error.code)

    with use_ctx(Ctx(actor=Actor(id="user:1", org_id="org-a"))):
        thread = threading.Thread(target=in_thread)
        thread.start()
        thread.join(10)
    assert errors == ["X_TENANCY_NO_ACTOR"] and memory.introspect.list() == []


def test_an_operator_context_enqueues_anything_and_dies_with_its_block(memory: MemoryDriver) -> None:
    invoice, rollup = declare_pair()
    with use_ctx(Ctx()), operator_context("ops:alice", "re-run the April invoices") as ctx:
        invoice.enqueue({"org_id": "org-b"}, driver=memory)
        rollup.enqueue(driver=memory)
    assert {j.enqueued_by for j in memory.introspect.list()} == {"ops:alice"}
    with use_ctx(ctx):  # the kept context: its grant was revoked with the block
        assert code_of(lambda: rollup.enqueue(driver=memory)) == "X_TENANCY_ENQUEUE_DENIED"
    assert code_of(lambda: operator_context("", "why").__enter__()) == "X_TENANCY_REASON"


def test_a_forced_cross_tenant_backfill_needs_a_grant(memory: MemoryDriver) -> None:
    sweep = backfill(name="t.sweep_all", tenant="none", engine="job-store",
                     source=lambda ctx: sa.select(sa.table("t", sa.column("id"))), handle=lambda batch: None)
    with use_ctx(Ctx(actor=Actor(id="user:1", org_id="org-a"))):
        assert code_of(lambda: sweep.enqueue({"force": True}, driver=memory)) == "X_TENANCY_ENQUEUE_DENIED"
    assert memory.introspect.list() == []


def test_a_tenant_none_run_fans_out_to_orgs_while_it_runs(memory: MemoryDriver) -> None:
    kept: list[Ctx] = []

    @job(name="t.per_org", tenant=lambda i: i.org_id, input=Invoice)
    def per_org(input: Invoice, ctx: Ctx, step: SyncStep) -> None:
        return None

    @job(name="t.fan_out", tenant="none")
    def fan_out(input: Any, ctx: Ctx, step: SyncStep) -> int:
        kept.append(current_ctx())
        for org in ("org-a", "org-b"):
            per_org.enqueue({"org_id": org}, driver=memory)
        return 2

    queued = fan_out.enqueue(driver=memory)
    drain(memory)
    row = memory.introspect.get(queued.id)
    assert row is not None and row.state == "done", row.last_error
    assert sorted(j.tenant_id or "" for j in memory.introspect.list() if j.name == "t.per_org") == ["org-a", "org-b"]
    with use_ctx(kept[0]):  # the run's grant ended with the attempt
        assert code_of(lambda: per_org.enqueue({"org_id": "org-c"}, driver=memory)) == "X_TENANCY_NO_ACTOR"


def test_the_worker_recomputes_the_tenant_and_dead_letters_a_forged_row(memory: MemoryDriver) -> None:
    calls: list[str] = []

    @job(name="t.read", tenant=lambda i: i.org_id, input=Invoice)
    def read(input: Invoice, ctx: Ctx, step: SyncStep) -> None:
        calls.append(input.org_id)

    # c) Written around the declaration: payload says org-a, the row says org-b.
    forged = memory.enqueue(EnqueueRequest(name="t.read", payload={"org_id": "org-a", "n": 0}, tenant_id="org-b"))
    drain(memory)
    row = memory.introspect.get(forged.id)
    assert row is not None and row.state == "dead" and row.attempt == 1
    assert "X_TENANCY_MISMATCH" in (row.last_error or "") and "org-b" in (row.last_error or "")
    assert calls == [], "the handler never ran under the wrong org"


def test_a_scope_string_on_an_actor_is_not_a_grant() -> None:
    carried = Ctx(actor=Actor(id="x", scopes=frozenset({CROSS_TENANT_SCOPE})))
    assert not carried.holds(CROSS_TENANT_SCOPE)
    with use_ctx(Ctx()) as base, granted(base, CROSS_TENANT_SCOPE, "test") as inner:
        assert inner.holds(CROSS_TENANT_SCOPE) and current_ctx() is inner
    assert not inner.holds(CROSS_TENANT_SCOPE), "revoked when the block ended"


def test_and_where_groups_existing_criteria() -> None:
    t = sa.table("t", sa.column("a"), sa.column("org_id"))
    statement = and_where(sa.select(t).where(sa.text("a IS NULL OR a = 1")), t.c.org_id == "o")
    sql = str(statement)
    assert "(a IS NULL OR a = 1) AND t.org_id = :org_id_1" in sql, sql
