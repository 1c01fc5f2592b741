"""``x``: the root command, shared options and the one place failures become exit codes.

Every failure, whoever raises it (our code, click's parser, the database, a bug), leaves as one
``error X_CODE: message`` line and a ``hint:`` line on stderr with exit 2 — 130 for an
interrupt. The traceback is printed only under ``--verbose``.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import click

from ultimat3.cli.config import Config, redact_urls
from ultimat3.cli.render import err_console, visible
from ultimat3.core.errors import Interrupted, XError, first_line
from ultimat3.jobs.operator import default_actor
from ultimat3.tenancy.grants import operator_context

#: Exit code for a usage, configuration or runtime error (click uses 2 for usage errors too).
EXIT_ERROR = 2
#: Exit code after Ctrl-C (128 + SIGINT), distinct from ``--check``'s 1 for "pending".
EXIT_INTERRUPTED = 130
#: DB-API packages whose errors a driver may let through uncoded.
_DATABASE_MODULES = frozenset({"sqlite3", "psycopg", "psycopg_pool", "sqlalchemy"})
#: Commands that do not act as an operator: a worker runs each job under that job's own context.
_NOT_OPERATOR = frozenset({"worker"})


def report(error: XError, *, verbose: bool, cause: BaseException | None = None) -> None:
    """Print ``error`` the one way every failure is printed (plus the traceback when verbose)."""
    from rich.text import Text

    line = Text.assemble(("error ", "bold red"), (error.code, "red"), ": ", visible(redact_urls(error.message)))
    err_console.print(line, highlight=False)
    if error.hint:
        err_console.print(Text.assemble("  ", ("hint", "bold"), ": ", visible(redact_urls(error.hint))),
                          highlight=False)
    if verbose:
        detail = error.details.get("traceback")
        shown = cause if cause is not None else error
        text = detail if isinstance(detail, str) else "".join(traceback.format_exception(shown))
        err_console.print(Text(redact_urls(text)), highlight=False)


def _as_coded(error: BaseException) -> tuple[XError, int]:
    if isinstance(error, Interrupted):
        return error, EXIT_INTERRUPTED
    if isinstance(error, XError):
        return error, EXIT_ERROR
    if isinstance(error, click.exceptions.Abort | KeyboardInterrupt):
        return XError("interrupted", "nothing more was done; run the command again to continue",
                      code="X_INTERRUPTED"), EXIT_INTERRUPTED
    if isinstance(error, click.exceptions.NoSuchOption | click.exceptions.BadOptionUsage):
        return XError(error.format_message(), "`x --help` (or `x COMMAND --help`) lists the options",
                      code="X_CLI_USAGE"), EXIT_ERROR
    if isinstance(error, click.exceptions.BadParameter):
        return XError(error.format_message(), "`x COMMAND --help` says what each option accepts",
                      code="X_CLI_VALUE"), EXIT_ERROR
    if isinstance(error, click.exceptions.UsageError):
        return XError(error.format_message(), "`x --help` (or `x COMMAND --help`) shows the usage",
                      code="X_CLI_USAGE"), EXIT_ERROR
    if isinstance(error, click.ClickException):
        return XError(error.format_message(), "`x --help` shows the usage", code="X_CLI"), EXIT_ERROR
    first = first_line(error)
    if type(error).__module__.split(".")[0] in _DATABASE_MODULES:
        # A database error a driver did not code: still one line, never a traceback. Recognised
        # by its module, so the CLI imports no database library.
        return XError(f"the database refused: {type(error).__name__}: {first}".rstrip(": "),
                      "check X_DATABASE_URL and the database; rerun with --verbose for the traceback",
                      code="X_DATABASE_ERROR"), EXIT_ERROR
    return XError(f"unexpected {type(error).__name__}: {first}".rstrip(": "),
                  "this is a bug in ultimat3 or in the app module: rerun with --verbose for the traceback "
                  "and report it", code="X_INTERNAL"), EXIT_ERROR


class _Root(click.Group):
    """Runs every command under one error path, and as an operator (except the worker)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        verbose = "--verbose" in argv or "-v" in argv
        try:
            # Without standalone mode click returns an Exit's code instead of exiting; commands
            # here return nothing else.
            result = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else 0
        except click.exceptions.Exit as done:
            code = done.exit_code
        except BaseException as error:
            if isinstance(error, SystemExit):
                raise
            coded, code = _as_coded(error)
            report(coded, verbose=verbose, cause=error)
        if standalone_mode:
            sys.exit(code)
        return code

    def invoke(self, ctx: click.Context) -> Any:
        # The sub-command is not resolved yet: click keeps its name first among these.
        words = [*getattr(ctx, "_protected_args", []), *ctx.args]
        with ExitStack() as stack:
            if not words or words[0] not in _NOT_OPERATOR:
                # The CLI is an operator's tool: what it enqueues (a cross-tenant backfill, a
                # retry) is the operator's act, recorded under their login.
                stack.enter_context(operator_context(default_actor(), "x " + " ".join(words)))
            try:
                return super().invoke(ctx)
            finally:
                config = ctx.obj
                if isinstance(config, Config):
                    config.close()


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--app", "apps", multiple=True, metavar="MODULE",
              help="Module that declares your jobs and backfills (repeatable; env X_APP, comma-separated).")
@click.option("--database-url", "url", metavar="URL",
              help="sqlite:///path, postgresql://... or memory:// (env X_DATABASE_URL; default sqlite:///x.db).")
@click.option("--database-direct-url", "direct_url", metavar="URL",
              help="PostgreSQL behind a transaction-mode pooler: a URL to the server itself, for LISTEN and "
                   "worker liveness (env X_DATABASE_DIRECT_URL).")
@click.option("--env", "env", metavar="ENV",
              help="development | test | staging | production (env X_ENV; default development).")
@click.option("--verbose", "-v", is_flag=True, help="On failure, also print the full traceback.")
@click.version_option(package_name="ultimat3")
@click.pass_context
def cli(ctx: click.Context, apps: tuple[str, ...], url: str | None, direct_url: str | None, env: str | None,
        verbose: bool) -> None:
    """Durable background jobs and backfills: run workers, inspect jobs, gate deploys on backfills."""
    ctx.obj = Config.resolve(apps, url, env, verbose=verbose, direct_url=direct_url)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="x")
