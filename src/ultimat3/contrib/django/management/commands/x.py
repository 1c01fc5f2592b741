"""``manage.py x ...``: the operator CLI on the project's job store, with its jobs discovered.

Everything after ``x`` is the ``x`` command line (``manage.py x jobs ls``, ``manage.py x worker``,
``manage.py x db backfill --check``). The job store's URL, the discovered app modules and
``ULTIMAT3["ENV"]`` are passed as ``--database-url``, ``--app`` and ``--env`` unless given.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ultimat3.cli.main import cli
from ultimat3.contrib.django.apps import discovered_modules
from ultimat3.contrib.django.settings import load_settings
from ultimat3.contrib.django.store import database_url
from ultimat3.core.errors import XError

__all__ = ["Command", "run_x"]

_GLOBAL_VALUES = frozenset({"--app", "--database-url", "--database-direct-url", "--env"})


def _given(args: list[str], option: str) -> bool:
    return any(arg == option or arg.startswith(option + "=") for arg in args)


def run_x(args: list[str]) -> int:
    """Run ``x ARGS`` for this project; returns the exit code. Failures to read the settings are
    reported the way the CLI reports its own (one coded line, exit 2)."""
    from ultimat3.cli.main import EXIT_ERROR, report

    if args[:1] in (["-h"], ["--help"]) or not args:
        return int(cli.main(args or ["--help"], prog_name="manage.py x", standalone_mode=False) or 0)
    try:
        loaded = load_settings()
        prefix: list[str] = []
        if not _given(args, "--database-url"):
            prefix += ["--database-url", database_url()]
        if not _given(args, "--app"):
            for module in discovered_modules():
                prefix += ["--app", module]
        if not _given(args, "--env") and loaded.env is not None:
            prefix += ["--env", loaded.env]
    except XError as error:
        report(error, verbose="--verbose" in args or "-v" in args)
        return EXIT_ERROR
    return int(cli.main([*prefix, *args], prog_name="manage.py x", standalone_mode=False) or 0)


class Command(BaseCommand):
    """The ``x`` CLI as a management command."""

    help = "ultimat3's operator CLI on this project's job store (everything after `x` is passed on)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Every argument goes to ``x`` untouched."""
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def run_from_argv(self, argv: list[str]) -> None:
        """``manage.py x ...``: skip Django's option parsing, which would claim ``--help`` and
        ``-v``; exit with the CLI's code."""
        code = run_x(argv[2:])
        if code:
            sys.exit(code)

    def handle(self, *args: str, **options: Any) -> None:
        """``call_command("x", "jobs", "ls")``: a non-zero exit becomes a ``CommandError``."""
        code = run_x(list(args))
        if code:
            raise CommandError(f"x {' '.join(args)} exited {code}", returncode=code)
