"""The app config Django loads for ``"ultimat3.contrib.django"`` in ``INSTALLED_APPS``."""

from __future__ import annotations

import importlib
import importlib.util

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from ultimat3.contrib.django.settings import load_settings
from ultimat3.contrib.django.store import get_driver
from ultimat3.jobs.runtime import set_driver_factory

__all__ = ["UltimatConfig"]


def discovered_modules() -> list[str]:
    """The modules that declare this project's jobs: each installed app's ``DISCOVER``
    submodules that exist, then ``APPS``."""
    from django.apps import apps

    loaded = load_settings()
    found: list[str] = []
    for config in apps.get_app_configs():
        for submodule in loaded.discover:
            name = f"{config.name}.{submodule}"
            if _exists(name):
                found.append(name)
    return [*found, *loaded.apps]


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


class UltimatConfig(AppConfig):
    """Validates ``settings.ULTIMAT3``, imports every app's jobs and backfills, and makes the
    project's job store the default driver of ``job.enqueue(...)`` (opened on first use)."""

    name = "ultimat3.contrib.django"
    label = "ultimat3"
    verbose_name = "ultimat3 jobs"

    def ready(self) -> None:
        """Runs once, when Django has loaded every app."""
        loaded = load_settings()
        autodiscover_modules(*loaded.discover)
        for module in loaded.apps:
            importlib.import_module(module)
        set_driver_factory(get_driver)
