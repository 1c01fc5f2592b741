-- The library's own tables, SQLite dialect of postgres/migrations/0001_init.sql: the same tables,
-- columns and indexes. Applied by `x db migrate` (or create_driver(..., migrate=True)) and recorded
-- in x_migrations as "x:0001_init".
--
-- Dialect notes: every time column is epoch seconds (REAL) written from the driver's clock, never
-- from SQLite's own time functions; JSON columns are TEXT holding json.dumps output. Text compares
-- with SQLite's default BINARY collation: byte order, as Postgres's COLLATE "C" and Python's str.

CREATE TABLE IF NOT EXISTS x_migrations (
    id          TEXT PRIMARY KEY,
    applied_at  REAL NOT NULL,
    -- "Oldest first" is application order, even when the clock did not move between two.
    seq         INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS x_jobs (
    id               TEXT PRIMARY KEY,
    run_id           TEXT NOT NULL,
    name             TEXT NOT NULL,
    queue            TEXT NOT NULL DEFAULT 'default',
    payload          TEXT NOT NULL DEFAULT '{}',
    state            TEXT NOT NULL CHECK (state IN ('ready', 'delayed', 'running', 'suspended', 'done', 'dead', 'cancelled')),
    priority         INTEGER NOT NULL DEFAULT 0,
    attempt          INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     INTEGER NOT NULL DEFAULT 5,
    run_at           REAL NOT NULL,
    visible_at       REAL,
    claimed_by       TEXT,
    claim_token      TEXT,
    idempotency_key  TEXT,
    tenant_id        TEXT,
    traceparent      TEXT,
    enqueued_by      TEXT,
    last_error       TEXT,
    result           TEXT,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    finished_at      REAL
);

-- Idempotency is a database fact: one live job per (name, key).
CREATE UNIQUE INDEX IF NOT EXISTS x_jobs_name_idempotency_live_idx
    ON x_jobs (name, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'running', 'suspended');

-- The claim's scan for one queue: only waiting rows, in claim order, so a claim reads the first
-- LIMIT entries instead of sorting every runnable row.
CREATE INDEX IF NOT EXISTS x_jobs_claim_idx
    ON x_jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('ready', 'delayed', 'suspended');

-- The claim's scan for a worker on every queue: the same rows in claim order regardless of
-- queue, so "any queue" is an ordered index walk too instead of a sort of the whole backlog.
CREATE INDEX IF NOT EXISTS x_jobs_claim_any_idx
    ON x_jobs (priority DESC, run_at, id)
    WHERE state IN ('ready', 'delayed', 'suspended');

-- Lapsed claims (lost workers) are found by visibility.
CREATE INDEX IF NOT EXISTS x_jobs_running_visible_idx
    ON x_jobs (visible_at)
    WHERE state = 'running';

CREATE INDEX IF NOT EXISTS x_jobs_created_idx ON x_jobs (created_at DESC, id DESC);

-- Pruning keeps a run's steps while another job still points at the run.
CREATE INDEX IF NOT EXISTS x_jobs_run_idx ON x_jobs (run_id);

-- Retention: pruning scans finished rows by age.
CREATE INDEX IF NOT EXISTS x_jobs_finished_idx
    ON x_jobs (finished_at)
    WHERE state IN ('done', 'dead', 'cancelled');

CREATE TABLE IF NOT EXISTS x_job_steps (
    run_id      TEXT NOT NULL,
    name        TEXT NOT NULL,
    result      TEXT,
    created_at  REAL NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE IF NOT EXISTS x_backfills (
    run_id       TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    checksum     TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    batches      INTEGER NOT NULL DEFAULT 0,
    "rows"       INTEGER NOT NULL DEFAULT 0,
    started_at   REAL NOT NULL,
    finished_at  REAL,
    job_id       TEXT,
    error        TEXT
);

CREATE INDEX IF NOT EXISTS x_backfills_name_idx ON x_backfills (name, started_at DESC);

CREATE TABLE IF NOT EXISTS x_leases (
    key         TEXT NOT NULL,
    slot        INTEGER NOT NULL,
    holder      TEXT NOT NULL,
    token       TEXT NOT NULL,
    expires_at  REAL NOT NULL,
    PRIMARY KEY (key, slot)
);
