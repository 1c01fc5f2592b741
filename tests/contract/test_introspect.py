"""The contract's `introspect` concern (src/ultimat3/testing/contract/introspect.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.introspect import *  # noqa: F403
