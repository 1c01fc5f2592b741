"""Each request runs under the context of whoever makes it, so what it enqueues is checked and
stamped for their org (tenancy) exactly as in a worker.

``MIDDLEWARE = [..., "ultimat3.contrib.django.middleware.RequestContextMiddleware"]`` (after
authentication) and ``ULTIMAT3["ACTOR"] = "myapp.tenancy.actor_for"``: a function of the request
returning an :class:`~ultimat3.Actor` (``id`` for the audit trail, ``org_id`` the org it acts
for) or ``None``. Without ``ACTOR`` the actor is ``user:<pk>`` (``anonymous`` when logged out)
acting for no org: such a request may enqueue no tenanted job, which fails closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from ultimat3.contrib.django.settings import DjangoSetupError, load_settings
from ultimat3.core.context import Actor, Ctx, use_ctx

__all__ = ["RequestContextMiddleware", "default_actor"]


def default_actor(request: Any) -> Actor:
    """``user:<pk>`` for a logged-in user, ``anonymous`` otherwise; no org."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return Actor(id=f"user:{user.pk}")
    return Actor(id="anonymous")


def _resolver() -> Callable[[Any], Actor | None]:
    path = load_settings().actor
    if path is None:
        return default_actor
    try:
        found = import_string(path)
    except ImportError as error:
        raise DjangoSetupError(f"settings.ULTIMAT3['ACTOR'] = {path!r} cannot be imported: {error}",
                               "name a function as 'package.module.function'") from error
    if not callable(found):
        raise DjangoSetupError(f"settings.ULTIMAT3['ACTOR'] = {path!r} is not a function",
                               "name a function of the request returning an Actor or None")
    resolver: Callable[[Any], Actor | None] = found
    return resolver


class RequestContextMiddleware:
    """Installs the request's :class:`~ultimat3.Ctx` for the view (and what it enqueues)."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        # Resolved at start-up: a wrong path fails the first request loudly, not each silently.
        self.resolve = _resolver()

    def __call__(self, request: Any) -> Any:
        actor = self.resolve(request)
        if actor is None:
            actor = default_actor(request)
        if not isinstance(actor, Actor):
            raise DjangoSetupError(f"settings.ULTIMAT3['ACTOR'] returned a {type(actor).__name__}, not an Actor",
                                   "return ultimat3.Actor(id=..., org_id=...) or None")
        with use_ctx(Ctx(actor=actor, environment=load_settings().environment())):
            return self.get_response(request)
