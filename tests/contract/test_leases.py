"""The contract's `leases` concern (src/ultimat3/testing/contract/leases.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.leases import *  # noqa: F403
