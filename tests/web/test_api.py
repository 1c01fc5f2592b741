"""The dashboard over HTTP (Starlette's test client, no browser): every page, the JSON API's shapes,
escaping, the security headers, read-only mode, the token, sessions and CSRF, and every bad input
answered with one coded refusal."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.cli import cli_app
from tests.web.conftest import TOKEN
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import ClaimRequest, JobDriver, NackRequest
from ultimat3.web import create_app
from ultimat3.web.security import CONTENT_SECURITY_POLICY, SESSION_COOKIE

PAGES = ["/", "/jobs", "/backfills", "/workers", "/schedules", "/limits", "/login"]
APIS = ["/api/overview", "/api/jobs", "/api/backfills", "/api/workers", "/api/schedules", "/api/limits"]
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def ping(driver: JobDriver, n: int = 1, org: str = "org1") -> str:
    return cli_app.ping.enqueue({"org_id": org, "n": n}, driver=driver).id


def claim(driver: JobDriver, worker: str = "web-test-worker") -> str:
    [claimed] = driver.claim(ClaimRequest(worker_id=worker, limit=1, visibility_timeout=300))
    return claimed.job.id


def refused(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    if response.headers["content-type"].startswith("application/json"):
        assert response.json()["error"]["code"] == code
        assert response.json()["error"]["hint"]
    else:
        assert code in response.text


def sign_in(client: TestClient) -> str:
    """Sign in through the form; returns the CSRF token the pages then carry."""
    response = client.post("/login", data={"token": TOKEN, "next": "/jobs"}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/jobs"
    cookie = response.headers["set-cookie"]
    assert SESSION_COOKIE in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert TOKEN not in cookie
    page = client.get("/jobs").text
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert match, "a signed-in page carries the CSRF token in its forms"
    return match.group(1)


def test_every_page_renders_with_the_security_headers(read_only: TestClient, driver: JobDriver) -> None:
    job_id = ping(driver)
    for path in [*PAGES, f"/jobs/{job_id}", "/backfills/cli.shout"]:
        response = read_only.get(path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "<script src=\"/static/app.js\"" in response.text
        assert "<script>" not in response.text  # no inline script, ever
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    static = read_only.get("/static/app.js")
    assert static.status_code == 200 and "X-Partial" in static.text


def test_a_partial_refresh_renders_only_the_main_content(read_only: TestClient, driver: JobDriver) -> None:
    ping(driver)
    whole = read_only.get("/jobs").text
    part = read_only.get("/jobs", headers={"X-Partial": "1"}).text
    assert "<html" in whole and "<html" not in part and "<nav>" not in part
    assert "cli.ping" in part


def test_overview_counts_queues_and_charts_completions(read_only: TestClient, driver: JobDriver) -> None:
    done = ping(driver)
    claimed = claim(driver)
    assert claimed == done
    assert driver.ack(done, _token(driver, done), 1)
    ping(driver)
    running = ping(driver)
    assert claim(driver) != done
    data = read_only.get("/api/overview").json()
    [queue] = data["queues"]
    assert queue["queue"] == "default"
    assert queue["counts"]["done"] == 1 and queue["counts"]["running"] == 1 and queue["counts"]["ready"] == 1
    assert queue["done_last_hour"] == 1 and queue["due"] == 1 and queue["oldest_due_age"] is not None
    assert len(data["minutes"]) == len(data["completed_per_minute"]) == 60
    assert data["completed_per_minute"][-1] == 1 and sum(data["completed_per_minute"]) == 1
    assert queue["completed_per_minute"][-1] == 1
    page = read_only.get("/").text
    assert "<rect" in page and 'data-queue="default"' in page
    assert running


def _token(driver: JobDriver, job_id: str) -> str:
    """The claim token of a running job (read from the store, as a worker would hold it)."""
    import sqlite3

    url = _url(driver)
    if url.startswith("sqlite"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            token = conn.execute("SELECT claim_token FROM x_jobs WHERE id = ?", (job_id,)).fetchone()[0]
        conn.close()
        return str(token)
    import psycopg

    with psycopg.connect(url) as pg:
        row = pg.execute("SELECT claim_token FROM x_jobs WHERE id = %s", (job_id,)).fetchone()
        assert row is not None
        return str(row[0])


def _url(driver: JobDriver) -> str:
    import os

    return os.environ["X_DATABASE_URL"]


def test_jobs_filter_and_page_by_keyset(read_only: TestClient, driver: JobDriver) -> None:
    ids = [ping(driver, n, org=f"org{n % 2}") for n in range(7)]
    first = read_only.get("/api/jobs", params={"limit": 3}).json()
    assert [j["id"] for j in first["jobs"]] == list(reversed(ids))[:3] and first["next"] == ids[4]
    seen = [j["id"] for j in first["jobs"]]
    cursor = first["next"]
    while cursor:
        page = read_only.get("/api/jobs", params={"limit": 3, "before": cursor}).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next"]
    assert seen == list(reversed(ids))
    org1 = read_only.get("/api/jobs", params={"tenant": "org1"}).json()["jobs"]
    assert {j["tenant_id"] for j in org1} == {"org1"} and len(org1) == 3
    assert read_only.get("/api/jobs", params={"state": "done"}).json()["jobs"] == []
    assert len(read_only.get("/api/jobs", params={"name": "cli.*", "queue": "default"}).json()["jobs"]) == 7
    html = read_only.get("/jobs", params={"limit": 3}).text
    assert 'rel="next"' in html and f"before={ids[4]}" in html
    found = read_only.get("/jobs", params={"id": ids[2]}, follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"] == f"/jobs/{ids[2]}"


def test_jobs_filter_by_error_code_or_text(read_only: TestClient, driver: JobDriver) -> None:
    kept = ping(driver, 1)
    failed = claim(driver, "error-filter-worker")
    assert failed == kept
    driver.nack(failed, _token(driver, failed), NackRequest(error="X_PAYMENT_DOWN: provider is down"))
    ping(driver, 2)
    for needle in ("X_PAYMENT_DOWN", "provider is down"):
        [found] = read_only.get("/api/jobs", params={"error": needle}).json()["jobs"]
        assert found["id"] == failed
    assert read_only.get("/api/jobs", params={"error": "X_OTHER"}).json()["jobs"] == []
    assert 'value="X_PAYMENT_DOWN"' in read_only.get("/jobs", params={"error": "X_PAYMENT_DOWN"}).text


@pytest.mark.parametrize(("params", "code"), [
    ({"state": "bogus"}, "X_WEB_FILTER"), ({"limit": "0"}, "X_WEB_FILTER"), ({"limit": "many"}, "X_WEB_FILTER"),
])
def test_a_bad_filter_is_one_coded_refusal(read_only: TestClient, params: dict[str, str], code: str) -> None:
    refused(read_only.get("/api/jobs", params=params), 400, code)
    page = read_only.get("/jobs", params=params)
    assert page.status_code == 400 and code in page.text and "Traceback" not in page.text


def test_unknown_things_are_404_coded(read_only: TestClient) -> None:
    refused(read_only.get("/api/jobs/no-such-job"), 404, "X_JOB_NOT_FOUND")
    refused(read_only.get("/jobs/no-such-job"), 404, "X_JOB_NOT_FOUND")
    refused(read_only.get("/api/backfills/no.such"), 404, "X_BACKFILL_UNKNOWN")
    refused(read_only.get("/backfills/no.such"), 404, "X_BACKFILL_UNKNOWN")


def test_job_detail_shows_input_attempts_steps_and_why(read_only: TestClient, driver: JobDriver) -> None:
    job_id = ping(driver, 5)
    claim(driver, "first-worker")
    assert driver.nack(job_id, _token(driver, job_id), NackRequest(error="RuntimeError: first try failed"))
    detail = read_only.get(f"/api/jobs/{job_id}").json()
    assert detail["job"]["payload"] == {"org_id": "org1", "n": 5}
    assert [(a["attempt"], a["outcome"], a["worker_id"]) for a in detail["attempts"]] == [(1, "failed", "first-worker")]
    assert detail["attempts"][0]["error"] == "RuntimeError: first try failed"
    assert detail["why"] and detail["why"][0]["code"]
    page = read_only.get(f"/jobs/{job_id}").text
    assert "first-worker" in page and "first try failed" in page and "Attempts" in page


def test_every_database_value_is_escaped(read_only: TestClient, driver: JobDriver) -> None:
    from ultimat3.drivers.protocol import WorkerInfo

    evil = "<script>alert(1)</script>"
    job_id = cli_app.ping.enqueue({"org_id": evil, "n": 1}, driver=driver).id
    claim(driver, evil)
    driver.nack(job_id, _token(driver, job_id), NackRequest(error=f'{evil}"><img src=x onerror=alert(2)>'))
    driver.workers.register(WorkerInfo(id=evil, host=evil, pid=1, concurrency=1))
    try:
        for path in [f"/jobs/{job_id}", "/jobs", "/workers", f"/jobs?tenant={evil}"]:
            page = read_only.get(path).text
            assert evil not in page and "<img src=x" not in page, path
            assert "&lt;script&gt;" in page, path
    finally:
        driver.workers.unregister(evil)


def test_backfills_show_checksum_gate_progress_and_quarantine(read_only: TestClient, driver: JobDriver) -> None:
    listed = read_only.get("/api/backfills").json()["backfills"]
    shout = next(b for b in listed if b["name"] == "cli.shout")
    assert shout["pending"] == "never-run" and shout["checksum"] and shout["latest"] is None
    run = driver.backfills.start("run-web-1", "cli.shout", shout["checksum"], None)
    driver.backfills.progress(run.run_id, 1, 50, throttle="oldest transaction open 300 s")
    key = '{"cursor": 7, "cursor_type": "int"}'
    driver.backfills.quarantine(run.run_id, "cli.shout", 1, [(key, "<b>bad</b> row")], [])
    one = read_only.get("/api/backfills/cli.shout").json()
    [p] = one["passes"]
    assert p["status"] == "running" and p["rows"] == 50 and p["total"] == 200 and p["percent"] == 25.0
    assert p["throttle"] == "oldest transaction open 300 s"
    assert one["quarantined"] == 1 and one["failures"][0]["reason"] == "<b>bad</b> row"
    page = read_only.get("/backfills/cli.shout").text
    assert 'value="25.0"' in page and "held: oldest transaction open 300 s" in page
    assert "&lt;b&gt;bad&lt;/b&gt; row" in page


def test_workers_schedules_and_limits(read_only: TestClient, driver: JobDriver) -> None:
    from ultimat3.drivers.protocol import WorkerInfo

    driver.workers.register(WorkerInfo(id="web-w1", host="box", pid=1, concurrency=4))
    try:
        held = cli_app.sync.enqueue({"org_id": "org1", "n": 1}, driver=driver).id
        waiting = cli_app.sync.enqueue({"org_id": "org1", "n": 2}, driver=driver).id
        cli_app.mail.enqueue({"org_id": "org1", "n": 1}, driver=driver)
        [claimed] = driver.claim(ClaimRequest(worker_id="web-w1", limit=1, flow=True, names=("cli.sync",)))
        assert claimed.job.id == held
        workers = read_only.get("/api/workers").json()["workers"]
        [w] = [w for w in workers if w["id"] == "web-w1"]
        assert w["running"][0]["id"] == held and w["concurrency"] == 4
        limits = read_only.get("/api/limits").json()
        [slot] = limits["slots"]
        assert slot["max"] == 1 and [h["id"] for h in slot["holders"]] == [held] and slot["waiting"] == 1
        [rate] = limits["rates"]
        assert rate["per_second"] == pytest.approx(1 / 3600) and rate["waiting"] == 1
        schedules = read_only.get("/api/schedules").json()["schedules"]
        assert {s["name"] for s in schedules} >= {"nightly", "hourly"} or len(schedules) >= 2
        assert all(s["next_fire"] for s in schedules if s["declared"])
        assert waiting in read_only.get("/api/jobs", params={"state": "ready"}).text
        assert "web-w1" in read_only.get("/limits").text
    finally:
        driver.workers.unregister("web-w1")


def test_read_only_refuses_every_action(read_only: TestClient, driver: JobDriver) -> None:
    job_id = ping(driver)
    refused(read_only.post(f"/api/jobs/{job_id}/cancel", headers=BEARER), 403, "X_WEB_READ_ONLY")
    refused(read_only.post(f"/jobs/{job_id}/cancel", data={"csrf": "x"}), 403, "X_WEB_READ_ONLY")
    refused(read_only.post("/api/backfills/cli.shout/start", headers=BEARER), 403, "X_WEB_READ_ONLY")
    assert driver.introspect.get(job_id).state == "ready"  # type: ignore[union-attr]
    assert "read-only" in read_only.get(f"/jobs/{job_id}").text
    assert 'id="cancel"' not in read_only.get(f"/jobs/{job_id}").text


def test_api_actions_need_the_bearer_token(client: TestClient, driver: JobDriver) -> None:
    job_id = ping(driver)
    refused(client.post(f"/api/jobs/{job_id}/cancel"), 403, "X_WEB_FORBIDDEN")
    refused(client.post(f"/api/jobs/{job_id}/cancel", headers={"Authorization": "Bearer wrong-token-123456789"}),
            403, "X_WEB_FORBIDDEN")
    assert driver.introspect.get(job_id).state == "ready"  # type: ignore[union-attr]
    cancelled = client.post(f"/api/jobs/{job_id}/cancel", headers=BEARER)
    assert cancelled.status_code == 200 and cancelled.json()["job"]["state"] == "cancelled"
    refused(client.post(f"/api/jobs/{job_id}/cancel", headers=BEARER), 400, "X_JOB_NOT_CANCELLABLE")
    retried = client.post(f"/api/jobs/{job_id}/retry", headers=BEARER)
    assert retried.status_code == 200 and retried.json()["job"]["state"] == "ready"
    refused(client.post(f"/api/jobs/{job_id}/retry", headers=BEARER), 400, "X_JOB_NOT_RETRYABLE")
    refused(client.post("/api/jobs/nope/cancel", headers=BEARER), 404, "X_JOB_NOT_FOUND")
    audit = driver.audit.list()
    assert [(e.action, e.actor, e.status) for e in audit[:2]] == [("retry", "web:token", "completed"),
                                                                  ("cancel", "web:token", "completed")]


def test_start_a_pending_backfill(client: TestClient, driver: JobDriver) -> None:
    started = client.post("/api/backfills/cli.shout/start", headers=BEARER)
    assert started.status_code == 200, started.text
    assert started.json()["name"] == "cli.shout" and driver.introspect.get(started.json()["job_id"]) is not None
    refused(client.post("/api/backfills/cli.staging_only/start", headers=BEARER), 400, "X_BACKFILL_ENVIRONMENT")
    refused(client.post("/api/backfills/cli.needs_migration/start", headers=BEARER), 400, "X_BACKFILL_REQUIRES")
    refused(client.post("/api/backfills/no.such/start", headers=BEARER), 404, "X_BACKFILL_UNKNOWN")


def test_forms_need_a_session_a_csrf_token_and_the_same_origin(client: TestClient, driver: JobDriver) -> None:
    job_id = ping(driver)
    refused(client.post(f"/jobs/{job_id}/cancel", data={"csrf": "0" * 64}), 403, "X_WEB_FORBIDDEN")
    wrong = client.post("/login", data={"token": "not-the-token-at-all"})
    assert wrong.status_code == 403 and "X_WEB_FORBIDDEN" in wrong.text
    csrf = sign_in(client)
    refused(client.post(f"/jobs/{job_id}/cancel", data={}), 403, "X_WEB_FORBIDDEN")
    refused(client.post(f"/jobs/{job_id}/cancel", data={"csrf": "f" * 64}), 403, "X_WEB_FORBIDDEN")
    refused(client.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf}, headers={"Origin": "https://evil.example"}),
            403, "X_WEB_FORBIDDEN")
    assert driver.introspect.get(job_id).state == "ready"  # type: ignore[union-attr]
    done = client.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf}, headers={"Origin": "http://127.0.0.1:8080"},
                       follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/jobs/{job_id}?notice=cancelled"
    assert driver.introspect.get(job_id).state == "cancelled"  # type: ignore[union-attr]
    # The session's CSRF token also works as a header for the page's own scripts.
    again = client.post(f"/api/jobs/{job_id}/retry", headers={"X-CSRF-Token": csrf})
    assert again.status_code == 200
    # A redirect after sign-in never leaves the site.
    for elsewhere in ("//evil.example/x", "/\\evil.example", "https://evil.example/", "javascript:alert(1)"):
        away = client.post("/login", data={"token": TOKEN, "next": elsewhere}, follow_redirects=False)
        assert away.headers["location"] == "/", elsewhere


def test_a_short_token_is_refused(driver: JobDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(XError) as short:
        create_app(driver, token="short")
    assert short.value.code == "X_WEB_TOKEN" and short.value.hint
    monkeypatch.setenv("X_WEB_TOKEN", TOKEN)
    with TestClient(create_app(driver), base_url="http://127.0.0.1") as from_env:
        assert "sign in" in from_env.get("/").text


def test_mounted_under_a_prefix_every_link_and_redirect_keeps_it(driver: JobDriver) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/ops/jobs-admin", app=create_app(driver, token=TOKEN, environment="test"))])
    job_id = ping(driver)
    with TestClient(host, base_url="http://127.0.0.1:8080") as mounted:
        page = mounted.get(f"/ops/jobs-admin/jobs/{job_id}").text
        links = re.findall(r'(?:href|src|action)="(/[^"]*)"', page)
        assert links and all(link.startswith("/ops/jobs-admin/") for link in links), links
        assert mounted.get("/ops/jobs-admin/static/app.js").status_code == 200
        assert mounted.get("/ops/jobs-admin/api/overview").json()["queues"]
        signed = mounted.post("/ops/jobs-admin/login", data={"token": TOKEN, "next": f"/jobs/{job_id}"},
                              follow_redirects=False)
        assert signed.headers["location"] == f"/ops/jobs-admin/jobs/{job_id}"
        assert "Path=/ops/jobs-admin/" in signed.headers["set-cookie"]
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', mounted.get(f"/ops/jobs-admin/jobs/{job_id}").text)
        assert csrf is not None
        done = mounted.post(f"/ops/jobs-admin/jobs/{job_id}/cancel", data={"csrf": csrf.group(1)},
                            follow_redirects=False)
        assert done.headers["location"] == f"/ops/jobs-admin/jobs/{job_id}?notice=cancelled"
        assert 'aria-current="page" ' not in page and 'aria-current="page">Jobs' in page
