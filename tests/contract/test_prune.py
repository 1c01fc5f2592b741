"""The contract's `prune` concern (src/ultimat3/testing/contract/prune.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.prune import *  # noqa: F403
