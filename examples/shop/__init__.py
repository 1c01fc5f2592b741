"""A small shop: tenanted customers, a few jobs and two backfills. Used by the README demo and tests."""
