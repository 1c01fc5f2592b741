-- Flow control (ultimat3.drivers.flow) and fair claims across tenants: a job's concurrency key and
-- bound, and its rate key and bucket shape, stored on its row at enqueue; the token buckets in
-- x_rates. New columns are nullable with no default, so adding them rewrites nothing.

ALTER TABLE x_jobs ADD COLUMN IF NOT EXISTS flow_key text COLLATE "C";
ALTER TABLE x_jobs ADD COLUMN IF NOT EXISTS flow_max integer CHECK (flow_max >= 1);
ALTER TABLE x_jobs ADD COLUMN IF NOT EXISTS rate_key text COLLATE "C";
ALTER TABLE x_jobs ADD COLUMN IF NOT EXISTS rate_per_second double precision CHECK (rate_per_second > 0);
ALTER TABLE x_jobs ADD COLUMN IF NOT EXISTS rate_burst integer CHECK (rate_burst >= 1);

-- The slots in use: running rows per concurrency key (only rows under a limit are in it).
CREATE INDEX IF NOT EXISTS x_jobs_flow_running_idx
    ON x_jobs (flow_key)
    WHERE state = 'running' AND flow_key IS NOT NULL;

-- The flow claim's walk: waiting rows under flow control, in claim order (none of the others).
CREATE INDEX IF NOT EXISTS x_jobs_flow_claim_idx
    ON x_jobs (priority DESC, run_at, id)
    WHERE state IN ('ready', 'delayed', 'suspended') AND (flow_key IS NOT NULL OR rate_key IS NOT NULL);

-- Fair claims (ClaimRequest.fair): the tenants with waiting jobs, each one's jobs in claim order,
-- so a claim finds every tenant with one probe each, however many jobs the biggest holds.
CREATE INDEX IF NOT EXISTS x_jobs_fair_idx
    ON x_jobs ((coalesce(tenant_id, '')), priority DESC, run_at, id)
    WHERE state IN ('ready', 'delayed', 'suspended') AND flow_key IS NULL AND rate_key IS NULL;

-- One token bucket per rate key: `tokens` as of `at`, refilled at per_second up to burst.
CREATE TABLE IF NOT EXISTS x_rates (
    key         text COLLATE "C" PRIMARY KEY,
    tokens      double precision NOT NULL,
    at          timestamptz NOT NULL,
    per_second  double precision NOT NULL CHECK (per_second > 0),
    burst       integer NOT NULL CHECK (burst >= 1)
);
