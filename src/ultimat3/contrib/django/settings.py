"""``settings.ULTIMAT3``: what the Django integration reads, validated once, refused coded.

Every key is optional::

    ULTIMAT3 = {
        "DATABASE": "default",            # the Django alias whose database holds the job store
        "DATABASE_URL": None,             # or a URL of its own (then no transactional enqueue)
        "DISCOVER": ["jobs", "backfills"],  # submodules of every installed app imported at start-up
        "APPS": [],                       # more modules that declare jobs, imported as well
        "ENV": None,                      # development | test | staging | production (else X_ENV)
        "RUN_PENDING_IN": ["development", "test"],  # where RequireBackfill runs a pending pass inline
        "ACTOR": None,                    # "pkg.module.fn": request -> Actor, for the middleware
    }
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ultimat3.core.context import ENVIRONMENTS, Environment, default_environment
from ultimat3.core.errors import XError

__all__ = ["DjangoSettings", "DjangoSetupError", "load_settings"]


class DjangoSetupError(XError):
    """``settings.ULTIMAT3`` or the Django database cannot serve as a job store."""

    code = "X_DJANGO_SETTINGS"
    retryable = False


class DjangoSettings(BaseModel):
    """The validated ``settings.ULTIMAT3``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    database: str = Field("default", alias="DATABASE", min_length=1)
    database_url: str | None = Field(None, alias="DATABASE_URL", min_length=1)
    discover: tuple[str, ...] = Field(("jobs", "backfills"), alias="DISCOVER")
    apps: tuple[str, ...] = Field((), alias="APPS")
    env: Environment | None = Field(None, alias="ENV")
    run_pending_in: tuple[Environment, ...] = Field(("development", "test"), alias="RUN_PENDING_IN")
    actor: str | None = Field(None, alias="ACTOR", min_length=1)

    def environment(self) -> Environment:
        """``ENV`` when set, else ``X_ENV`` (``development`` when that is unset too)."""
        return self.env if self.env is not None else default_environment()


#: The last settings validated, and what they were validated from: every enqueue, request and
#: driver lookup reads them, and they change only when a test overrides them.
_validated: tuple[dict[str, Any], DjangoSettings] | None = None


def load_settings() -> DjangoSettings:
    """``settings.ULTIMAT3`` validated (once per value); one coded error naming the bad key otherwise."""
    global _validated
    from django.conf import settings

    raw: Any = getattr(settings, "ULTIMAT3", {})
    cached = _validated
    if cached is not None and isinstance(raw, dict) and raw == cached[0]:
        return cached[1]
    if not isinstance(raw, dict):
        raise DjangoSetupError(
            f"settings.ULTIMAT3 is a {type(raw).__name__}, not a dict",
            'write ULTIMAT3 = {"DATABASE": "default"} (every key is optional)',
        )
    try:
        loaded = DjangoSettings.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "?"
        if first["type"] == "extra_forbidden":
            known = ", ".join(str(field.alias) for field in DjangoSettings.model_fields.values())
            raise DjangoSetupError(f"settings.ULTIMAT3 has an unknown key {key!r}",
                                   f"the keys are {known}") from None
        raise DjangoSetupError(
            f"settings.ULTIMAT3[{key!r}] = {first.get('input')!r}: {first['msg']}",
            f"environments are {', '.join(ENVIRONMENTS)}; DATABASE names a key of DATABASES; "
            "DISCOVER and APPS are lists of module names",
        ) from None
    _validated = (copy.deepcopy(raw), loaded)  # deep: a list inside may be changed in place
    return loaded
