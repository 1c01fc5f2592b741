"""The contract's `fencing` concern (src/ultimat3/testing/contract/fencing.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.fencing import *  # noqa: F403
