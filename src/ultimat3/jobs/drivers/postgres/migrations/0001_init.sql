-- The library's own tables. Applied by `x db migrate` (or create_driver(..., migrate=True)) and
-- recorded in x_migrations as "x:0001_init". Every time column is written from the driver's clock.

CREATE TABLE IF NOT EXISTS x_migrations (
    id          text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS x_jobs (
    id               text PRIMARY KEY,
    run_id           text NOT NULL,
    name             text NOT NULL,
    queue            text NOT NULL DEFAULT 'default',
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb,
    state            text NOT NULL CHECK (state IN ('ready', 'delayed', 'running', 'suspended', 'done', 'dead', 'cancelled')),
    priority         integer NOT NULL DEFAULT 0,
    attempt          integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     integer NOT NULL DEFAULT 5,
    run_at           timestamptz NOT NULL,
    visible_at       timestamptz,
    claimed_by       text,
    claim_token      text,
    idempotency_key  text,
    tenant_id        text,
    traceparent      text,
    enqueued_by      text,
    last_error       text,
    result           jsonb,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz
);

-- Idempotency is a database fact: one live job per (name, key).
CREATE UNIQUE INDEX IF NOT EXISTS x_jobs_name_idempotency_live_idx
    ON x_jobs (name, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'running', 'suspended');

-- The claim's scan: only waiting rows, in claim order.
CREATE INDEX IF NOT EXISTS x_jobs_claim_idx
    ON x_jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('ready', 'delayed', 'suspended');

-- Lapsed claims (lost workers) are found by visibility.
CREATE INDEX IF NOT EXISTS x_jobs_running_visible_idx
    ON x_jobs (visible_at)
    WHERE state = 'running';

CREATE INDEX IF NOT EXISTS x_jobs_created_idx ON x_jobs (created_at DESC, id DESC);

-- Retention: pruning scans finished rows by age.
CREATE INDEX IF NOT EXISTS x_jobs_finished_idx
    ON x_jobs (finished_at)
    WHERE state IN ('done', 'dead', 'cancelled');

CREATE TABLE IF NOT EXISTS x_job_steps (
    run_id      text NOT NULL,
    name        text NOT NULL,
    result      jsonb,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE IF NOT EXISTS x_backfills (
    run_id       text PRIMARY KEY,
    name         text NOT NULL,
    checksum     text NOT NULL,
    status       text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    batches      integer NOT NULL DEFAULT 0,
    rows         bigint NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    job_id       text,
    error        text
);

CREATE INDEX IF NOT EXISTS x_backfills_name_idx ON x_backfills (name, started_at DESC);

CREATE TABLE IF NOT EXISTS x_leases (
    key         text NOT NULL,
    slot        integer NOT NULL,
    holder      text NOT NULL,
    token       text NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (key, slot)
);
