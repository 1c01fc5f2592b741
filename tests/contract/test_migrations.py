"""The contract's `migrations` concern (src/ultimat3/testing/contract/migrations.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.migrations import *  # noqa: F403
