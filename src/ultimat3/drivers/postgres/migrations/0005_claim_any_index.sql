-- The index of claims over every queue gets a predicate term only those claims state (attempt >= 0,
-- true of every row: a CHECK holds it). A claim of ONE queue must walk x_jobs_claim_idx from its
-- queue, never this index filtered by queue: with another queue's backlog at a higher priority,
-- that filter stepped over the whole backlog on every claim (claim_queue_from's higher-priority
-- range, 21,000 buffers a claim beside 100,000 waiting rows elsewhere). Now the planner cannot pick it.
DROP INDEX IF EXISTS x_jobs_claim_any_idx;
CREATE INDEX IF NOT EXISTS x_jobs_claim_any_idx ON x_jobs (priority DESC, run_at, id)
    WHERE state IN ('ready', 'delayed', 'suspended') AND attempt >= 0;
