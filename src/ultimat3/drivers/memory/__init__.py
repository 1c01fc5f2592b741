"""The memory driver: jobs in this process only (tests, development); it passes the same contract
suite as SQLite and PostgreSQL."""

from ultimat3.drivers.memory.driver import *  # noqa: F403
from ultimat3.drivers.memory.driver import __all__ as __all__
