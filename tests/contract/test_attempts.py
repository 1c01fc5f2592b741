"""The contract's `attempts` concern (src/ultimat3/testing/contract/attempts.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.attempts import *  # noqa: F403
