"""The contract's `transactions` concern (src/ultimat3/testing/contract/transactions.py) on memory,
SQLite and PostgreSQL, through the public entry point a third-party driver uses."""

from ultimat3.testing.contract.transactions import *  # noqa: F403
