"""``x worker``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

import click

from ultimat3.cli.config import Config
from ultimat3.cli.logs import LOG_FORMATS, LOG_LEVELS, LogFormat, configure_logging
from ultimat3.cli.main import cli
from ultimat3.core.errors import XError, check, fail
from ultimat3.drivers.fair import check_weights
from ultimat3.drivers.protocol import JobDriver
from ultimat3.jobs.duration import parse_duration
from ultimat3.jobs.job import registered_jobs
from ultimat3.jobs.worker import Worker

log = logging.getLogger("ultimat3.worker")


def _metrics_class() -> Any:
    """``WorkerMetrics``, or one coded line saying which extra to install."""
    try:
        from ultimat3.contrib.prometheus import WorkerMetrics
    except ImportError as error:
        raise XError(f"--metrics-port needs prometheus_client ({error})",
                     "pip install 'ultimat3[prometheus]'", code="X_EXTRA_MISSING") from None
    return WorkerMetrics


def connect_with_retry(config: Config, *, timeout: float, sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.monotonic) -> JobDriver:
    """The driver, retrying an unreachable database with backoff for up to ``timeout`` seconds.

    A fleet often starts before its database (compose, a rolling restart): a worker that exits at
    once makes the orchestrator restart it in a loop. Anything but "unreachable" (a bad URL, a
    read-only file) will not heal by waiting and is raised at once, as is the last failure.
    """
    wait, deadline = 0.5, clock() + timeout
    while True:
        try:
            return config.driver()
        except XError as error:
            remaining = deadline - clock()
            if error.code != "X_DATABASE_UNREACHABLE" or remaining <= 0:
                raise
            pause = min(wait, remaining)
            log.warning("database not reachable yet (%s); retrying in %.1fs, giving up in %.0fs",
                        error.message, pause, remaining)
            sleep(pause)
            wait = min(wait * 2, 10.0)


def _weights(values: tuple[str, ...]) -> dict[str, int]:
    """``--weight TENANT=N`` options as a mapping, refused coded (``X_FAIR_WEIGHT``) when unreadable."""
    shares: dict[str, int] = {}
    for value in values:
        tenant, sep, number = value.rpartition("=")
        if not sep or not number.strip().isdigit():
            fail(f"--weight {value!r} is not TENANT=N", "write e.g. --weight acme=3 (acme gets 3 jobs per turn)",
                 code="X_FAIR_WEIGHT")
        shares[tenant] = int(number)
    check_weights(shares)
    return shares


def _prefetch(value: str) -> int | None:
    """``--prefetch``: ``auto`` (``None``: the worker's adaptive depth) or a whole number, 0 or more."""
    text = value.strip().lower()
    if text == "auto":
        return None
    if not text.isdigit():
        fail(f"--prefetch {value!r} is neither auto nor a whole number of jobs",
             "write --prefetch auto (the default), --prefetch 20 (exactly 20 claimed ahead) or --prefetch 0 (none)",
             code="X_WORKER_CONFIG")
    return int(text)


@cli.command("worker")
@click.option("--queue", "queues", multiple=True, help="Only claim from this queue (repeatable). Default: all.")
@click.option("--concurrency", default=10, show_default=True, type=click.IntRange(1, 10_000),
              help="Attempts run at once.")
@click.option("--prefetch", default="auto", show_default=True, metavar="auto|N",
              help="Jobs claimed ahead of free slots. auto: --concurrency of them, more (up to 8x, at most 200) "
                   "while handlers are quick next to a claim's round trip; N: exactly N; 0: none.")
@click.option("--visibility-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a claim lives without a heartbeat before another worker may take the job.")
@click.option("--grace", "grace", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="On SIGTERM/Ctrl-C, seconds running attempts get to finish before they are released "
                   "(a second signal releases them at once).")
@click.option("--poll-interval", default=1.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds between polls when idle (Postgres also wakes on NOTIFY).")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(LOG_LEVELS, case_sensitive=False))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(LOG_FORMATS),
              help="text for people, json for one object per line (job_id, job_name, queue, attempt, error...).")
@click.option("--start-timeout", default=120.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to keep retrying an unreachable database at start (with backoff).")
@click.option("--fail-fast", is_flag=True, help="Exit at once if the database is unreachable at start.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port (extra ultimat3[prometheus]; docs in "
                   "ultimat3.contrib.prometheus).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics endpoint binds.")
@click.option("--no-schedules", is_flag=True,
              help="Do not fire the schedules of the jobs this worker runs (other workers still do).")
@click.option("--prune-after", default=None, metavar="AGE",
              help='Retention: delete finished jobs older than AGE ("7d", "12h") every ~5 minutes. Default: keep '
                   "them (x db prune).")
@click.option("--fair", is_flag=True,
              help="Serve tenants in turn: a tenant's few jobs behind another's backlog start in the first claims.")
@click.option("--weight", "weights", multiple=True, metavar="TENANT=N",
              help="With --fair: TENANT gets N jobs per turn (others 1); repeatable. Implies --fair.")
@click.option("--no-gc-freeze", is_flag=True,
              help="Do not gc.freeze() what is loaded when the worker starts (by default it does: the cyclic "
                   "collector then never rescans the app's modules and setup, which costs a worker ~7 us a job).")
@click.pass_obj
def worker_command(config: Config, queues: tuple[str, ...], concurrency: int, prefetch: str,
                   visibility_timeout: float, grace: float, poll_interval: float, log_level: str,
                   log_format: str, start_timeout: float, fail_fast: bool, metrics_port: int | None,
                   metrics_host: str, no_schedules: bool, prune_after: str | None, fair: bool,
                   weights: tuple[str, ...], no_gc_freeze: bool) -> None:
    """Claim and run jobs until SIGTERM/SIGINT, then stop gracefully."""
    retention = parse_duration(prune_after, what="--prune-after") if prune_after is not None else None
    ahead = _prefetch(prefetch)
    shares = _weights(weights)
    config.load_apps()
    check(
        registered_jobs(),
        "no jobs are declared, so this worker would never claim anything",
        "pass --app with the module that declares your @job/backfill() (or set X_APP)",
        code="X_WORKER_NO_JOBS",
    )
    metrics_class = _metrics_class() if metrics_port is not None else None
    configure_logging(log_level, cast(LogFormat, log_format))
    driver = connect_with_retry(config, timeout=0 if fail_fast else start_timeout)
    metrics = metrics_class(driver) if metrics_class is not None else None
    worker = Worker(driver, queues=queues or None, concurrency=concurrency, prefetch=ahead,
                    visibility_timeout=visibility_timeout, grace_period=grace, poll_interval=poll_interval,
                    environment=config.environment, schedules=not no_schedules, prune_after=retention,
                    fair=shares if shares else fair, on_event=metrics.on_event if metrics is not None else None,
                    freeze_gc=not no_gc_freeze)
    if metrics is not None and metrics_port is not None:
        try:
            bound = metrics.serve(metrics_port, metrics_host)
        except OSError as error:
            metrics.close()
            raise XError(f"cannot serve metrics on {metrics_host}:{metrics_port}: {error.strerror or error}",
                         "pick a free port with --metrics-port (0: any)", code="X_METRICS_PORT") from None
        click.echo(f"metrics on http://{metrics_host}:{bound}/metrics", err=True)
    click.echo(f"worker {worker.worker_id} on {driver.name}: {len(worker.names)} job(s), "
               f"concurrency {concurrency}, prefetch {'auto' if ahead is None else ahead}"
               f"{', fair by tenant' if fair or shares else ''}", err=True)
    try:
        worker.run_forever()
    finally:
        if metrics is not None:
            metrics.close()
