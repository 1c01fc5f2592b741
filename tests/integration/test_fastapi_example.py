"""The FastAPI example over HTTP (httpx against the ASGI app), on SQLite (aiosqlite) and PostgreSQL
(async psycopg, which takes the test schema's search_path from the URL): an order and its
confirmation job commit together; a failure after the enqueue leaves neither."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from tests.drivers import SHARED_KINDS, database_url

from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import JobFilter


def fresh_app() -> Any:
    """The example's app, its module (re)imported into this test's job registry."""
    import importlib
    import sys

    name = "examples.fastapi_orders.app"
    module = importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
    return module.app


@pytest.fixture(params=SHARED_KINDS)
def urls(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with database_url(request.param, tmp_path, prefix="x_fastapi") as url:
        monkeypatch.setenv("X_DATABASE_URL", url)
        if not url.startswith("sqlite:///"):
            monkeypatch.setenv("ORDERS_DATABASE_URL", "postgresql+psycopg" + url[url.index("://"):])
        yield url


def test_an_order_and_its_confirmation_commit_together_or_not_at_all(urls: str) -> None:
    url = urls
    create_driver(url).close()  # the job store's tables, as `x db migrate` would make them
    app = fresh_app()

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                ok = await client.post("/orders", json={"email": "ann@example.com", "total_cents": 1200},
                                       headers={"X-Org": "acme"})
                failed = await client.post("/orders", json={"email": "bob@example.com", "total_cents": 900,
                                                            "fail_after_enqueue": True}, headers={"X-Org": "acme"})
        return ok, failed

    ok, failed = asyncio.run(scenario())
    assert ok.status_code == 201, ok.text
    assert failed.status_code == 500
    driver = create_driver(url)
    try:
        jobs = driver.introspect.list(JobFilter(name="orders.confirm"))
        assert [(j.id, j.tenant_id, j.payload["email"]) for j in jobs] == [
            (ok.json()["confirmation_job"], "acme", "ann@example.com")]
    finally:
        driver.close()
    engine = create_engine(url if url.startswith("sqlite") else "postgresql+psycopg" + url[url.index("://"):])
    try:
        with engine.connect() as conn:
            emails = [row[0] for row in conn.execute(text("SELECT email FROM shop_orders ORDER BY id"))]
    finally:
        engine.dispose()
    assert emails == ["ann@example.com"]


def test_a_worker_inside_the_app_sends_the_confirmation(urls: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = urls
    create_driver(url).close()
    monkeypatch.setenv("ORDERS_IN_PROCESS_WORKER", "1")
    app = fresh_app()

    async def scenario() -> dict[str, object]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                made = (await client.post("/orders", json={"email": "cy@example.com", "total_cents": 500},
                                          headers={"X-Org": "acme"})).json()
            driver = app.state.driver
            for _ in range(500):  # the in-app worker picks it up within a poll (NOTIFY on PostgreSQL)
                job = driver.introspect.get(str(made["confirmation_job"]))
                if job is not None and job.state == "done":
                    return {"result": job.result}
                await asyncio.sleep(0.02)
        return {"result": None}

    outcome = asyncio.run(scenario())
    assert outcome["result"] is not None and "sent to cy@example.com" in str(outcome["result"])
