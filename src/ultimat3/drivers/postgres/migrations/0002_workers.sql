-- The worker registry: one row per running worker process, removed on clean shutdown or by the
-- rescue that finds it dead. Liveness is NOT in this table: each worker holds a session-level
-- advisory lock (see `worker_lock` in queries.sql) on a connection it keeps open, and the server
-- frees it the moment that connection dies. backend_pid is the server process of that session,
-- NULL when the session turned out to go through a transaction-mode pooler (then nobody can tell
-- whether the worker lives, and nobody rescues it). queues is NULL for every queue.

CREATE TABLE IF NOT EXISTS x_workers (
    id            text COLLATE "C" PRIMARY KEY,
    host          text NOT NULL,
    pid           integer NOT NULL,
    concurrency   integer NOT NULL,
    queues        text[],
    started_at    timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL,
    clock_offset  double precision,
    wakeups       text,
    backend_pid   integer
);
