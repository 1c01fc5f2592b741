"""The tenant guard over every statement shape, on a real SQLite file and a real PostgreSQL.

Each case asserts the ROWS an org-a actor sees (or the rows an UPDATE/DELETE touched), not only that
something ran; the same shapes are refused for an actor with no org, and the shapes the guard
cannot prove scoped are refused for everyone but a live cross-tenant grant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from tests.postgres import postgres_schema

from ultimat3.backfill import Batch, backfill, dispose_engines
from ultimat3.core import CROSS_TENANT_SCOPE, Actor, Ctx, Grant, XError
from ultimat3.drivers import create_driver
from ultimat3.jobs import JobDriver, Worker, isolated_registry
from ultimat3.tenancy import scoped, tenanted

metadata = sa.MetaData()
customers = tenanted(sa.Table(
    "tm_customers", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("org_id", sa.String(20), nullable=False),
    sa.Column("email", sa.String(50)),
    sa.Column("parent_id", sa.Integer),
    sa.Column("flag", sa.Integer, nullable=False, default=0),
))
orders = tenanted(sa.Table(
    "tm_orders", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("org_id", sa.String(20), nullable=False),
    sa.Column("customer_id", sa.Integer, nullable=False),
))
plans = sa.Table("tm_plans", metadata, sa.Column("id", sa.Integer, primary_key=True, autoincrement=False))
# The same database table declared again elsewhere (as reflection or another module would).
other_metadata = sa.MetaData()
customers_again = sa.Table(
    "tm_customers", other_metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("org_id", sa.String(20)),
)
declared_view = tenanted(sa.Table(
    "tm_customers_tv", sa.MetaData(), sa.Column("id", sa.Integer), sa.Column("org_id", sa.String(20)),
))
undeclared_view = sa.Table("tm_customers_v", sa.MetaData(), sa.Column("id", sa.Integer))

ORG_A = Ctx(actor=Actor(id="user:a", org_id="org-a"))
NOBODY = Ctx(actor=Actor(id="thread-that-lost-its-request"))
ORG_A_IDS = {1, 3, 5}
ALL_IDS = {1, 2, 3, 4, 5, 6}


def cross() -> Ctx:
    return Ctx(actor=Actor(id="sweeper"), grants=(Grant(CROSS_TENANT_SCOPE, "matrix test"),))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    """(kind, engine) over a seeded app database: odd ids belong to org-a, even ids to org-b."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'app.db'}"
        engine = sa.create_engine(url)
        yield from _seeded("sqlite", url, engine)
        return
    with postgres_schema("x_tenancy") as base:
        url = "postgresql+psycopg" + base[len("postgresql"):]
        engine = sa.create_engine(url)
        yield from _seeded("postgres", base, engine)


def _seeded(kind: str, url: str, engine: Engine) -> Iterator[tuple[str, Engine]]:
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(customers.insert(), [
            {"id": i, "org_id": "org-a" if i % 2 else "org-b", "email": None if i in (1, 2) else f"c{i}@x",
             "parent_id": None if i <= 2 else i - 2, "flag": 0}
            for i in range(1, 7)
        ])
        conn.execute(orders.insert(), [
            {"id": i, "org_id": "org-a" if i % 2 else "org-b", "customer_id": i} for i in range(1, 7)
        ])
        conn.execute(plans.insert(), [{"id": 1}])
        conn.execute(sa.text("CREATE VIEW tm_customers_v AS SELECT id, org_id FROM tm_customers"))
        conn.execute(sa.text("CREATE VIEW tm_customers_tv AS SELECT id, org_id FROM tm_customers"))
    try:
        yield kind, engine
    finally:
        engine.dispose()
        dispose_engines()


def ids(engine: Engine, stmt: Any) -> set[int]:
    with engine.connect() as conn:
        return {row[0] for row in conn.execute(stmt)}


def _recursive() -> sa.Select[Any]:
    roots = sa.select(customers.c.id, customers.c.parent_id).where(customers.c.parent_id.is_(None))
    tree = roots.cte("tree", recursive=True)
    child = customers.alias("child")
    tree = tree.union_all(sa.select(child.c.id, child.c.parent_id).where(child.c.parent_id == tree.c.id))
    return sa.select(tree.c.id)


def _tablesample() -> sa.Select[Any]:
    sample = sa.tablesample(customers, sa.func.bernoulli(100), name="s")
    return sa.select(sample.c.id)


LITE = sa.table("tm_customers", sa.column("id"), sa.column("org_id"))
LITE_NO_ORG = sa.table("tm_customers", sa.column("id"))

#: (case, statement factory, ids an org-a actor sees)
SELECTS: list[tuple[str, Callable[[], Any], set[int]]] = [
    ("plain", lambda: sa.select(customers.c.id), ORG_A_IDS),
    ("text OR criterion", lambda: sa.select(customers.c.id).where(sa.text("email IS NULL OR id > 0")), ORG_A_IDS),
    ("literal_column OR criterion",
     lambda: sa.select(customers.c.id).where(sa.literal_column("id > 100 OR id > 0")), ORG_A_IDS),
    ("or_ criterion", lambda: sa.select(customers.c.id).where(sa.or_(customers.c.id > 100, customers.c.id > 0)),
     ORG_A_IDS),
    ("alias of an alias", lambda: sa.select(customers.alias("c1").alias("c2").c.id), ORG_A_IDS),
    ("alias of an alias of an alias", lambda: sa.select(customers.alias("a").alias("b").alias("c").c.id),
     ORG_A_IDS),
    ("sa.table() with the org column", lambda: sa.select(LITE.c.id), ORG_A_IDS),
    ("sa.table() without the org column", lambda: sa.select(LITE_NO_ORG.c.id), ORG_A_IDS),
    ("a second Table object", lambda: sa.select(customers_again.c.id), ORG_A_IDS),
    ("subquery", lambda: sa.select(sa.select(customers).subquery().c.id), ORG_A_IDS),
    ("cte", lambda: sa.select(sa.select(customers).cte("cc").c.id), ORG_A_IDS),
    ("recursive cte", _recursive, ORG_A_IDS),
    ("join", lambda: sa.select(orders.c.id).join_from(orders, customers, orders.c.customer_id == customers.c.id),
     ORG_A_IDS),
    ("IN subselect", lambda: sa.select(plans.c.id).where(plans.c.id.in_(sa.select(customers.c.id))), {1}),
    ("EXISTS", lambda: sa.select(plans.c.id).where(sa.exists().where(customers.c.id == plans.c.id)), {1}),
    ("union", lambda: sa.union(sa.select(customers.c.id), sa.select(orders.c.id)), ORG_A_IDS),
    ("declared view", lambda: sa.select(declared_view.c.id), ORG_A_IDS),
    ("safe table function", lambda: sa.select(customers.c.id), ORG_A_IDS),
]
#: Shapes the guard cannot prove scoped: refused for an org actor too, allowed under a cross grant.
UNPROVEN: list[tuple[str, Callable[[], Any]]] = [
    ("text() FROM", lambda: sa.select(sa.literal_column("id")).select_from(sa.text("tm_customers"))),
    ("text() subquery source",
     lambda: sa.select(sa.text("SELECT id FROM tm_customers").columns(sa.column("id")).subquery().c.id)),
    ("literal_column holding a subselect",
     lambda: sa.select(plans.c.id, sa.literal_column("(SELECT count(*) FROM tm_customers)"))),
    ("text criterion reading a table",
     lambda: sa.select(plans.c.id).where(sa.text("id IN (SELECT id FROM tm_customers)"))),
    ("whole text() statement", lambda: sa.text("SELECT id FROM tm_customers")),
    ("undeclared view", lambda: sa.select(undeclared_view.c.id)),
    ("unknown table function", lambda: sa.select(sa.func.all_customers().table_valued("id"))),
]


@pytest.mark.parametrize(("case", "build", "expected"), SELECTS, ids=[c[0] for c in SELECTS])
def test_an_org_actor_sees_only_its_rows(app: tuple[str, Engine], case: str, build: Callable[[], Any],
                                        expected: set[int]) -> None:
    _, engine = app
    assert ids(engine, scoped(build(), ORG_A, bind=engine)) == expected


@pytest.mark.parametrize(("case", "build", "expected"), SELECTS, ids=[c[0] for c in SELECTS])
def test_an_actor_with_no_org_is_refused(app: tuple[str, Engine], case: str, build: Callable[[], Any],
                                        expected: set[int]) -> None:
    _, engine = app
    with pytest.raises(XError) as caught:
        scoped(build(), NOBODY, bind=engine)
    assert caught.value.code == "X_TENANCY_CROSS_DENIED" and caught.value.hint


@pytest.mark.parametrize(("case", "build"), UNPROVEN, ids=[c[0] for c in UNPROVEN])
def test_what_the_guard_cannot_prove_is_refused(app: tuple[str, Engine], case: str,
                                               build: Callable[[], Any]) -> None:
    _, engine = app
    for ctx in (ORG_A, NOBODY):
        with pytest.raises(XError) as caught:
            scoped(build(), ctx, bind=engine)
        assert caught.value.code == "X_TENANCY_UNPROVEN", case
        assert "cross_tenant" in caught.value.hint
    # Under a live cross-tenant grant the statement is the author's to answer for.
    assert scoped(build(), cross(), bind=engine) is not None


def test_tablesample_is_followed_to_its_table(app: tuple[str, Engine]) -> None:
    kind, engine = app
    statement = scoped(_tablesample(), ORG_A, bind=engine)
    assert "s.org_id" in str(statement)
    if kind == "postgres":  # SQLite has no TABLESAMPLE
        assert ids(engine, statement) == ORG_A_IDS


def test_a_cross_grant_reads_every_org(app: tuple[str, Engine]) -> None:
    _, engine = app
    assert ids(engine, scoped(sa.select(customers.c.id), cross(), bind=engine)) == ALL_IDS
    assert ids(engine, scoped(sa.select(undeclared_view.c.id), cross(), bind=engine)) == ALL_IDS


def test_a_revoked_grant_reads_nothing(app: tuple[str, Engine]) -> None:
    _, engine = app
    kept = cross()
    kept.grants[0].revoke()
    with pytest.raises(XError) as caught:
        scoped(sa.select(customers.c.id), kept, bind=engine)
    assert caught.value.code == "X_TENANCY_CROSS_DENIED"


def _flagged(engine: Engine) -> set[int]:
    return ids(engine, sa.select(customers.c.id).where(customers.c.flag == 1))


def test_update_and_delete_are_scoped(app: tuple[str, Engine]) -> None:
    _, engine = app
    update = sa.update(customers).where(sa.text("email IS NULL OR id > 0")).values(flag=1)
    with engine.begin() as conn:
        conn.execute(scoped(update, ORG_A, bind=engine))
    assert _flagged(engine) == ORG_A_IDS
    delete = sa.delete(orders).where(sa.or_(orders.c.id > 100, orders.c.id > 0))
    with engine.begin() as conn:
        conn.execute(scoped(delete, ORG_A, bind=engine))
    assert ids(engine, sa.select(orders.c.id)) == {2, 4, 6}
    for statement in (update, delete, sa.insert(customers).values(id=9, org_id="org-a")):
        with pytest.raises(XError) as caught:
            scoped(statement, NOBODY, bind=engine)
        assert caught.value.code == "X_TENANCY_CROSS_DENIED"


def test_an_insert_for_another_org_is_refused(app: tuple[str, Engine]) -> None:
    _, engine = app
    with pytest.raises(XError) as caught:
        scoped(sa.insert(customers).values(id=9, org_id="org-b", flag=0), ORG_A, bind=engine)
    assert caught.value.code == "X_TENANCY_MISMATCH"
    with engine.begin() as conn:
        conn.execute(scoped(sa.insert(customers).values(id=9, org_id="org-a", flag=0), ORG_A, bind=engine))
    assert 9 in ids(engine, sa.select(customers.c.id))


# -- through real passes run by a worker ---------------------------------------------------------------


@pytest.fixture
def driver(app: tuple[str, Engine], tmp_path: Path) -> Iterator[JobDriver]:
    built = create_driver("memory://")
    try:
        yield built
    finally:
        built.close()


def run(driver: JobDriver) -> None:
    worker = Worker(driver, environment="test", concurrency=1)
    try:
        asyncio.run(worker.drain())
    finally:
        worker.close()


def no_wait(seconds: float, signal: Any) -> None:
    return None


SOURCES: list[tuple[str, Callable[[Ctx], Any], str | None]] = [
    ("text OR criterion", lambda ctx: sa.select(customers.c.id).where(sa.text("email IS NULL OR id > 0")), None),
    ("literal_column OR criterion",
     lambda ctx: sa.select(customers.c.id).where(sa.literal_column("id > 100 OR id > 0")), None),
    ("or_ criterion",
     lambda ctx: sa.select(customers.c.id).where(sa.or_(customers.c.email.is_(None), customers.c.id > 0)), None),
    ("subquery", lambda ctx: sa.select(sa.select(customers).subquery("sq").c.id), "id"),
    ("cte", lambda ctx: sa.select(sa.select(customers).cte("cc").c.id), "id"),
    ("alias of an alias", lambda ctx: sa.select(customers.alias("c1").alias("c2").c.id), None),
]


@pytest.mark.parametrize(("case", "source", "key"), SOURCES, ids=[c[0] for c in SOURCES])
def test_a_tenanted_backfill_handles_only_its_org(app: tuple[str, Engine], driver: JobDriver, case: str,
                                                 source: Callable[[Ctx], Any], key: str | None) -> None:
    _, engine = app
    handled: list[int] = []
    with isolated_registry():
        # batch=1: every page after the first carries the cursor condition, which must not be
        # swallowed by an OR in the source's own criteria either.
        sweep = backfill(name="tm.sweep", tenant=lambda _input: "org-a", source=source, key=key,
                         handle=lambda batch: handled.extend(row[0] for row in batch.rows),
                         batch=1, rate=1000, engine=engine, sleep=no_wait)
        queued = sweep.enqueue(driver=driver)
        run(driver)
    row = driver.introspect.get(queued.id)
    assert row is not None and row.state == "done", row.last_error
    assert sorted(handled) == sorted(ORG_A_IDS)


def test_a_kept_batch_ctx_is_refused_after_the_pass(app: tuple[str, Engine], driver: JobDriver) -> None:
    _, engine = app
    kept: list[Ctx] = []
    seen_inside: list[set[int]] = []

    def handle(batch: Batch) -> None:
        kept.append(batch.ctx)
        seen_inside.append(ids(engine, scoped(sa.select(customers.c.id), batch.ctx, bind=engine)))

    with isolated_registry():
        sweep = backfill(name="tm.every_org", tenant="none", source=lambda ctx: sa.select(customers.c.id),
                         handle=handle, batch=10, rate=1000, engine=engine, sleep=no_wait)
        queued = sweep.enqueue(driver=driver)
        run(driver)
    row = driver.introspect.get(queued.id)
    assert row is not None and row.state == "done", row.last_error
    assert seen_inside == [ALL_IDS], "inside the pass the grant reads every org"
    with pytest.raises(XError) as caught:
        scoped(sa.select(customers.c.id), kept[0], bind=engine)
    assert caught.value.code == "X_TENANCY_CROSS_DENIED"


def test_a_source_over_a_missing_table_refuses_naming_it(app: tuple[str, Engine], driver: JobDriver) -> None:
    _, engine = app
    ghost = sa.Table("tm_not_here", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    with isolated_registry():
        sweep = backfill(name="tm.ghost", tenant="none", source=lambda ctx: sa.select(ghost.c.id),
                         handle=lambda batch: None, rate=1000, engine=engine, sleep=no_wait)
        queued = sweep.enqueue(driver=driver)
        run(driver)
    row = driver.introspect.get(queued.id)
    assert row is not None and row.state == "dead"
    assert "X_BACKFILL_TABLE_MISSING" in (row.last_error or "") and "tm_not_here" in (row.last_error or "")
    assert "engine=" in (row.last_error or "")
