"""The contract's `steps` concern (src/ultimat3/testing/contract/steps.py) on memory, SQLite and
PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.steps import *  # noqa: F403
