"""The contract's `queues` concern (src/ultimat3/testing/contract/queues.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.queues import *  # noqa: F403
