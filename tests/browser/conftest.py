"""A real Chromium (Debian's, installed here when missing) driven by Playwright, against the
dashboard served by uvicorn on a free port over a SQLite file."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.web.conftest import TOKEN
from ultimat3.backfill import dispose_engines
from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import JobDriver
from ultimat3.web import create_app

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"


def _install_chromium() -> str:
    """Debian's chromium, installed with apt-get on first use (the README's one test command must
    work on a fresh machine). Failing to install fails the tests: a browser test is never skipped."""
    found = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                                                  "chromium"]):
        done = subprocess.run([*sudo, *command], env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.fail(f"could not install Debian's chromium for the browser tests ({' '.join(command)}): "
                        f"{done.stderr.strip()[-500:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.fail("apt-get installed chromium but no chromium executable is on PATH")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per module. Not per session: Playwright's sync API runs an event loop
    on this thread while it is open, and every later test's asyncio.run() would find it running."""
    from playwright.sync_api import sync_playwright

    executable = _install_chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True,
                                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Served:
    """A dashboard being served: its base URL and the driver behind it."""

    url: str
    driver: JobDriver


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve(driver: JobDriver, token: str | None) -> Iterator[str]:
    """The dashboard over ``driver`` on a free loopback port, for the block."""
    port = _free_port()
    app = create_app(driver, token=token, environment="test", token_from_env=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="x-web-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the dashboard did not start listening within 10 s")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobDriver]:
    """A migrated SQLite job store with the test app's table seeded and declared."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    monkeypatch.setenv("X_DATABASE_URL", url)
    from tests.cli import cli_app

    cli_app.seed(200)
    driver = create_driver(url)
    try:
        yield driver
    finally:
        driver.close()
        dispose_engines()


@pytest.fixture
def dashboard(database: JobDriver) -> Iterator[Served]:
    """The dashboard with a token (actions allowed once signed in)."""
    with serve(database, TOKEN) as url:
        yield Served(url, database)


@pytest.fixture
def read_only_dashboard(database: JobDriver) -> Iterator[Served]:
    """The dashboard with no token."""
    with serve(database, None) as url:
        yield Served(url, database)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context and page; fails the test on any console error or CSP violation."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.on("dialog", lambda dialog: dialog.accept() if dialog.type == "confirm" else errors.append(
        f"unexpected {dialog.type} dialog: {dialog.message}"))
    try:
        yield opened
    finally:
        context.close()
    # A refused action logs its 403 as a console error; only that one is expected.
    unexpected = [e for e in errors if "403" not in e]
    assert unexpected == [], unexpected
