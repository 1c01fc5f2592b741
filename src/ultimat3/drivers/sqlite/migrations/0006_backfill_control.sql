-- Backfills an operator can steer: a pass can be paused (status 'paused', who asked in paused_by),
-- say why it waits (throttle), and quarantine rows its handler could not handle
-- (x_backfill_failures, counted per pass in failures) for a later 'retry' pass.
-- SQLite cannot alter a CHECK constraint, so x_backfills is rebuilt (the documented 12-step way:
-- new table, copy, drop, rename, index) inside the migration's transaction.

CREATE TABLE x_backfills_new (
    run_id       TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    checksum     TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('running', 'paused', 'completed', 'failed', 'cancelled')),
    batches      INTEGER NOT NULL DEFAULT 0,
    "rows"       INTEGER NOT NULL DEFAULT 0,
    started_at   REAL NOT NULL,
    finished_at  REAL,
    job_id       TEXT,
    error        TEXT,
    kind         TEXT NOT NULL DEFAULT 'pass' CHECK (kind IN ('pass', 'retry')),
    failures     INTEGER NOT NULL DEFAULT 0,
    throttle     TEXT,
    paused_by    TEXT
);
INSERT INTO x_backfills_new (run_id, name, checksum, status, batches, "rows", started_at, finished_at, job_id, error)
SELECT run_id, name, checksum, status, batches, "rows", started_at, finished_at, job_id, error FROM x_backfills;
DROP TABLE x_backfills;
ALTER TABLE x_backfills_new RENAME TO x_backfills;
CREATE INDEX IF NOT EXISTS x_backfills_name_idx ON x_backfills (name, started_at DESC);

CREATE TABLE IF NOT EXISTS x_backfill_failures (
    name       TEXT NOT NULL,
    key        TEXT NOT NULL,
    reason     TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    batch      INTEGER NOT NULL,
    failed_at  REAL NOT NULL,
    PRIMARY KEY (name, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS x_backfill_failures_run_idx ON x_backfill_failures (run_id);
