"""The contract's `backfill_control` concern (src/ultimat3/testing/contract/backfill_control.py) on memory, SQLite
and PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.backfill_control import *  # noqa: F403
