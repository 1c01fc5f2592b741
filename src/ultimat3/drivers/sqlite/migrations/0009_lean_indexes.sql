-- The x_jobs indexes, made cheaper to keep on every write (issue 13; bench/index_cost_sqlite.py).
--
-- SQLite evaluates a partial index's predicate on every UPDATE that touches a column it names, for
-- the old row and the new, and it evaluates `state IN ('a', 'b', 'c')` (more than two values) by
-- building a small temporary b-tree each time: about 5 us per index per claim, ack or insert, paid
-- even by an index the row is in neither before nor after. The same test written as equalities
-- joined by OR costs next to nothing, so every predicate that names a list of states is rebuilt
-- that way. A query still uses such an index only when its WHERE states the same OR term
-- (queries.sql writes them so; tests/integration/test_sqlite_driver.py checks the plans).
--
-- x_jobs_run_idx goes: a run id is minted with its job and no other job ever carries it, so
-- deleting a job takes its run's steps without asking whether another job still points at them.

DROP INDEX IF EXISTS x_jobs_run_idx;

DROP INDEX IF EXISTS x_jobs_name_idempotency_live_idx;
CREATE UNIQUE INDEX x_jobs_name_idempotency_live_idx
    ON x_jobs (name, idempotency_key)
    WHERE idempotency_key IS NOT NULL
      AND (state = 'ready' OR state = 'delayed' OR state = 'running' OR state = 'suspended');

DROP INDEX IF EXISTS x_jobs_claim_idx;
CREATE INDEX x_jobs_claim_idx
    ON x_jobs (queue, priority DESC, run_at, id)
    WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended');

DROP INDEX IF EXISTS x_jobs_claim_any_idx;
CREATE INDEX x_jobs_claim_any_idx
    ON x_jobs (priority DESC, run_at, id)
    WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended');

DROP INDEX IF EXISTS x_jobs_finished_idx;
CREATE INDEX x_jobs_finished_idx
    ON x_jobs (finished_at)
    WHERE (state = 'done' OR state = 'dead' OR state = 'cancelled');

DROP INDEX IF EXISTS x_jobs_flow_claim_idx;
CREATE INDEX x_jobs_flow_claim_idx
    ON x_jobs (priority DESC, run_at, id)
    WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended')
      AND (flow_key IS NOT NULL OR rate_key IS NOT NULL);

DROP INDEX IF EXISTS x_jobs_fair_idx;
CREATE INDEX x_jobs_fair_idx
    ON x_jobs ((coalesce(tenant_id, '')), priority DESC, run_at, id)
    WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended') AND flow_key IS NULL AND rate_key IS NULL;
