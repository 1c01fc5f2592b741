"""The dashboard in a real Chromium: every page opens without a script error, a running job is
cancelled with a click and its state changes, a running backfill's bar advances while the page is
open, the read-only dashboard refuses an action, and a stored <script> stays text."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Served
from tests.cli import cli_app
from tests.web.conftest import TOKEN
from ultimat3.backfill.registry import registered_backfills
from ultimat3.drivers.protocol import ClaimRequest, WorkerInfo

# The first test of a fresh machine installs Chromium (apt-get) inside its setup.
pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

PAGES = [("Overview", "/"), ("Jobs", "/jobs"), ("Backfills", "/backfills"), ("Workers", "/workers"),
         ("Schedules", "/schedules"), ("Limits", "/limits")]


def sign_in(page: Any, served: Served, then: str = "/") -> None:
    page.goto(f"{served.url}/login?next={then}")
    page.fill("input[name=token]", TOKEN)
    page.click("form.login button")
    page.wait_for_url(f"{served.url}{then}")


def running_job(served: Served, worker: str = "browser-worker") -> str:
    job_id = cli_app.ping.enqueue({"org_id": "org1", "n": 3}, driver=served.driver).id
    [claimed] = served.driver.claim(ClaimRequest(worker_id=worker, limit=1, visibility_timeout=600))
    assert claimed.job.id == job_id
    return job_id


def test_every_page_opens_from_the_navigation(page: Any, dashboard: Served) -> None:
    dashboard.driver.workers.register(WorkerInfo(id="browser-worker", host="box", pid=1, concurrency=2))
    try:
        job_id = running_job(dashboard)
        page.goto(dashboard.url + "/")
        for label, path in PAGES:
            page.click(f"header nav >> text={label}")
            page.wait_for_url(dashboard.url + path)
            assert page.locator("main h1").first.is_visible()
        page.goto(f"{dashboard.url}/workers")
        page.click(f"a[href='/jobs/{job_id}']")
        page.wait_for_url(f"{dashboard.url}/jobs/{job_id}")
        assert page.locator("#job-state").inner_text() == "running"
        assert "browser-worker" in page.locator("table.attempts").inner_text()
        page.goto(f"{dashboard.url}/backfills")
        page.click("a[href='/backfills/cli.shout']")
        assert "pending: never-run" in page.locator("main h1").inner_text()
    finally:
        dashboard.driver.workers.unregister("browser-worker")


def test_cancel_a_running_job_and_see_its_state_change(page: Any, dashboard: Served) -> None:
    job_id = running_job(dashboard)
    sign_in(page, dashboard, then=f"/jobs/{job_id}")
    assert page.locator("#job-state").inner_text() == "running"
    page.click("#cancel")  # confirms through the dialog handler
    page.wait_for_url(re.compile(r".*notice=cancelled"))
    assert page.locator("#job-state").inner_text() == "cancelled"
    assert page.locator(".notice").inner_text() == "cancelled"
    assert dashboard.driver.introspect.get(job_id).state == "cancelled"  # type: ignore[union-attr]
    assert "cancelled" in page.locator("table.attempts").inner_text()
    # Retry from the same page, then watch a change made elsewhere arrive without a reload.
    page.click("#retry")
    page.wait_for_url(re.compile(r".*notice=ready"))
    served_elsewhere = dashboard.driver.cancel(job_id, "by another operator")
    assert served_elsewhere is not None
    # (Polled from Playwright's side: the page's CSP refuses the eval a wait_for_function would need.)
    expect(page.locator("#job-state")).to_have_text("cancelled", timeout=10_000)


def test_a_running_backfills_bar_advances_live(page: Any, dashboard: Served) -> None:
    ledger = dashboard.driver.backfills
    checksum = next(b.checksum for b in registered_backfills() if b.name == "cli.shout")
    run = ledger.start("browser-pass", "cli.shout", checksum, None)
    ledger.progress(run.run_id, 1, 20)
    page.goto(f"{dashboard.url}/backfills/cli.shout")
    bar = page.locator(f"[data-run='{run.run_id}'] progress")
    assert float(bar.get_attribute("value")) == pytest.approx(10.0)
    ledger.progress(run.run_id, 5, 100, throttle="lock waiters on cli_widgets: 2")
    expect(bar).to_have_attribute("value", "50.0", timeout=10_000)
    assert "held: lock waiters on cli_widgets: 2" in page.locator(f"[data-run='{run.run_id}']").inner_text()
    assert "ETA" in page.locator(f"[data-run='{run.run_id}']").inner_text()


def test_the_read_only_dashboard_refuses_an_action(page: Any, read_only_dashboard: Served) -> None:
    job_id = running_job(read_only_dashboard)
    page.goto(f"{read_only_dashboard.url}/jobs/{job_id}")
    assert page.locator("#cancel").count() == 0
    assert page.locator("header .mode").inner_text().startswith("read-only")
    # Even a hand-made request from the page is refused, coded.
    answer = page.evaluate(f"""fetch('/api/jobs/{job_id}/cancel', {{method: 'POST'}})
        .then(r => r.json().then(body => [r.status, body.error.code]))""")
    assert answer == [403, "X_WEB_READ_ONLY"]
    assert read_only_dashboard.driver.introspect.get(job_id).state == "running"  # type: ignore[union-attr]


def test_a_stored_script_stays_text(page: Any, read_only_dashboard: Served) -> None:
    evil = "<script>alert('x')</script><img src=x onerror=alert(1)>"
    job_id = cli_app.ping.enqueue({"org_id": evil, "n": 1}, driver=read_only_dashboard.driver).id
    page.goto(f"{read_only_dashboard.url}/jobs/{job_id}")
    assert evil in page.locator("pre.payload").first.inner_text()
    page.goto(f"{read_only_dashboard.url}/jobs")
    page.wait_for_timeout(2500)  # one live refresh swaps the table in with innerHTML: still no script runs
    assert page.locator("main img").count() == 0
