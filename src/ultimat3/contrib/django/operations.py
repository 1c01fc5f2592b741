"""The deploy gate inside ``manage.py migrate``: a migration operation that refuses to go past its
migration until a named backfill has a completed pass under its current code.

Put it in a migration of its own, ahead of the change that relies on the backfilled data::

    class Migration(migrations.Migration):
        dependencies = [("shop", "0002_order_code")]
        operations = [RequireBackfill("shop.fill_order_codes")]

``migrate`` applies every migration before it, then stops there with one coded line
(``X_BACKFILL_PENDING``, exit 2) until a worker (or ``manage.py x db backfill NAME --wait``) has
completed the pass. Where the environment is one of ``run_pending_in`` (by default development
and test, whose databases are small), the pass runs inline instead, so a fresh checkout and a
test database migrate in one command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError
from django.db.migrations.operations.base import Operation

from ultimat3.backfill import get_backfill, pending_reason, registered_backfills, run_backfill
from ultimat3.contrib.django.settings import load_settings
from ultimat3.contrib.django.store import get_driver
from ultimat3.core.context import ENVIRONMENTS, Environment
from ultimat3.core.errors import XError, check
from ultimat3.jobs.operator import default_actor
from ultimat3.tenancy.grants import operator_context

__all__ = ["RequireBackfill", "require_backfill"]


def require_backfill(name: str, *, run_pending_in: Sequence[Environment] | None = None) -> str:
    """Check that backfill ``name`` has a completed pass under its current checksum; run it in
    the foreground when it has not and the environment is in ``run_pending_in`` (default:
    ``settings.ULTIMAT3["RUN_PENDING_IN"]``). Returns ``"completed"`` or ``"ran"``; raises
    ``X_BACKFILL_PENDING`` otherwise, and ``X_BACKFILL_UNKNOWN`` for a name no app declares."""
    loaded = load_settings()
    handle = get_backfill(name)
    if handle is None:
        declared = ", ".join(str(item.name) for item in registered_backfills()) or "none"
        raise XError(
            f'no backfill "{name}" is declared, so the migration cannot tell whether it completed '
            f"(declared: {declared})",
            "declare it in a `backfills` or `jobs` module of an installed app (or list its module in "
            "ULTIMAT3['APPS']), or fix the name in the migration",
            code="X_BACKFILL_UNKNOWN",
        )
    declaration = next(item for item in registered_backfills() if item.name == name)
    driver = get_driver()
    pending, _last = pending_reason(driver, name, declaration.checksum)
    if pending is None:
        return "completed"
    environment = loaded.environment()
    inline = loaded.run_pending_in if run_pending_in is None else tuple(run_pending_in)
    if environment in inline:
        # `migrate` is the operator's act, as `x db backfill --wait` is: recorded under their login.
        actor = "migrate:" + default_actor().split(":", 1)[1]
        with operator_context(actor, f"manage.py migrate: RequireBackfill({name!r})"):
            run_backfill(handle, driver=driver, environment=environment, retry_failed=pending == "failed-rows")
        if pending_reason(driver, name, declaration.checksum)[0] is None:
            return "ran"
        pending = "failed-rows"  # the inline pass (or the retry of its rows) left rows quarantined
    reason = {
        "never-run": "has never completed",
        "checksum-changed": "last completed under other code (its checksum changed)",
        "failed-rows": f"completed with {driver.backfills.outstanding(name)} row(s) quarantined "
                       f"(`manage.py x db backfill failures {name}` lists them)",
    }[pending]
    hint = (f"fix those rows, then re-run exactly them with `manage.py x db backfill {name} --retry-failed "
            "--wait`, then migrate again" if pending == "failed-rows" else
            "let a worker run it (`manage.py x db backfill --enqueue-pending`) or run it now with "
            f"`manage.py x db backfill {name} --wait`, then migrate again")
    raise XError(f'backfill "{name}" {reason}: this migration waits for it (environment {environment})', hint,
                 code="X_BACKFILL_PENDING")


class RequireBackfill(Operation):
    """A migration operation: go no further until backfill ``name`` has completed (see the module
    docstring). Changes no schema; reversing it does nothing."""

    reduces_to_sql = False
    reversible = True
    elidable = False

    def __init__(self, name: str, *, run_pending_in: Sequence[str] | None = None) -> None:
        check(isinstance(name, str) and bool(name), f"RequireBackfill({name!r}) needs a backfill name",
              'write RequireBackfill("app.backfill_name"), the name= it is declared under', code="X_DJANGO_MIGRATION")
        if run_pending_in is not None:
            bad = [value for value in run_pending_in if value not in ENVIRONMENTS]
            check(not bad and not isinstance(run_pending_in, str),
                  f"RequireBackfill({name!r}, run_pending_in={run_pending_in!r}) names no environment list",
                  f"use a list of {', '.join(ENVIRONMENTS)} (or [] to never run it inline)",
                  code="X_DJANGO_MIGRATION")
        self.name = name
        self.run_pending_in: tuple[Environment, ...] | None = (
            None if run_pending_in is None else tuple(run_pending_in))  # type: ignore[arg-type]

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        """What ``makemigrations`` writes back."""
        kwargs: dict[str, Any] = {}
        if self.run_pending_in is not None:
            kwargs["run_pending_in"] = list(self.run_pending_in)
        return (type(self).__qualname__, [self.name], kwargs)

    def state_forwards(self, app_label: str, state: Any) -> None:
        """No model changes."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        """The check (``sqlmigrate`` never calls it: ``reduces_to_sql`` is false)."""
        try:
            require_backfill(self.name, run_pending_in=self.run_pending_in)
        except XError as error:
            # Django prints a CommandError as one line and exits with its code, no traceback.
            hint = f"\n  hint: {error.hint}" if error.hint else ""
            raise CommandError(f"{error.code}: {error.message}{hint}", returncode=2) from error

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        """Going back past the gate needs nothing."""

    def describe(self) -> str:
        """What ``migrate --plan`` shows."""
        return f"Require backfill {self.name} to have completed"

    @property
    def migration_name_fragment(self) -> str:
        """``makemigrations``' default name for a migration holding only this."""
        return "require_" + "".join(ch if ch.isalnum() else "_" for ch in self.name.lower())
