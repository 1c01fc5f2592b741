-- Periodic schedules, SQLite dialect of postgres/migrations/0004_schedules.sql (times are epoch
-- seconds).

CREATE TABLE IF NOT EXISTS x_schedules (
    key          TEXT PRIMARY KEY,
    last_tick    REAL NOT NULL,
    last_job_id  TEXT,
    paused       INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    changed_at   REAL,
    changed_by   TEXT,
    updated_at   REAL NOT NULL
);
