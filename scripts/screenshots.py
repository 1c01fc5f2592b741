"""Regenerate the dashboard screenshots in docs/ (run by hand: `.venv/bin/python scripts/screenshots.py`).

Builds a demo job store in a temporary SQLite file -- an hour of completions, failures, a dead job,
limits, workers and a backfill pass halfway through -- serves the dashboard over it and has
Debian's Chromium (the browser tests install it) photograph the overview and the backfill page.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    """Build the demo data, serve it, take both screenshots."""
    from playwright.sync_api import sync_playwright
    from tests.browser.conftest import _install_chromium, serve
    from tests.cli import cli_app

    from ultimat3.backfill.registry import registered_backfills
    from ultimat3.core.clock import ManualClock
    from ultimat3.drivers import create_driver
    from ultimat3.drivers.protocol import ClaimRequest, NackRequest, WorkerInfo

    folder = Path(tempfile.mkdtemp(prefix="x-shots-"))
    url = f"sqlite:///{folder / 'x.db'}"
    os.environ["X_DATABASE_URL"] = url
    cli_app.seed(1000)
    clock = ManualClock(time.time() - 3600)
    past = create_driver(url, clock=clock)
    checksum = next(b.checksum for b in registered_backfills() if b.name == "cli.shout")
    for minute in range(60):
        if minute == 57:
            run = past.backfills.start("demo-pass-7f3a", "cli.shout", checksum, None)
        for n in range(5 + (minute * 7) % 23):
            cli_app.ping.enqueue({"org_id": f"org{n % 3}", "n": n}, driver=past)
            [claimed] = past.claim(ClaimRequest(worker_id="worker-a1", limit=1))
            if n % 17 == 16:
                past.nack(claimed.job.id, claimed.claim_token, NackRequest(
                    error="TimeoutError: mail relay did not answer", dead_letter=True))
            else:
                past.ack(claimed.job.id, claimed.claim_token, n)
        clock.advance(60)
    past.close()
    driver = create_driver(url)
    for worker in ("worker-a1", "worker-b2"):
        driver.workers.register(WorkerInfo(id=worker, host="app-1", pid=4000 + len(worker), concurrency=10))
    for n in range(40):
        cli_app.ping.enqueue({"org_id": "org1", "n": n}, driver=driver)
    driver.claim(ClaimRequest(worker_id="worker-b2", limit=6))
    driver.backfills.progress(run.run_id, 46, 4600 // 10)
    driver.backfills.quarantine(run.run_id, "cli.shout", 3, [('{"cursor": 291, "cursor_type": "int"}',
                                                             "ValueError: label is not valid UTF-8")], [])
    with sync_playwright() as playwright, serve(driver, None) as base:
        browser = playwright.chromium.launch(executable_path=_install_chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        for path, name in (("/", "web-overview.png"), ("/backfills/cli.shout", "web-backfill.png")):
            page.goto(base + path)
            page.screenshot(path=str(ROOT / "docs" / name), full_page=False)
            print("wrote", ROOT / "docs" / name)
        browser.close()
    driver.close()


if __name__ == "__main__":
    from ultimat3.tenancy.grants import operator_context

    with operator_context("ops:screenshots", "demo data for the dashboard screenshots"):
        main()
