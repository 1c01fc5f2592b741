-- Every statement the SQLite driver runs, by name. `ultimat3.drivers.sql` splits this file on the
-- `-- name: <query>` headers once at import; the driver looks statements up by name. Values are
-- always named parameters; nothing here is assembled by string formatting.
--
-- Times are epoch seconds from the driver's clock (:now), never SQLite's own time functions.

-- name: migrations_table_exists
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'x_migrations';

-- name: migrations_applied
-- Application order, even when the clock did not move between two.
SELECT id, applied_at FROM x_migrations ORDER BY seq;

-- name: migration_is_applied
SELECT 1 FROM x_migrations WHERE id = :id;

-- name: migration_mark_applied
-- seq is max + 1: every writer holds SQLite's one write lock, so no two read the same max.
INSERT INTO x_migrations (id, applied_at, seq)
SELECT :id, :now, coalesce(max(seq), 0) + 1 FROM x_migrations WHERE true
ON CONFLICT (id) DO NOTHING;

-- name: database_file
-- The file behind a connection's main schema, to check a caller's connection is ours.
SELECT file FROM pragma_database_list WHERE name = 'main';

-- name: job_insert
-- The partial unique index on (name, idempotency_key) over live states decides dedupe: a live
-- duplicate makes this insert nothing (rowcount 0) and the caller looks the live row up.
INSERT INTO x_jobs (
    id, run_id, name, queue, payload, state, priority, attempt, max_attempts, run_at,
    idempotency_key, tenant_id, traceparent, enqueued_by, created_at, updated_at,
    flow_key, flow_max, rate_key, rate_per_second, rate_burst
) VALUES (
    :id, :run_id, :name, :queue, :payload, :state, :priority, 0, :max_attempts, :run_at,
    :idempotency_key, :tenant_id, :traceparent, :enqueued_by, :now, :now,
    :flow_key, :flow_max, :rate_key, :rate_per_second, :rate_burst
)
ON CONFLICT DO NOTHING;

-- name: job_insert_many
-- job_insert for a batch of keyless jobs that share their first run time and rate: ONE statement
-- over a JSON array of rows (a row: id, run_id, name, queue, payload, priority, max_attempts,
-- tenant_id, traceparent, enqueued_by, flow_key, flow_max, rate_key, rate_burst), what they share
-- bound once. Binding 19 named parameters per row cost more than the row's insert (issue 13); the
-- array is parsed in C. Only texts, integers and NULLs go through JSON (each round-trips exactly);
-- the REAL columns are the bound ones. `WHERE true` lets SQLite parse the upsert clause after a SELECT.
INSERT INTO x_jobs (
    id, run_id, name, queue, payload, state, priority, attempt, max_attempts, run_at,
    idempotency_key, tenant_id, traceparent, enqueued_by, created_at, updated_at,
    flow_key, flow_max, rate_key, rate_per_second, rate_burst
) SELECT
    value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, :state, value ->> 5, 0, value ->> 6, :run_at,
    NULL, value ->> 7, value ->> 8, value ->> 9, :now, :now,
    value ->> 10, value ->> 11, value ->> 12, :rate_per_second, value ->> 13
FROM json_each(:rows) WHERE true
ON CONFLICT DO NOTHING;

-- name: job_live_by_key
SELECT id, run_id FROM x_jobs
WHERE name = :name AND idempotency_key = :idempotency_key
  AND (state = 'ready' OR state = 'delayed' OR state = 'running' OR state = 'suspended');

-- name: job_get
SELECT * FROM x_jobs WHERE id = :id;

-- name: claim
-- Two arms, each read in claim order from its own index and merged, so a claim touches about
-- :limit index entries however many jobs wait: waiting rows that are due, and running rows whose
-- worker let the visibility lapse; both skip paused queues (x_queues, a handful of rows). The
-- claim token is minted per row: worker, attempt, random.
UPDATE x_jobs
SET state = 'running',
    attempt = attempt + 1,
    claimed_by = :worker_id,
    visible_at = :visible_at,
    claim_token = :worker_id || ':' || (attempt + 1) || ':' || lower(hex(randomblob(6))),
    started_at = :now,
    updated_at = :now
WHERE id IN (
    SELECT id FROM (
        SELECT id, priority, run_at FROM x_jobs
        WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended') AND run_at <= :now
          AND (:names IS NULL OR name IN (SELECT value FROM json_each(:names)))
          AND queue NOT IN (SELECT queue FROM x_queues WHERE paused = 1)
          AND flow_key IS NULL AND rate_key IS NULL
        UNION ALL
        SELECT id, priority, run_at FROM x_jobs
        WHERE state = 'running' AND visible_at <= :now
          AND (:names IS NULL OR name IN (SELECT value FROM json_each(:names)))
          AND queue NOT IN (SELECT queue FROM x_queues WHERE paused = 1)
        ORDER BY priority DESC, run_at, id
        LIMIT :limit
    )
)
RETURNING *;

-- Flow control (see ultimat3.drivers.flow). The plain claims above leave every row under flow
-- control alone; a claim that may take them reads candidates here first, decides in Python under
-- the same write lock (so no other claimer can take a slot in between), then claims by id.
-- name: flow_candidates
-- Due rows under flow control in claim order, except under a key whose slots are all running or
-- whose bucket has no whole token now: those are claimable by nothing and stand in no one's way.
SELECT id, flow_key, flow_max, rate_key, rate_per_second, rate_burst FROM x_jobs
WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended') AND run_at <= :now
  AND (flow_key IS NOT NULL OR rate_key IS NOT NULL)
  AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
  AND (:names IS NULL OR name IN (SELECT value FROM json_each(:names)))
  AND queue NOT IN (SELECT queue FROM x_queues WHERE paused = 1)
  AND (flow_key IS NULL OR flow_key NOT IN (
        SELECT r.flow_key FROM x_jobs AS r WHERE r.state = 'running' AND r.flow_key IS NOT NULL
        GROUP BY r.flow_key HAVING count(*) >= min(r.flow_max)))
  AND (rate_key IS NULL OR rate_key NOT IN (
        SELECT key FROM x_rates WHERE min(burst, tokens + max(0, :now - at) * per_second) < 0.999999))
ORDER BY priority DESC, run_at, id
LIMIT :scan;

-- name: flow_running
SELECT flow_key, count(*) AS n FROM x_jobs
WHERE state = 'running' AND flow_key IN (SELECT value FROM json_each(:keys))
GROUP BY flow_key;

-- name: job_completions
-- Throughput for the dashboard's chart: finished rows come off x_jobs_finished_idx.
SELECT queue, CAST(finished_at / :bucket AS INTEGER) * :bucket AS at, count(*) AS done
FROM x_jobs
WHERE state = 'done' AND finished_at >= :since
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: attempts_of
-- The attempts of a job that ended other than by success (x_jobs_attempt_ended), oldest first.
SELECT * FROM x_attempts WHERE job_id = :id ORDER BY seq;

-- name: flow_buckets
SELECT key, tokens, at, per_second, burst FROM x_rates WHERE key IN (SELECT value FROM json_each(:keys));

-- name: flow_next_token
-- When the first empty bucket gets a whole token back: the claimer's wake-up hint.
SELECT min(at + (1.0 - tokens) / per_second) AS wake_at FROM x_rates
WHERE min(burst, tokens + max(0, :now - at) * per_second) < 0.999999;

-- name: claim_ids
-- The rows a flow or fair claim chose (still waiting: nothing else can write under our lock).
UPDATE x_jobs
SET state = 'running',
    attempt = attempt + 1,
    claimed_by = :worker_id,
    visible_at = :visible_at,
    claim_token = :worker_id || ':' || (attempt + 1) || ':' || lower(hex(randomblob(6))),
    started_at = :now,
    updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND (state = 'ready' OR state = 'delayed' OR state = 'suspended')
RETURNING *;

-- name: flow_forget_full
-- Buckets that have refilled to their burst carry nothing a missing one would not: pruned.
DELETE FROM x_rates WHERE tokens + max(0, :now - at) * per_second >= burst;

-- name: flow_holders
SELECT * FROM x_jobs WHERE state = 'running' AND flow_key = :key ORDER BY updated_at, id;

-- name: flow_bucket
SELECT key, tokens, at, per_second, burst FROM x_rates WHERE key = :key;

-- Fair claims (ClaimRequest.fair, see ultimat3.drivers.fair): the tenants with due jobs from :start in
-- byte order, one probe of x_jobs_fair_idx each (a recursive skip scan), then each one's first jobs.
-- name: _fair_due
-- The rows a fair claim may take: waiting, due, under no flow control, in the claim's queues and
-- names, in no paused queue (x_jobs_fair_idx's predicate, so its walks use it).
(state = 'ready' OR state = 'delayed' OR state = 'suspended') AND flow_key IS NULL AND rate_key IS NULL
  AND run_at <= :now
  AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
  AND (:names IS NULL OR name IN (SELECT value FROM json_each(:names)))
  AND queue NOT IN (SELECT queue FROM x_queues WHERE paused = 1)

-- name: fair_tenants
WITH RECURSIVE t(tenant) AS (
    SELECT (SELECT coalesce(tenant_id, '') FROM x_jobs
            WHERE {{_fair_due}}
              AND coalesce(tenant_id, '') >= :start
            ORDER BY coalesce(tenant_id, '') LIMIT 1)
    UNION ALL
    SELECT (SELECT coalesce(tenant_id, '') FROM x_jobs
            WHERE {{_fair_due}}
              AND coalesce(tenant_id, '') > t.tenant
            ORDER BY coalesce(tenant_id, '') LIMIT 1)
    FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT :limit;

-- name: fair_jobs
SELECT id, priority, run_at FROM x_jobs
WHERE {{_fair_due}}
  AND coalesce(tenant_id, '') = :tenant
ORDER BY priority DESC, run_at, id
LIMIT :n;

-- name: claim_lapsed
-- The lapsed half of `claim` alone (a fair claim takes those first, then serves the tenants).
UPDATE x_jobs
SET state = 'running',
    attempt = attempt + 1,
    claimed_by = :worker_id,
    visible_at = :visible_at,
    claim_token = :worker_id || ':' || (attempt + 1) || ':' || lower(hex(randomblob(6))),
    started_at = :now,
    updated_at = :now
WHERE id IN (
    SELECT id FROM x_jobs
    WHERE state = 'running' AND visible_at <= :now
      AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
      AND (:names IS NULL OR name IN (SELECT value FROM json_each(:names)))
      AND queue NOT IN (SELECT queue FROM x_queues WHERE paused = 1)
    ORDER BY priority DESC, run_at, id
    LIMIT :limit
)
RETURNING *;

-- name: flow_bucket_store
INSERT INTO x_rates (key, tokens, at, per_second, burst) VALUES (:key, :tokens, :at, :per_second, :burst)
ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens, at = excluded.at, per_second = excluded.per_second,
                                burst = excluded.burst;

-- name: claim_queues
-- As `claim`, restricted to the queues in the JSON array :queues. SQLite reads each queue's
-- slice of x_jobs_claim_idx in order and stops at :limit, so this stays cheap per queue.
UPDATE x_jobs
SET state = 'running',
    attempt = attempt + 1,
    claimed_by = :worker_id,
    visible_at = :visible_at,
    claim_token = :worker_id || ':' || (attempt + 1) || ':' || lower(hex(randomblob(6))),
    started_at = :now,
    updated_at = :now
WHERE id IN (
    SELECT id FROM (
        SELECT id, priority, run_at FROM x_jobs
        WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended')
          AND queue IN (SELECT value FROM json_each(:queues))
          AND run_at <= :now
          AND (:names IS NULL OR name IN (SELECT value FROM json_each(:names)))
          AND queue NOT IN (SELECT queue FROM x_queues WHERE paused = 1)
          AND flow_key IS NULL AND rate_key IS NULL
        UNION ALL
        SELECT id, priority, run_at FROM x_jobs
        WHERE state = 'running' AND visible_at <= :now
          AND queue IN (SELECT value FROM json_each(:queues))
          AND (:names IS NULL OR name IN (SELECT value FROM json_each(:names)))
          AND queue NOT IN (SELECT queue FROM x_queues WHERE paused = 1)
        ORDER BY priority DESC, run_at, id
        LIMIT :limit
    )
)
RETURNING *;

-- name: ack
-- A finished job carries no error from an earlier attempt: last_error describes a failure, not history.
UPDATE x_jobs
SET state = 'done', result = :result, finished_at = :now, updated_at = :now,
    claim_token = NULL, visible_at = NULL, last_error = NULL
WHERE id = :id AND state = 'running' AND claim_token = :claim_token;

-- name: ack_many
-- A batch of acks in one statement (:acks: a JSON array of [id, claim_token, result text]), each
-- fenced on its own token; RETURNING names the rows settled. One statement, not one per ack: a
-- statement that fires x_jobs_attempt_ended's program pays its set-up once, not per job (~15 us).
UPDATE x_jobs
SET state = 'done', result = acked.result, finished_at = :now, updated_at = :now,
    claim_token = NULL, visible_at = NULL, last_error = NULL
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claim_token,
             json_extract(value, '$[2]') AS result
      FROM json_each(:acks)) AS acked
WHERE x_jobs.id = acked.id AND x_jobs.state = 'running' AND x_jobs.claim_token = acked.claim_token
RETURNING x_jobs.id;

-- name: nack_dead
UPDATE x_jobs
SET state = 'dead', last_error = coalesce(:error, last_error), finished_at = :now, updated_at = :now,
    claim_token = NULL, visible_at = NULL
WHERE id = :id AND state = 'running' AND claim_token = :claim_token
RETURNING queue;

-- name: nack_suspend
-- A suspension gives back the attempt its claim took, never going below zero.
UPDATE x_jobs
SET state = 'suspended', run_at = :run_at, attempt = max(attempt - 1, 0),
    last_error = coalesce(:error, last_error), updated_at = :now, claim_token = NULL, visible_at = NULL
WHERE id = :id AND state = 'running' AND claim_token = :claim_token
RETURNING queue;

-- name: nack_release
-- A release (worker shutdown, a job this worker cannot run) hands the job back untouched: ready,
-- its attempt given back, no claim and no new error, so nothing about it reads as a failure.
UPDATE x_jobs
SET state = 'ready', run_at = :run_at, attempt = max(attempt - 1, 0), updated_at = :now,
    claim_token = NULL, claimed_by = NULL, visible_at = NULL
WHERE id = :id AND state = 'running' AND claim_token = :claim_token
RETURNING queue;

-- name: nack_retry
UPDATE x_jobs
SET state = 'ready', run_at = :run_at, last_error = coalesce(:error, last_error), updated_at = :now,
    claim_token = NULL, visible_at = NULL
WHERE id = :id AND state = 'running' AND claim_token = :claim_token
RETURNING queue;

-- name: heartbeat
UPDATE x_jobs
SET visible_at = :visible_at, updated_at = :now
WHERE id = :id AND state = 'running' AND claim_token = :claim_token;

-- name: cancel
-- Dropping the claim token is what makes the running attempt's next heartbeat fail.
UPDATE x_jobs
SET state = 'cancelled', last_error = coalesce(:reason, last_error), finished_at = :now, updated_at = :now,
    claim_token = NULL, visible_at = NULL
WHERE id = :id AND (state = 'ready' OR state = 'delayed' OR state = 'running' OR state = 'suspended')
RETURNING *;

-- name: cancel_ledger
-- A cancelled run's backfill pass (if it is one) is closed with it, in the same transaction: a
-- pass that is waiting, or whose worker is gone, would otherwise read `running` forever.
UPDATE x_backfills
SET status = 'cancelled', finished_at = :now, error = :reason, throttle = NULL
WHERE run_id = :run_id AND status IN ('running', 'paused');

-- name: retry
-- Same run_id: the retried run replays its recorded steps; last_error is kept for the operator. May violate the live-key index when
-- a new job took the key meanwhile; the driver turns that into JobDuplicateError.
UPDATE x_jobs
SET state = 'ready', attempt = 0, run_at = :now, finished_at = NULL, claim_token = NULL, visible_at = NULL,
    updated_at = :now
WHERE id = :id AND state IN ('dead', 'cancelled')
RETURNING *;

-- name: prune_delete_jobs
DELETE FROM x_jobs
WHERE (state = 'done' OR state = 'dead' OR state = 'cancelled') AND finished_at <= :cutoff
RETURNING run_id;

-- name: prune_delete_steps
-- The steps of the deleted jobs' runs (:run_ids is a JSON array): a run id is minted with its job
-- and no other job carries it, so its steps go with the job.
DELETE FROM x_job_steps
WHERE run_id IN (SELECT value FROM json_each(:run_ids));

-- name: _job_where
-- The operator's job filter (ultimat3.drivers.filters binds it); a NULL parameter means "any".
-- GLOB, not LIKE: SQLite's LIKE ignores ASCII case, a job name does not.
(:queue IS NULL OR queue = :queue)
  AND (:name IS NULL OR name = :name)
  AND (:name_glob IS NULL OR name GLOB :name_glob)
  AND (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:tenant_id IS NULL OR tenant_id = :tenant_id)
  AND (:error IS NULL OR instr(last_error, :error) > 0)
  AND (:since IS NULL OR updated_at >= :since)
  AND (:until IS NULL OR updated_at < :until)
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))

-- name: jobs_list
-- Newest first. Filters are optional (NULL = any); the scan follows x_jobs_created_idx.
SELECT * FROM x_jobs
WHERE {{_job_where}}
  AND (:before IS NULL OR (created_at, id) < (SELECT created_at, id FROM x_jobs WHERE id = :before))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: jobs_count
SELECT count(*) FROM x_jobs
WHERE {{_job_where}}
  AND (:as_of IS NULL OR updated_at <= :as_of);

-- name: jobs_error_groups
-- Grouped by the first line of last_error; the code is read from it in Python.
SELECT CASE WHEN instr(last_error, char(10)) > 0 THEN substr(last_error, 1, instr(last_error, char(10)) - 1)
            ELSE last_error END AS message,
       count(*) AS count, min(updated_at) AS first_seen, max(updated_at) AS last_seen, min(id) AS sample_id
FROM x_jobs
WHERE {{_job_where}} AND last_error IS NOT NULL
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT :limit;

-- name: bulk_candidates
-- One batch of a bulk action, lowest ids first from the cursor, under the write lock.
SELECT id, name, queue, run_id, idempotency_key, updated_at, state FROM x_jobs
WHERE {{_job_where}}
  AND id > :after
  AND (:as_of IS NULL OR updated_at <= :as_of)
ORDER BY id
LIMIT :limit;

-- name: bulk_retry
-- As `retry` for each id of the JSON array :ids (the driver left out the ones a live key holds).
UPDATE x_jobs
SET state = 'ready', attempt = 0, run_at = :now, finished_at = NULL, claim_token = NULL, visible_at = NULL,
    updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND state IN ('dead', 'cancelled')
RETURNING id, queue;

-- name: bulk_cancel
UPDATE x_jobs
SET state = 'cancelled', last_error = coalesce(:reason, last_error), finished_at = :now, updated_at = :now,
    claim_token = NULL, visible_at = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND (state = 'ready' OR state = 'delayed' OR state = 'running' OR state = 'suspended')
RETURNING id, queue, run_id, last_error;

-- name: bulk_delete
DELETE FROM x_jobs
WHERE id IN (SELECT value FROM json_each(:ids)) AND state <> 'running'
RETURNING id, queue, run_id;

-- name: bulk_ledger_close
-- A cancelled or deleted run's running backfill pass closes with it (:closed: [[run_id, error], ...]).
UPDATE x_backfills
SET status = 'cancelled', finished_at = :now,
    error = (SELECT json_extract(value, '$[1]') FROM json_each(:closed)
             WHERE json_extract(value, '$[0]') = x_backfills.run_id)
WHERE run_id IN (SELECT json_extract(value, '$[0]') FROM json_each(:closed)) AND status IN ('running', 'paused');

-- name: audit_touched
UPDATE x_audit SET touched = touched + :touched WHERE id = :id;

-- name: queue_get
SELECT paused FROM x_queues WHERE queue = :queue;

-- name: queue_set
INSERT INTO x_queues (queue, paused, changed_at, changed_by) VALUES (:queue, :paused, :now, :actor)
ON CONFLICT (queue) DO UPDATE
SET paused = excluded.paused, changed_at = excluded.changed_at, changed_by = excluded.changed_by;

-- name: queues_paused
SELECT queue FROM x_queues WHERE paused = 1 ORDER BY queue;

-- name: queue_overview
WITH counts AS (
    SELECT queue,
           sum(state = 'ready') AS ready, sum(state = 'delayed') AS delayed, sum(state = 'running') AS running,
           sum(state = 'suspended') AS suspended, sum(state = 'done') AS done, sum(state = 'dead') AS dead,
           sum(state = 'cancelled') AS cancelled,
           sum((state = 'ready' OR state = 'delayed' OR state = 'suspended') AND run_at <= :now) AS due,
           min(CASE WHEN (state = 'ready' OR state = 'delayed' OR state = 'suspended') AND run_at <= :now THEN run_at END) AS oldest_due,
           sum(state = 'done' AND finished_at >= :since) AS done_recent,
           sum(state = 'ready' AND attempt > 0 AND last_error IS NOT NULL AND updated_at >= :since) AS failed_recent,
           sum(state = 'dead' AND finished_at >= :since) AS dead_recent
    FROM x_jobs GROUP BY queue
), names AS (
    SELECT queue FROM counts UNION SELECT queue FROM x_queues
)
SELECT n.queue, coalesce(q.paused, 0) AS paused, q.changed_at, q.changed_by,
       coalesce(c.ready, 0) AS ready, coalesce(c.delayed, 0) AS delayed, coalesce(c.running, 0) AS running,
       coalesce(c.suspended, 0) AS suspended, coalesce(c.done, 0) AS done, coalesce(c.dead, 0) AS dead,
       coalesce(c.cancelled, 0) AS cancelled, coalesce(c.due, 0) AS due, c.oldest_due,
       coalesce(c.done_recent, 0) AS done_recent, coalesce(c.failed_recent, 0) AS failed_recent,
       coalesce(c.dead_recent, 0) AS dead_recent
FROM names AS n LEFT JOIN counts AS c ON c.queue = n.queue LEFT JOIN x_queues AS q ON q.queue = n.queue
ORDER BY n.queue;

-- name: audit_insert
INSERT INTO x_audit (id, at, actor, action, target, touched, status, finished_at)
VALUES (:id, :now, :actor, :action, :target, :touched, :status, :finished_at);

-- name: audit_get
SELECT * FROM x_audit WHERE id = :id;

-- name: audit_close
UPDATE x_audit SET status = :status, finished_at = :now, touched = coalesce(:touched, touched)
WHERE id = :id AND status = 'running';

-- name: audit_list
SELECT * FROM x_audit
WHERE (:action IS NULL OR action = :action)
ORDER BY at DESC, rowid DESC
LIMIT :limit;

-- name: jobs_stats
SELECT queue, state, count(*) AS n FROM x_jobs GROUP BY queue, state ORDER BY queue;

-- name: jobs_waiting_names
-- Which names wait in which queues (a worker warns about the ones it cannot run).
SELECT queue, name, count(*) AS n FROM x_jobs
WHERE (state = 'ready' OR state = 'delayed' OR state = 'suspended')
GROUP BY queue, name ORDER BY queue, name;

-- name: step_load
SELECT run_id, name, result, created_at FROM x_job_steps WHERE run_id = :run_id;

-- name: step_record
-- Fenced: the row comes from the job only while it is running under the token. First write wins.
-- (The WHERE clause also keeps SQLite from reading ON CONFLICT as a join constraint.)
INSERT INTO x_job_steps (run_id, name, result, created_at)
SELECT run_id, :name, :result, :now FROM x_jobs
WHERE id = :job_id AND state = 'running' AND claim_token = :claim_token
ON CONFLICT (run_id, name) DO NOTHING;

-- name: job_is_claimed
SELECT 1 FROM x_jobs WHERE id = :job_id AND state = 'running' AND claim_token = :claim_token;

-- name: backfill_start
-- A retried attempt of the same pass reopens its row: running again, error cleared; progress,
-- start time, the first job id and a standing pause request stay.
INSERT INTO x_backfills (run_id, name, checksum, status, batches, "rows", started_at, job_id, kind)
VALUES (:run_id, :name, :checksum, 'running', 0, 0, :now, :job_id, :kind)
ON CONFLICT (run_id) DO UPDATE
SET status = 'running', error = NULL, finished_at = NULL, job_id = coalesce(x_backfills.job_id, excluded.job_id)
RETURNING *;

-- name: backfill_progress
-- Also answers whether an operator asked the pass to pause.
UPDATE x_backfills SET batches = :batches, "rows" = :rows, throttle = :throttle WHERE run_id = :run_id
RETURNING status = 'running' AND paused_by IS NOT NULL AS pause;

-- name: backfill_finish
-- Only a running pass is closed: a pass cancelled under its worker's feet stays cancelled.
UPDATE x_backfills SET status = :status, error = :error, finished_at = :now, throttle = NULL, paused_by = NULL
WHERE run_id = :run_id AND status = 'running';

-- name: backfill_request_pause
UPDATE x_backfills SET paused_by = :actor
WHERE run_id = (SELECT run_id FROM x_backfills WHERE name = :name AND status = 'running'
                ORDER BY started_at DESC, run_id DESC LIMIT 1)
RETURNING *;

-- name: backfill_pause
UPDATE x_backfills SET status = 'paused', throttle = NULL
WHERE run_id = :run_id AND status = 'running' AND paused_by IS NOT NULL;

-- name: backfill_resume
-- The newest pass that is paused or asked to pause; its job is woken by backfill_wake.
UPDATE x_backfills SET status = 'running', paused_by = NULL
WHERE run_id = (SELECT run_id FROM x_backfills
                WHERE name = :name AND (status = 'paused' OR (status = 'running' AND paused_by IS NOT NULL))
                ORDER BY started_at DESC, run_id DESC LIMIT 1)
RETURNING *;

-- name: backfill_wake
-- A paused pass's job is suspended until resumed: runnable now.
UPDATE x_jobs SET run_at = :now, updated_at = :now WHERE id = :id AND state = 'suspended'
RETURNING queue;

-- name: backfill_count_fresh
-- How many of :keys (a JSON array) this pass has not quarantined yet (a replay counts nothing twice).
SELECT count(*) FROM json_each(:keys) AS k
WHERE NOT EXISTS (SELECT 1 FROM x_backfill_failures AS f
                  WHERE f.name = :name AND f.key = k.value AND f.run_id = :run_id);

-- name: backfill_quarantine
-- :failed is a JSON array of [key, reason].
INSERT INTO x_backfill_failures (name, key, reason, run_id, batch, failed_at)
SELECT :name, json_extract(value, '$[0]'), json_extract(value, '$[1]'), :run_id, :batch, :now
FROM json_each(:failed) WHERE true
ON CONFLICT (name, key) DO UPDATE
SET reason = excluded.reason, run_id = excluded.run_id, batch = excluded.batch, failed_at = excluded.failed_at;

-- name: backfill_count_failures
UPDATE x_backfills SET failures = failures + :fresh WHERE run_id = :run_id;

-- name: backfill_forget
DELETE FROM x_backfill_failures WHERE name = :name AND key IN (SELECT value FROM json_each(:keys));

-- name: backfill_failures
SELECT * FROM x_backfill_failures
WHERE name = :name AND (:after IS NULL OR key > :after)
ORDER BY key
LIMIT :limit;

-- name: backfill_outstanding
SELECT count(*) FROM x_backfill_failures WHERE name = :name;

-- name: backfill_get
SELECT * FROM x_backfills WHERE run_id = :run_id;

-- name: backfill_last_completed
SELECT * FROM x_backfills
WHERE name = :name AND status = 'completed' AND kind = 'pass' AND finished_at IS NOT NULL
ORDER BY finished_at DESC, run_id DESC
LIMIT 1;

-- name: backfill_list
SELECT * FROM x_backfills
WHERE (:name IS NULL OR name = :name)
ORDER BY started_at DESC, run_id DESC;

-- name: lease_slots
SELECT slot, expires_at FROM x_leases WHERE key = :key AND slot < :limit ORDER BY slot;

-- name: lease_take
INSERT INTO x_leases (key, slot, holder, token, expires_at)
VALUES (:key, :slot, :holder, :token, :expires_at)
ON CONFLICT (key, slot) DO UPDATE
SET holder = excluded.holder, token = excluded.token, expires_at = excluded.expires_at;

-- name: lease_renew
UPDATE x_leases SET expires_at = :expires_at
WHERE key = :key AND slot = :slot AND token = :token
RETURNING *;

-- name: lease_release
DELETE FROM x_leases WHERE key = :key AND slot = :slot AND token = :token;

-- name: lease_holders
SELECT * FROM x_leases WHERE key = :key AND expires_at > :now ORDER BY slot;

-- ----------------------------------------------------------------------------------------------
-- Worker registry (liveness is each worker's flock on its lock file, not a column)
-- ----------------------------------------------------------------------------------------------

-- name: worker_upsert
-- A re-registration (after a rescue took the worker for dead) keeps the first start time.
INSERT INTO x_workers (id, host, pid, concurrency, queues, started_at, last_seen_at, clock_offset)
VALUES (:id, :host, :pid, :concurrency, :queues, :now, :now, NULL)
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, concurrency = excluded.concurrency,
    queues = excluded.queues, last_seen_at = excluded.last_seen_at;

-- name: worker_beat
UPDATE x_workers SET last_seen_at = :now, clock_offset = :clock_offset, wakeups = :wakeups WHERE id = :id;

-- name: worker_delete
DELETE FROM x_workers WHERE id = :id;

-- name: worker_list
SELECT * FROM x_workers ORDER BY id;

-- name: worker_running
SELECT claimed_by, id FROM x_jobs WHERE state = 'running' AND claimed_by IS NOT NULL ORDER BY id;

-- name: worker_release_jobs
-- A dead worker's running jobs, back to ready: the attempt counts (as a lapse does), the claim is
-- cleared, so nothing the worker may still send can settle them.
UPDATE x_jobs
SET state = 'ready', claim_token = NULL, visible_at = NULL, claimed_by = NULL,
    last_error = :error, updated_at = :now
WHERE state = 'running' AND claimed_by = :worker
RETURNING id, queue;

-- name: schedule_register
INSERT INTO x_schedules (key, last_tick, updated_at) VALUES (:key, :start, :now)
ON CONFLICT (key) DO NOTHING;

-- name: schedule_get
SELECT * FROM x_schedules WHERE key = :key;

-- name: schedule_advance
-- Under the write lock: only the first process to bring a tick gets a row back.
UPDATE x_schedules SET last_tick = :tick, updated_at = :now, last_job_id = NULL
WHERE key = :key AND last_tick < :tick
RETURNING paused;

-- name: schedule_job
UPDATE x_schedules SET last_job_id = :job_id WHERE key = :key;

-- name: schedule_insert_paused
INSERT INTO x_schedules (key, last_tick, paused, changed_at, changed_by, updated_at)
VALUES (:key, :now, :paused, :now, :actor, :now);

-- name: schedule_update_paused
UPDATE x_schedules SET paused = :paused, changed_at = :now, changed_by = :actor WHERE key = :key;

-- name: schedules_list
SELECT * FROM x_schedules ORDER BY key;
