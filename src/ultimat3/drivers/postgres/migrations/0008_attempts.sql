-- Per-attempt history (x jobs show, the dashboard): when each attempt started, on which worker,
-- how and when it ended. A successful attempt is the job row itself (claimed_by, started_at,
-- finished_at), so the hot path -- claim, then ack -- writes no second row; every other end of an
-- attempt (a failure, a dead-letter, a suspension, a release, a cancel, a lapsed claim taken over,
-- a rescue from a dead worker) is written by the trigger below, in the statement that ended it, so
-- no path out of `running` -- today's or a future one -- can forget it.

ALTER TABLE x_jobs ADD COLUMN IF NOT EXISTS started_at timestamptz;

CREATE TABLE IF NOT EXISTS x_attempts (
    seq         bigserial PRIMARY KEY,
    job_id      text COLLATE "C" NOT NULL,
    attempt     integer NOT NULL,
    worker_id   text,
    started_at  timestamptz,
    ended_at    timestamptz NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('failed', 'dead', 'suspended', 'released', 'cancelled', 'lapsed', 'lost')),
    error       text
);
-- No foreign key: a TRUNCATE of x_jobs (a test suite's reset) must keep working; the two deletes
-- of x_jobs rows (prune, bulk delete) take the history with them in the same statement.
CREATE INDEX IF NOT EXISTS x_attempts_job_idx ON x_attempts (job_id, seq);

CREATE OR REPLACE FUNCTION x_attempt_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    how text := CASE
        WHEN NEW.state = 'running' THEN 'lapsed'
        WHEN NEW.state IN ('dead', 'cancelled', 'suspended') THEN NEW.state
        WHEN NEW.attempt < OLD.attempt THEN 'released'
        WHEN NEW.last_error LIKE 'X\_WORKER\_LOST%' THEN 'lost'
        ELSE 'failed' END;
BEGIN
    INSERT INTO x_attempts (job_id, attempt, worker_id, started_at, ended_at, outcome, error)
    VALUES (OLD.id, OLD.attempt, OLD.claimed_by, OLD.started_at, NEW.updated_at, how,
            CASE WHEN how IN ('failed', 'dead', 'cancelled', 'lost') THEN NEW.last_error END);
    RETURN NULL;
END $$;

-- WHEN is evaluated without entering PL/pgSQL: an ack (state done) and a heartbeat (same token)
-- pay only this test.
DROP TRIGGER IF EXISTS x_jobs_attempt_ended ON x_jobs;
CREATE TRIGGER x_jobs_attempt_ended AFTER UPDATE ON x_jobs
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state <> 'done' AND NEW.claim_token IS DISTINCT FROM OLD.claim_token)
    EXECUTE FUNCTION x_attempt_ended();
