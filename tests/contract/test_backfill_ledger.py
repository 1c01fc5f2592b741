"""The contract's `backfill_ledger` concern (src/ultimat3/testing/contract/backfill_ledger.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.backfill_ledger import *  # noqa: F403
