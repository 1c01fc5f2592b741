-- Per-attempt history (x jobs show, the dashboard): when each attempt started, on which worker,
-- how and when it ended. A successful attempt is the job row itself (claimed_by, started_at,
-- finished_at), so claim-then-ack writes no second row; every other end of an attempt is written
-- by the trigger below, in the statement that ended it, whatever the path out of `running`.

ALTER TABLE x_jobs ADD COLUMN started_at REAL;

CREATE TABLE IF NOT EXISTS x_attempts (
    seq         INTEGER PRIMARY KEY,
    job_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    worker_id   TEXT,
    started_at  REAL,
    ended_at    REAL NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('failed', 'dead', 'suspended', 'released', 'cancelled', 'lapsed', 'lost')),
    error       TEXT
);
CREATE INDEX IF NOT EXISTS x_attempts_job_idx ON x_attempts (job_id, seq);

CREATE TRIGGER IF NOT EXISTS x_jobs_attempt_ended AFTER UPDATE OF state, claim_token ON x_jobs
    FOR EACH ROW
    WHEN OLD.state = 'running' AND NEW.state <> 'done' AND NEW.claim_token IS NOT OLD.claim_token
BEGIN
    INSERT INTO x_attempts (job_id, attempt, worker_id, started_at, ended_at, outcome, error)
    SELECT OLD.id, OLD.attempt, OLD.claimed_by, OLD.started_at, NEW.updated_at, how,
           CASE WHEN how IN ('failed', 'dead', 'cancelled', 'lost') THEN NEW.last_error END
    FROM (SELECT CASE
        WHEN NEW.state = 'running' THEN 'lapsed'
        WHEN NEW.state IN ('dead', 'cancelled', 'suspended') THEN NEW.state
        WHEN NEW.attempt < OLD.attempt THEN 'released'
        WHEN NEW.last_error LIKE 'X\_WORKER\_LOST%' ESCAPE '\' THEN 'lost'
        ELSE 'failed' END AS how);
END;

-- The history goes with its job (prune, delete): SQLite enforces no foreign key unless asked.
CREATE TRIGGER IF NOT EXISTS x_jobs_attempts_gone AFTER DELETE ON x_jobs
    FOR EACH ROW
BEGIN
    DELETE FROM x_attempts WHERE job_id = OLD.id;
END;
