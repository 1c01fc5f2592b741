-- The database-health throttle's questions (see health.py), asked of the database a backfill
-- sweeps, on PostgreSQL. Run through SQLAlchemy text(): :name parameters.

-- name: health
-- One round trip: the oldest open transaction (seconds), sessions waiting for a lock while they
-- touch one of :tables (qualified, quoted names), the worst replica replay lag (seconds), and how
-- many sessions or replicas this role cannot see into (the check cannot decide past those).
SELECT
    (SELECT coalesce(extract(epoch FROM max(now() - a.xact_start)), 0)::float8
       FROM pg_stat_activity AS a
      WHERE a.datname = current_database() AND a.backend_type = 'client backend'
        AND a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid()) AS oldest_transaction,
    (SELECT count(DISTINCT a.pid)
       FROM pg_stat_activity AS a JOIN pg_locks AS l ON l.pid = a.pid
      WHERE a.wait_event_type = 'Lock' AND a.pid <> pg_backend_pid()
        AND l.relation IN (SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) AS t)) AS lock_waiters,
    (SELECT coalesce(extract(epoch FROM max(r.replay_lag)), 0)::float8
       FROM pg_stat_replication AS r) AS replica_lag,
    -- A role without pg_read_all_stats sees other roles' sessions with every column but pid NULL,
    -- backend_type and datname included, so which database they are in cannot be told either.
    (SELECT count(*) FROM pg_stat_activity AS a WHERE a.backend_type IS NULL)
    + (SELECT count(*) FROM pg_stat_replication AS r WHERE r.state IS NULL) AS hidden
