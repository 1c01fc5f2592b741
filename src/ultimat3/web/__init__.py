"""``x web``: the operator's dashboard (the ``web`` extra: Starlette, Jinja2 and uvicorn).

``create_app(driver)`` returns an ASGI app to serve on its own (``x --app myapp.jobs web``) or to
mount inside an existing Starlette or FastAPI app::

    from ultimat3.web import create_app
    app.mount("/jobs-admin", create_app(driver, token=os.environ.get("X_WEB_TOKEN")))

Pages: overview, jobs, job detail, backfills, workers, schedules and limits, each backed by the JSON
API under ``/api`` (docs/web.md). Read-only unless a token is given.
"""

from __future__ import annotations

import os

from starlette.applications import Starlette

from ultimat3.core.context import Environment, default_environment
from ultimat3.core.errors import XError
from ultimat3.drivers.protocol import JobDriver

__all__ = ["TOKEN_ENV", "create_app"]

#: Where the token comes from when ``create_app`` is not given one.
TOKEN_ENV = "X_WEB_TOKEN"
#: Shorter tokens are refused: the token is the only thing between a browser and a cancel.
MIN_TOKEN_LENGTH = 16


def create_app(driver: JobDriver, *, token: str | None = None, environment: Environment | None = None,
               token_from_env: bool = True) -> Starlette:
    """The dashboard over ``driver``.

    ``token`` (else ``$X_WEB_TOKEN`` unless ``token_from_env=False``) allows cancel, retry and
    starting a pending backfill; without one the dashboard is read-only. ``environment`` is the one
    backfills are started in (default: ``X_ENV``). A token shorter than 16 characters is refused
    (``X_WEB_TOKEN``).
    """
    from ultimat3.web.app import build

    chosen = token if token is not None else (os.environ.get(TOKEN_ENV) or None if token_from_env else None)
    if chosen is not None and len(chosen) < MIN_TOKEN_LENGTH:
        raise XError(f"the dashboard token is {len(chosen)} characters long; it needs at least {MIN_TOKEN_LENGTH}",
                     "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(24))'",
                     code="X_WEB_TOKEN")
    return build(driver, environment if environment is not None else default_environment(), chosen)
