"""Django integration (extra ``ultimat3[django]``): add ``"ultimat3.contrib.django"`` to
``INSTALLED_APPS``.

- the job store defaults to Django's own database (``settings.ULTIMAT3``, see
  :mod:`ultimat3.contrib.django.settings`), and ``job.enqueue(...)`` uses it;
- every installed app's ``jobs`` and ``backfills`` modules are imported at start-up;
- ``manage.py x ...`` is the operator CLI on that store;
- :func:`enqueue` writes the job in Django's current transaction (it commits or rolls back with
  the block), :func:`enqueue_on_commit` enqueues once the transaction has committed;
- :class:`RequireBackfill` is the deploy gate inside ``migrate``;
- :func:`engine` is a SQLAlchemy engine on a Django database and :func:`table` a model's table,
  for a backfill's ``engine=`` and ``source``;
- :class:`~ultimat3.contrib.django.middleware.RequestContextMiddleware` runs each request as its
  actor (``ULTIMAT3["ACTOR"]``), so tenancy checks what it enqueues.
"""

from __future__ import annotations

from ultimat3.contrib.django.enqueue import enqueue, enqueue_many, enqueue_on_commit
from ultimat3.contrib.django.settings import DjangoSettings, DjangoSetupError, load_settings
from ultimat3.contrib.django.store import close_drivers, database_url, engine, get_driver, table

__all__ = [
    "DjangoSettings",
    "DjangoSetupError",
    "RequireBackfill",
    "close_drivers",
    "database_url",
    "engine",
    "enqueue",
    "enqueue_many",
    "enqueue_on_commit",
    "get_driver",
    "load_settings",
    "table",
]


def __getattr__(name: str) -> object:
    # The migration operation loads Django's migration framework: only when it is asked for.
    if name == "RequireBackfill":
        from ultimat3.contrib.django.operations import RequireBackfill

        return RequireBackfill
    raise AttributeError(name)
