"""The contract's `subscribe` concern (src/ultimat3/testing/contract/subscribe.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.subscribe import *  # noqa: F403
