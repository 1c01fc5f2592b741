"""What every command needs: the app's modules imported, the driver, the environment."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ultimat3.core.context import Environment, parse_environment
from ultimat3.core.errors import XError
from ultimat3.drivers import create_driver, database_url, redact_urls
from ultimat3.drivers.protocol import JobDriver

__all__ = ["Config", "import_apps", "redact", "redact_urls"]

T = TypeVar("T")


def import_apps(modules: tuple[str, ...]) -> None:
    """Import each ``--app`` module so its ``@job``/``backfill()`` declarations register."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--app myapp.jobs` from the project root, as with `python -m`
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            raise XError(
                f"--app {module!r} could not be imported: {error}",
                "pass the dotted module path that declares your jobs (e.g. --app myapp.jobs), "
                "run from the directory that contains it, or set X_APP",
                code="X_APP_IMPORT",
            ) from error
        except XError:
            raise
        except Exception as error:
            raise XError(
                f"--app {module!r} raised {type(error).__name__} while importing: {error}",
                "fix the error in that module; `python -c 'import MODULE'` reproduces it",
                code="X_APP_IMPORT",
            ) from error


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    return redact_urls(url)


@dataclass
class Config:
    """Resolved options shared by every command, with the driver opened lazily."""

    apps: tuple[str, ...]
    url: str
    environment: Environment
    verbose: bool = False
    #: ``--database-direct-url`` / ``X_DATABASE_DIRECT_URL``: the server itself, past a pooler.
    direct_url: str | None = field(default=None, repr=False)
    _driver: JobDriver | None = field(default=None, repr=False)
    _imported: bool = False

    @classmethod
    def resolve(cls, apps: tuple[str, ...], url: str | None, env: str | None, *, verbose: bool = False,
                direct_url: str | None = None) -> Config:
        """From flags, then ``X_APP`` / ``X_DATABASE_URL`` / ``X_ENV``, then defaults."""
        if not apps and os.environ.get("X_APP"):
            apps = tuple(part for part in os.environ["X_APP"].split(",") if part)
        environment = parse_environment(env or os.environ.get("X_ENV") or "development",
                                        source="--env" if env else "X_ENV")
        return cls(apps=apps, url=url or database_url(), environment=environment, verbose=verbose,
                   direct_url=direct_url or os.environ.get("X_DATABASE_DIRECT_URL") or None)

    def load_apps(self) -> None:
        """Import the app modules once."""
        if not self._imported:
            import_apps(self.apps)
            self._imported = True

    def driver(self, *, migrate: bool = True) -> JobDriver:
        """The driver for ``url`` (migrated unless told otherwise). Drivers report their own
        failures coded (``X_DATABASE_UNREACHABLE``, ``X_DATABASE_READONLY``...)."""
        if self._driver is None:
            self._driver = create_driver(self.url, migrate=migrate, direct_url=self.direct_url)
        return self._driver

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a driver call (one place to hang cross-cutting concerns on every database call)."""
        return fn(*args, **kwargs)

    def close(self) -> None:
        """Close the driver if one was opened."""
        if self._driver is not None:
            self._driver.close()
            self._driver = None
