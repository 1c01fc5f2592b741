-- Operator tools, SQLite dialect of postgres/migrations/0003_operations.sql: queue pause
-- (x_queues; no row means active) and the audit trail of operator actions (x_audit; target is
-- JSON text, times are epoch seconds).

CREATE TABLE IF NOT EXISTS x_queues (
    queue       TEXT PRIMARY KEY,
    paused      INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    changed_at  REAL NOT NULL,
    changed_by  TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS x_audit (
    id           TEXT PRIMARY KEY,
    at           REAL NOT NULL,
    actor        TEXT NOT NULL,
    action       TEXT NOT NULL CHECK (action IN ('retry', 'cancel', 'delete', 'pause', 'resume')),
    target       TEXT NOT NULL,
    touched      INTEGER NOT NULL DEFAULT 0,
    status       TEXT NOT NULL CHECK (status IN ('running', 'completed', 'interrupted', 'failed')),
    finished_at  REAL
);

-- rowid breaks ties between acts made within one clock tick.
CREATE INDEX IF NOT EXISTS x_audit_at_idx ON x_audit (at DESC);
