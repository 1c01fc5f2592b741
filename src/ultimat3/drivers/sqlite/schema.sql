-- index x_attempts_job_idx
CREATE INDEX x_attempts_job_idx ON x_attempts (job_id, seq);

-- index x_audit_at_idx
CREATE INDEX x_audit_at_idx ON x_audit (at DESC);

-- index x_backfill_failures_run_idx
CREATE INDEX x_backfill_failures_run_idx ON x_backfill_failures (run_id);

-- index x_backfills_name_idx
CREATE INDEX x_backfills_name_idx ON x_backfills (name, started_at DESC);

-- index x_jobs_claim_any_idx
CREATE INDEX x_jobs_claim_any_idx ON x_jobs (priority DESC, run_at, id) WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended');

-- index x_jobs_claim_idx
CREATE INDEX x_jobs_claim_idx ON x_jobs (queue, priority DESC, run_at, id) WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended');

-- index x_jobs_created_idx
CREATE INDEX x_jobs_created_idx ON x_jobs (created_at DESC, id DESC);

-- index x_jobs_fair_idx
CREATE INDEX x_jobs_fair_idx ON x_jobs ((coalesce(tenant_id, '')), priority DESC, run_at, id) WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended') AND flow_key IS NULL AND rate_key IS NULL;

-- index x_jobs_finished_idx
CREATE INDEX x_jobs_finished_idx ON x_jobs (finished_at) WHERE (state = 'done' OR state = 'dead' OR state = 'cancelled');

-- index x_jobs_flow_claim_idx
CREATE INDEX x_jobs_flow_claim_idx ON x_jobs (priority DESC, run_at, id) WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended') AND (flow_key IS NOT NULL OR rate_key IS NOT NULL);

-- index x_jobs_flow_running_idx
CREATE INDEX x_jobs_flow_running_idx ON x_jobs (flow_key) WHERE state = 'running' AND flow_key IS NOT NULL;

-- index x_jobs_name_idempotency_live_idx
CREATE UNIQUE INDEX x_jobs_name_idempotency_live_idx ON x_jobs (name, idempotency_key) WHERE idempotency_key IS NOT NULL AND (state = 'ready' OR state = 'delayed' OR state = 'running' OR state = 'suspended');

-- index x_jobs_running_visible_idx
CREATE INDEX x_jobs_running_visible_idx ON x_jobs (visible_at) WHERE state = 'running';

-- table x_attempts
CREATE TABLE x_attempts ( seq INTEGER PRIMARY KEY, job_id TEXT NOT NULL, attempt INTEGER NOT NULL, worker_id TEXT, started_at REAL, ended_at REAL NOT NULL, outcome TEXT NOT NULL CHECK (outcome IN ('failed', 'dead', 'suspended', 'released', 'cancelled', 'lapsed', 'lost')), error TEXT );

-- table x_audit
CREATE TABLE x_audit ( id TEXT PRIMARY KEY, at REAL NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL CHECK (action IN ('retry', 'cancel', 'delete', 'pause', 'resume')), target TEXT NOT NULL, touched INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'interrupted', 'failed')), finished_at REAL );

-- table x_backfill_failures
CREATE TABLE x_backfill_failures ( name TEXT NOT NULL, key TEXT NOT NULL, reason TEXT NOT NULL, run_id TEXT NOT NULL, batch INTEGER NOT NULL, failed_at REAL NOT NULL, PRIMARY KEY (name, key) ) WITHOUT ROWID;

-- table x_backfills
CREATE TABLE "x_backfills" ( run_id TEXT PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN ('running', 'paused', 'completed', 'failed', 'cancelled')), batches INTEGER NOT NULL DEFAULT 0, "rows" INTEGER NOT NULL DEFAULT 0, started_at REAL NOT NULL, finished_at REAL, job_id TEXT, error TEXT, kind TEXT NOT NULL DEFAULT 'pass' CHECK (kind IN ('pass', 'retry')), failures INTEGER NOT NULL DEFAULT 0, throttle TEXT, paused_by TEXT );

-- table x_job_steps
CREATE TABLE x_job_steps ( run_id TEXT NOT NULL, name TEXT NOT NULL, result TEXT, created_at REAL NOT NULL, PRIMARY KEY (run_id, name) );

-- table x_jobs
CREATE TABLE x_jobs ( id TEXT PRIMARY KEY, run_id TEXT NOT NULL, name TEXT NOT NULL, queue TEXT NOT NULL DEFAULT 'default', payload TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL CHECK (state IN ('ready', 'delayed', 'running', 'suspended', 'done', 'dead', 'cancelled')), priority INTEGER NOT NULL DEFAULT 0, attempt INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0), max_attempts INTEGER NOT NULL DEFAULT 5, run_at REAL NOT NULL, visible_at REAL, claimed_by TEXT, claim_token TEXT, idempotency_key TEXT, tenant_id TEXT, traceparent TEXT, enqueued_by TEXT, last_error TEXT, result TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL, finished_at REAL , flow_key TEXT, flow_max INTEGER CHECK (flow_max >= 1), rate_key TEXT, rate_per_second REAL CHECK (rate_per_second > 0), rate_burst INTEGER CHECK (rate_burst >= 1), started_at REAL);

-- table x_leases
CREATE TABLE x_leases ( key TEXT NOT NULL, slot INTEGER NOT NULL, holder TEXT NOT NULL, token TEXT NOT NULL, expires_at REAL NOT NULL, PRIMARY KEY (key, slot) );

-- table x_migrations
CREATE TABLE x_migrations ( id TEXT PRIMARY KEY, applied_at REAL NOT NULL, -- "Oldest first" is application order, even when the clock did not move between two. seq INTEGER NOT NULL );

-- table x_queues
CREATE TABLE x_queues ( queue TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)), changed_at REAL NOT NULL, changed_by TEXT NOT NULL );

-- table x_rates
CREATE TABLE x_rates ( key TEXT PRIMARY KEY, tokens REAL NOT NULL, at REAL NOT NULL, per_second REAL NOT NULL CHECK (per_second > 0), burst INTEGER NOT NULL CHECK (burst >= 1) ) WITHOUT ROWID;

-- table x_schedules
CREATE TABLE x_schedules ( key TEXT PRIMARY KEY, last_tick REAL NOT NULL, last_job_id TEXT, paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)), changed_at REAL, changed_by TEXT, updated_at REAL NOT NULL );

-- table x_workers
CREATE TABLE x_workers ( id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, concurrency INTEGER NOT NULL, queues TEXT, started_at REAL NOT NULL, last_seen_at REAL NOT NULL, clock_offset REAL, wakeups TEXT );

-- trigger x_jobs_attempt_ended
CREATE TRIGGER x_jobs_attempt_ended AFTER UPDATE OF state, claim_token ON x_jobs FOR EACH ROW WHEN OLD.state = 'running' AND NEW.state <> 'done' AND NEW.claim_token IS NOT OLD.claim_token BEGIN INSERT INTO x_attempts (job_id, attempt, worker_id, started_at, ended_at, outcome, error) SELECT OLD.id, OLD.attempt, OLD.claimed_by, OLD.started_at, NEW.updated_at, how, CASE WHEN how IN ('failed', 'dead', 'cancelled', 'lost') THEN NEW.last_error END FROM (SELECT CASE WHEN NEW.state = 'running' THEN 'lapsed' WHEN NEW.state IN ('dead', 'cancelled', 'suspended') THEN NEW.state WHEN NEW.attempt < OLD.attempt THEN 'released' WHEN NEW.last_error LIKE 'X\_WORKER\_LOST%' ESCAPE '\' THEN 'lost' ELSE 'failed' END AS how); END;

-- trigger x_jobs_attempts_gone
CREATE TRIGGER x_jobs_attempts_gone AFTER DELETE ON x_jobs FOR EACH ROW BEGIN DELETE FROM x_attempts WHERE job_id = OLD.id; END;

