"""The contract's `cancel_retry` concern (src/ultimat3/testing/contract/cancel_retry.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.cancel_retry import *  # noqa: F403
