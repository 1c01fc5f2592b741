"""The contract's `async_enqueue` concern (src/ultimat3/testing/contract/async_enqueue.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.async_enqueue import *  # noqa: F403
