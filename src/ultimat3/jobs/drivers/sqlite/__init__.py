"""The embedded SQLite driver (the default)."""
