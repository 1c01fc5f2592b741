"""The contract's `enqueue` concern (src/ultimat3/testing/contract/enqueue.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.enqueue import *  # noqa: F403
