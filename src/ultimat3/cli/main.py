"""``x``: the root command, shared options and the one place errors become exit codes."""

from __future__ import annotations

from typing import Any

import click

from ultimat3.cli.config import Config
from ultimat3.cli.render import err_console
from ultimat3.core.errors import XError

#: Exit code for a usage or configuration error (click uses 2 for usage errors too).
EXIT_ERROR = 2


class _Root(click.Group):
    """Reports an :class:`XError` as one coded line plus its hint, exit 2, no traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except XError as error:
            err_console.print(f"[bold red]error[/] [red]{error.code}[/]: {error.message}", highlight=False)
            if error.hint:
                err_console.print(f"  [bold]hint[/]: {error.hint}", highlight=False)
            raise click.exceptions.Exit(EXIT_ERROR) from None
        finally:
            config = ctx.obj
            if isinstance(config, Config):
                config.close()


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--app", "apps", multiple=True, metavar="MODULE",
              help="Module that declares your jobs and backfills (repeatable; env X_APP, comma-separated).")
@click.option("--database-url", "url", metavar="URL",
              help="sqlite:///path, postgresql://... or memory:// (env X_DATABASE_URL; default sqlite:///x.db).")
@click.option("--env", "env", metavar="ENV",
              help="development | test | staging | production (env X_ENV; default development).")
@click.version_option(package_name="ultimat3")
@click.pass_context
def cli(ctx: click.Context, apps: tuple[str, ...], url: str | None, env: str | None) -> None:
    """Durable background jobs and backfills: run workers, inspect jobs, gate deploys on backfills."""
    ctx.obj = Config.resolve(apps, url, env)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="x")
