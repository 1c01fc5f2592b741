-- The library's own tables. Applied by `x db migrate` (or create_driver(..., migrate=True)) and
-- recorded in x_migrations as "x:0001_init". Every time column is written from the driver's clock,
-- so no column defaults to now().
--
-- Identifiers and names are COLLATE "C": byte order is what every driver sorts by (the memory
-- driver compares Python strings), and it is the cheapest collation for the btrees below.

CREATE TABLE IF NOT EXISTS x_migrations (
    id          text COLLATE "C" PRIMARY KEY,
    applied_at  timestamptz NOT NULL,
    -- "Oldest first" is application order, even when the clock did not move between two.
    seq         bigint GENERATED ALWAYS AS IDENTITY
);

CREATE TABLE IF NOT EXISTS x_jobs (
    id               text COLLATE "C" PRIMARY KEY,
    run_id           text COLLATE "C" NOT NULL,
    name             text COLLATE "C" NOT NULL,
    queue            text COLLATE "C" NOT NULL DEFAULT 'default',
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb,
    state            text NOT NULL CHECK (state IN ('ready', 'delayed', 'running', 'suspended', 'done', 'dead', 'cancelled')),
    priority         integer NOT NULL DEFAULT 0,
    attempt          integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     integer NOT NULL DEFAULT 5,
    run_at           timestamptz NOT NULL,
    visible_at       timestamptz,
    claimed_by       text,
    claim_token      text,
    idempotency_key  text COLLATE "C",
    tenant_id        text COLLATE "C",
    traceparent      text,
    enqueued_by      text,
    last_error       text,
    result           jsonb,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz
)
-- A queue table churns: every claim and settlement leaves a dead tuple behind. Vacuum it sooner
-- than the 20% default so the claim's index scan does not wade through dead entries.
WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05);

-- Idempotency is a database fact: one live job per (name, key).
CREATE UNIQUE INDEX IF NOT EXISTS x_jobs_name_idempotency_live_idx
    ON x_jobs (name, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'running', 'suspended');

-- The claim's scan for a worker on one queue: only waiting rows, already in claim order.
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
    run_id      text COLLATE "C" NOT NULL,
    name        text COLLATE "C" NOT NULL,
    result      jsonb,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE IF NOT EXISTS x_backfills (
    run_id       text COLLATE "C" PRIMARY KEY,
    name         text COLLATE "C" NOT NULL,
    checksum     text NOT NULL,
    status       text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    batches      integer NOT NULL DEFAULT 0,
    rows         bigint NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    job_id       text COLLATE "C",
    error        text
);

CREATE INDEX IF NOT EXISTS x_backfills_name_idx ON x_backfills (name, started_at DESC);

CREATE TABLE IF NOT EXISTS x_leases (
    key         text COLLATE "C" NOT NULL,
    slot        integer NOT NULL,
    holder      text NOT NULL,
    token       text NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (key, slot)
);
