-- Backfills an operator can steer: a pass can be paused (status 'paused', who asked in paused_by),
-- say why it waits (throttle: a tripped database-health check), and quarantine rows its handler
-- could not handle (x_backfill_failures, counted per pass in failures) for a later 'retry' pass.

ALTER TABLE x_backfills DROP CONSTRAINT IF EXISTS x_backfills_status_check;
ALTER TABLE x_backfills ADD CONSTRAINT x_backfills_status_check
    CHECK (status IN ('running', 'paused', 'completed', 'failed', 'cancelled'));
ALTER TABLE x_backfills ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'pass'
    CHECK (kind IN ('pass', 'retry'));
ALTER TABLE x_backfills ADD COLUMN IF NOT EXISTS failures integer NOT NULL DEFAULT 0;
ALTER TABLE x_backfills ADD COLUMN IF NOT EXISTS throttle text;
ALTER TABLE x_backfills ADD COLUMN IF NOT EXISTS paused_by text;

-- One row per quarantined row of a backfill, keyed by the row's encoded key: a later pass that
-- fails the same row takes it over, one that handles it deletes it.
CREATE TABLE IF NOT EXISTS x_backfill_failures (
    name       text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    reason     text NOT NULL,
    run_id     text COLLATE "C" NOT NULL,
    batch      integer NOT NULL,
    failed_at  timestamptz NOT NULL,
    PRIMARY KEY (name, key)
);
CREATE INDEX IF NOT EXISTS x_backfill_failures_run_idx ON x_backfill_failures (run_id);
