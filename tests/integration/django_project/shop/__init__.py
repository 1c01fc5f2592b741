"""An app with a model, jobs, a backfill and a migration gated on it."""
