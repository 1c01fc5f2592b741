-- The worker registry, SQLite dialect of postgres/migrations/0002_workers.sql. One row per running
-- worker process, removed on clean shutdown or by the rescue that finds it dead. Liveness is NOT in
-- this table: it is an flock on the worker's lock file beside the database, which the kernel frees
-- the moment the process dies. queues is a JSON array, NULL for every queue.

CREATE TABLE IF NOT EXISTS x_workers (
    id            TEXT PRIMARY KEY,
    host          TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    concurrency   INTEGER NOT NULL,
    queues        TEXT,
    started_at    REAL NOT NULL,
    last_seen_at  REAL NOT NULL,
    clock_offset  REAL,
    wakeups       TEXT
);
