"""The PostgreSQL driver, for a fleet of workers."""
