"""The ``x`` operator CLI (click + rich). ``python -m ultimat3`` runs the same thing."""

from __future__ import annotations

from ultimat3.cli import db, jobs, worker, workers
from ultimat3.cli.main import cli, main

__all__ = ["cli", "db", "jobs", "main", "worker", "workers"]
