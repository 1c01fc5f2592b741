"""Prometheus metrics of a worker, scraped over HTTP while it drains, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.drivers import SHARED_KINDS, database_url

from ultimat3 import Ctx, operator_context
from ultimat3.contrib.prometheus import WorkerMetrics
from ultimat3.drivers import create_driver
from ultimat3.drivers.protocol import JobDriver
from ultimat3.jobs import RetryPolicy, Worker, job


@pytest.fixture(params=SHARED_KINDS)
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobDriver]:
    with database_url(request.param, tmp_path, prefix="x_metrics") as url:
        built = create_driver(url)
        try:
            yield built
        finally:
            built.close()


def value(text: str, metric: str, **labels: str) -> float | None:
    """The sample ``metric{labels}`` of a scrape (labels in any order), or ``None``."""
    for line in text.splitlines():
        if not line.startswith(metric + "{") and not line.startswith(metric + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_are_scraped_over_http_during_a_drain(driver: JobDriver) -> None:
    metrics = WorkerMetrics(driver, sample_interval=0.05)
    port = metrics.serve(0)
    runs: list[int] = []
    scrapes: list[str] = []

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    @job(name="metrics.ok", tenant="none", queue="mail")
    def ok(input: Any, ctx: Ctx) -> None:
        runs.append(1)
        if len(runs) == 5:  # scrape while the drain is under way
            scrapes.append(scrape())

    @job(name="metrics.boom", tenant="none", queue="mail", retry=RetryPolicy(max_attempts=1))
    def boom(input: Any, ctx: Ctx) -> None:
        raise RuntimeError("no")

    with operator_context("test", "metrics"):
        ok.enqueue_many([{}] * 20, driver=driver)
        boom.enqueue_many([{}] * 3, driver=driver)
    worker = Worker(driver, environment="test", concurrency=1, liveness_interval=None, on_event=metrics.on_event)
    try:
        asyncio.run(worker.drain())
        metrics.sample()
        after = scrape()
    finally:
        worker.close()
        metrics.close()
    [during] = scrapes
    # Mid-drain, the endpoint answered with the attempts settled so far (the fifth was still running).
    so_far = value(during, "ultimat3_attempts_total", name="metrics.ok", queue="mail", outcome="done")
    assert so_far is not None and 1 <= so_far <= 4, so_far
    assert value(after, "ultimat3_attempts_total", name="metrics.ok", queue="mail", outcome="done") == 20
    assert value(after, "ultimat3_attempts_total", name="metrics.boom", queue="mail", outcome="dead") == 3
    assert value(after, "ultimat3_attempt_duration_seconds_count", name="metrics.ok", queue="mail") == 20
    assert value(after, "ultimat3_claimed_total") == 23
    assert value(after, "ultimat3_queue_jobs", queue="mail", state="done") == 20
    assert value(after, "ultimat3_queue_jobs", queue="mail", state="dead") == 3
    assert value(after, "ultimat3_queue_paused", queue="mail") == 0
    assert value(after, "ultimat3_queue_due", queue="mail") == 0


def test_a_busy_metrics_port_is_one_coded_line(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "ultimat3", "--app", "tests.cli.cli_app", "--database-url",
             f"sqlite:///{tmp_path / 'x.db'}", "worker", "--metrics-port", str(port), "--fail-fast"],
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "error X_METRICS_PORT" in result.stderr and "hint:" in result.stderr and "Traceback" not in result.stderr


def test_metrics_without_the_extra_is_one_coded_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from click.testing import CliRunner

    from ultimat3.cli import cli

    job(name="metrics.declared", tenant="none")(lambda input, ctx: None)  # in this test's registry
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "ultimat3.contrib.prometheus", raising=False)
    monkeypatch.delenv("X_APP", raising=False)
    result = CliRunner().invoke(cli, ["--database-url", f"sqlite:///{tmp_path / 'x.db'}",
                                      "worker", "--metrics-port", "0"])
    assert result.exit_code == 2
    assert "error X_EXTRA_MISSING" in result.stderr and "ultimat3[prometheus]" in result.stderr
    assert not (tmp_path / "x.db").exists()  # refused before the database was opened


def test_backfill_gauges_follow_a_held_pass_and_its_quarantine() -> None:
    from prometheus_client import generate_latest

    from ultimat3.backfill import BackfillProgress
    from ultimat3.drivers.memory import MemoryDriver

    driver = MemoryDriver()
    metrics = WorkerMetrics(driver)
    try:
        metrics.on_progress(BackfillProgress("bf", "r", 3, 300, replayed=False, failures=2))
        metrics.on_progress(BackfillProgress("bf", "r", 3, 300, replayed=False, throttle="a transaction has been open",
                                              failures=2))
        text = generate_latest(metrics.registry).decode()
        assert value(text, "ultimat3_backfill_held", name="bf") == 1.0
        assert value(text, "ultimat3_backfill_failed_rows", name="bf") == 2.0
        assert value(text, "ultimat3_backfill_batches_handled_total", name="bf") == 1.0  # a wait is no batch
        metrics.on_progress(BackfillProgress("bf", "r", 4, 400, replayed=False, failures=2))
        text = generate_latest(metrics.registry).decode()
        assert value(text, "ultimat3_backfill_held", name="bf") == 0.0
        assert value(text, "ultimat3_backfill_batches_handled_total", name="bf") == 2.0
    finally:
        metrics.close()
        driver.close()
