-- Periodic schedules: one row per schedule (the job name, or job:name), holding the newest tick it
-- fired. Workers fire a tick by moving last_tick up with a compare-and-set in the same transaction
-- as the tick's enqueue, so each tick fires once however many workers race for it.

CREATE TABLE IF NOT EXISTS x_schedules (
    key          text COLLATE "C" PRIMARY KEY,
    last_tick    timestamptz NOT NULL,
    last_job_id  text,
    paused       boolean NOT NULL DEFAULT false,
    changed_at   timestamptz,
    changed_by   text,
    updated_at   timestamptz NOT NULL
);
