"""Optional integrations, each behind a pip extra; nothing below this package is imported by the core."""
