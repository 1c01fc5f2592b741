"""The contract's `starvation` concern (src/ultimat3/testing/contract/starvation.py) on memory,
SQLite and PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.starvation import *  # noqa: F403
