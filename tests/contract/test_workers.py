"""The contract's `workers` concern (src/ultimat3/testing/contract/workers.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.workers import *  # noqa: F403
