"""``x web``: serve the operator's dashboard (extra ``ultimat3[web]``)."""

from __future__ import annotations

import os

import click

from ultimat3.cli.config import Config
from ultimat3.cli.main import cli
from ultimat3.cli.render import err_console, say
from ultimat3.core.errors import XError


@cli.command("web")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but a loopback address exposes the dashboard to the network.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.pass_obj
def web(config: Config, host: str, port: int) -> None:
    """Serve the dashboard: queues, jobs, attempts, backfills, workers, schedules, limits. Read-only
    unless X_WEB_TOKEN is set (then cancel, retry and starting a pending backfill need it)."""
    try:
        from ultimat3.web import TOKEN_ENV
        from ultimat3.web.serve import is_loopback, serve
    except ImportError as error:
        raise XError(f"x web needs the web extra ({error})", "pip install 'ultimat3[web]'",
                     code="X_EXTRA_MISSING") from None
    config.load_apps()
    token = os.environ.get(TOKEN_ENV) or None
    if not is_loopback(host) and token is None:
        err_console.print(f"[yellow]warning: listening on {host} without {TOKEN_ENV}: anyone who can reach this "
                          "port can read every job's input, result and error (it stays read-only)[/yellow]")
    mode = "read-only" if token is None else "actions need the token"
    say(f"dashboard on http://{host}:{port}/ ({mode}); Ctrl-C stops it")
    serve(config.driver(), host=host, port=port, token=token, environment=config.environment)
