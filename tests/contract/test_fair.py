"""The contract's `fair` concern (src/ultimat3/testing/contract/fair.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.fair import *  # noqa: F403
