"""The ``x`` operator CLI (click + rich). ``python -m ultimat3`` runs the same thing."""

from __future__ import annotations

from ultimat3.cli import audit, db, jobs, queues, schedules, web, worker, workers
from ultimat3.cli.main import cli, main

__all__ = ["audit", "cli", "db", "jobs", "main", "queues", "schedules", "web", "worker", "workers"]
