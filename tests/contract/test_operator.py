"""The contract's `operator` concern (src/ultimat3/testing/contract/operator.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.operator import *  # noqa: F403
