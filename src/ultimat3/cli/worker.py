"""``x worker``."""

from __future__ import annotations

import logging

import click

from ultimat3.cli.config import Config
from ultimat3.cli.main import cli
from ultimat3.core.errors import check
from ultimat3.jobs.job import registered_jobs
from ultimat3.jobs.worker import Worker


@cli.command("worker")
@click.option("--queue", "queues", multiple=True, help="Only claim from this queue (repeatable). Default: all.")
@click.option("--concurrency", default=10, show_default=True, type=int, help="Attempts run at once.")
@click.option("--visibility-timeout", default=30.0, show_default=True, type=float,
              help="Seconds a claim lives without a heartbeat before another worker may take the job.")
@click.option("--grace", "grace", default=30.0, show_default=True, type=float,
              help="On SIGTERM, seconds running attempts get to finish before they are released.")
@click.option("--poll-interval", default=1.0, show_default=True, type=float,
              help="Seconds between polls when idle (Postgres also wakes on NOTIFY).")
@click.option("--log-level", default="INFO", show_default=True)
@click.pass_obj
def worker_command(config: Config, queues: tuple[str, ...], concurrency: int, visibility_timeout: float,
                   grace: float, poll_interval: float, log_level: str) -> None:
    """Claim and run jobs until SIGTERM/SIGINT, then stop gracefully."""
    config.load_apps()
    check(
        registered_jobs(),
        "no jobs are declared, so this worker would never claim anything",
        "pass --app with the module that declares your @job/backfill() (or set X_APP)",
        code="X_WORKER_NO_JOBS",
    )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker = Worker(config.driver(), queues=queues or None, concurrency=concurrency,
                    visibility_timeout=visibility_timeout, grace_period=grace, poll_interval=poll_interval,
                    environment=config.environment)
    click.echo(f"worker {worker.worker_id} on {config.driver().name}: {len(worker.names)} job(s), "
               f"concurrency {concurrency}", err=True)
    worker.run_forever()
