"""ultimat3: durable background jobs and paced, ledgered backfills for Python."""

__version__ = "0.1.0"
