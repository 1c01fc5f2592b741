"""Debian packages some tests need (PgBouncer, libfaketime): found on the machine, or installed from
the system package registry when the tests run as root with apt-get, never by hand."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

__all__ = ["ensure_debian_package"]


def ensure_debian_package(package: str, find: Callable[[], str | None]) -> str | None:
    """What ``find()`` finds, after installing ``package`` if it found nothing; ``None`` when the
    package is still missing (the caller skips locally or fails under CI)."""
    found = find()
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "-q", package], env=env, capture_output=True).returncode:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-q", package], env=env, capture_output=True)
        found = find()
    return found
