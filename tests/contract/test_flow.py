"""The contract's `flow` concern (src/ultimat3/testing/contract/flow.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.flow import *  # noqa: F403
