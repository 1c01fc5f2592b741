"""The contract's `settle` concern (src/ultimat3/testing/contract/settle.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.settle import *  # noqa: F403
