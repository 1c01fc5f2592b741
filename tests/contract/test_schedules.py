"""The contract's `schedules` concern (src/ultimat3/testing/contract/schedules.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.schedules import *  # noqa: F403
