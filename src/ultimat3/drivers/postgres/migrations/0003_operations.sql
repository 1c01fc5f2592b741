-- Operator tools: queue pause (x_queues) and the audit trail of operator actions (x_audit).
-- A queue without a row here is active; every claim skips the queues whose row says paused.
-- x_audit keeps one row per act (seq orders acts made within one clock tick): who, when, what (a filter or a queue, as JSON), how many jobs
-- it touched (a bulk action adds to it in each batch's own transaction) and whether it finished.

CREATE TABLE IF NOT EXISTS x_queues (
    queue       text COLLATE "C" PRIMARY KEY,
    paused      boolean NOT NULL DEFAULT false,
    changed_at  timestamptz NOT NULL,
    changed_by  text NOT NULL
);

CREATE TABLE IF NOT EXISTS x_audit (
    id           text COLLATE "C" PRIMARY KEY,
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    at           timestamptz NOT NULL,
    actor        text NOT NULL,
    action       text NOT NULL CHECK (action IN ('retry', 'cancel', 'delete', 'pause', 'resume')),
    target       jsonb NOT NULL,
    touched      bigint NOT NULL DEFAULT 0,
    status       text NOT NULL CHECK (status IN ('running', 'completed', 'interrupted', 'failed')),
    finished_at  timestamptz
);

CREATE INDEX IF NOT EXISTS x_audit_at_idx ON x_audit (at DESC, seq DESC);
