"""The contract's `claim` concern (src/ultimat3/testing/contract/claim.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.claim import *  # noqa: F403
