-- Flow control (ultimat3.drivers.flow) and fair claims across tenants: a job's concurrency key and
-- bound, and its rate key and bucket shape, stored on its row at enqueue; the token buckets in
-- x_rates.

ALTER TABLE x_jobs ADD COLUMN flow_key TEXT;
ALTER TABLE x_jobs ADD COLUMN flow_max INTEGER CHECK (flow_max >= 1);
ALTER TABLE x_jobs ADD COLUMN rate_key TEXT;
ALTER TABLE x_jobs ADD COLUMN rate_per_second REAL CHECK (rate_per_second > 0);
ALTER TABLE x_jobs ADD COLUMN rate_burst INTEGER CHECK (rate_burst >= 1);

-- The slots in use: running rows per concurrency key.
CREATE INDEX IF NOT EXISTS x_jobs_flow_running_idx
    ON x_jobs (flow_key)
    WHERE state = 'running' AND flow_key IS NOT NULL;

-- The flow claim's walk: waiting rows under flow control, in claim order.
CREATE INDEX IF NOT EXISTS x_jobs_flow_claim_idx
    ON x_jobs (priority DESC, run_at, id)
    WHERE state IN ('ready', 'delayed', 'suspended') AND (flow_key IS NOT NULL OR rate_key IS NOT NULL);

-- Fair claims (ClaimRequest.fair): the tenants with waiting jobs, each one's jobs in claim order,
-- so a claim finds every tenant with one probe each, however many jobs the biggest holds.
CREATE INDEX IF NOT EXISTS x_jobs_fair_idx
    ON x_jobs ((coalesce(tenant_id, '')), priority DESC, run_at, id)
    WHERE state IN ('ready', 'delayed', 'suspended') AND flow_key IS NULL AND rate_key IS NULL;

-- One token bucket per rate key: `tokens` as of `at` (epoch seconds), refilled up to burst.
CREATE TABLE IF NOT EXISTS x_rates (
    key         TEXT PRIMARY KEY,
    tokens      REAL NOT NULL,
    at          REAL NOT NULL,
    per_second  REAL NOT NULL CHECK (per_second > 0),
    burst       INTEGER NOT NULL CHECK (burst >= 1)
) WITHOUT ROWID;
