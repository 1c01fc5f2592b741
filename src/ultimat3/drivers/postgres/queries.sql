-- Every statement the PostgreSQL driver sends, by name. `ultimat3.drivers.sql` parses this file once
-- into a dict: a block starts at a `-- name: NAME` line and runs to the next one. Whole-line comments
-- are dropped on load (psycopg would read a percent sign in them as a placeholder). Every value is
-- a %(named)s parameter; every time is the driver's clock, passed in, never now() (that clock
-- follows this server's by default: see `server_time`).
--
-- Shared vocabulary: "waiting" states are ready, delayed and suspended (claimable once run_at has
-- come); "live" states add running (they hold the idempotency key); "final" states are done, dead
-- and cancelled.

-- ----------------------------------------------------------------------------------------------
-- Migrations
-- ----------------------------------------------------------------------------------------------

-- name: migrate_lock
-- Held to the end of the migration's transaction: workers booting together apply it once. Keyed
-- by schema, so two schemas of one database migrate independently.
SELECT pg_advisory_xact_lock(hashtextextended('ultimat3:migrate:' || current_schema(), 0))

-- name: migrations_table_exists
SELECT to_regclass('x_migrations') IS NOT NULL

-- name: migration_ids
SELECT id FROM x_migrations

-- name: migration_mark
INSERT INTO x_migrations (id, applied_at) VALUES (%(id)s, %(now)s)
ON CONFLICT (id) DO NOTHING

-- name: migrations_applied
SELECT id, applied_at FROM x_migrations ORDER BY seq

-- name: migration_is_applied
SELECT EXISTS (SELECT 1 FROM x_migrations WHERE id = %(id)s)

-- name: session_utc
-- Each pooled session reports times in UTC: psycopg then decodes a timestamptz straight to an
-- aware UTC datetime, with no conversion to the server's zone and back (~1 us per value).
SET TIME ZONE 'UTC'

-- name: server_time
-- The one clock of the fleet, sampled by every driver (ReferenceClock) at start and once a minute.
SELECT extract(epoch FROM clock_timestamp())::float8

-- ----------------------------------------------------------------------------------------------
-- Enqueue
-- ----------------------------------------------------------------------------------------------

-- name: _ready_notice
-- The NOTIFY payload for jobs made ready at (priority, run_at) in a queue: RS J RS priority RS
-- run_at (epoch ms, floored) RS queue. A claimer whose cursor is past that key moves it back.
chr(30) || 'J' || chr(30) || priority || chr(30) || floor(extract(epoch FROM run_at) * 1000)::bigint || chr(30) || queue

-- name: enqueue
-- One job in one statement: insert unless a live job holds (name, key), else return that job.
-- The NOTIFY rides in the same statement, so it is delivered exactly when the row commits. When
-- nothing comes back, the conflicting row finished (or was committed after this statement's
-- snapshot) between the two halves: the caller simply runs it again.
WITH ins AS (
    INSERT INTO x_jobs (id, run_id, name, queue, payload, state, priority, attempt, max_attempts, run_at,
                        idempotency_key, tenant_id, traceparent, enqueued_by, created_at, updated_at,
                        flow_key, flow_max, rate_key, rate_per_second, rate_burst)
    VALUES (%(id)s, %(run_id)s, %(name)s, %(queue)s, %(payload)s, %(state)s, %(priority)s, 0,
            %(max_attempts)s, %(run_at)s, %(idempotency_key)s, %(tenant_id)s, %(traceparent)s, %(enqueued_by)s,
            %(now)s, %(now)s, %(flow_key)s, %(flow_max)s, %(rate_key)s, %(rate_per_second)s, %(rate_burst)s)
    ON CONFLICT (name, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'running', 'suspended')
        DO NOTHING
    RETURNING id, run_id, queue, priority, run_at
)
SELECT id, run_id, false AS deduped, pg_notify(%(channel)s, {{_ready_notice}})::text AS notified FROM ins
UNION ALL
SELECT id, run_id, true, NULL FROM x_jobs
WHERE NOT EXISTS (SELECT 1 FROM ins)
  AND %(idempotency_key)s::text IS NOT NULL
  AND name = %(name)s AND idempotency_key = %(idempotency_key)s
  AND state IN ('ready', 'delayed', 'running', 'suspended')

-- name: enqueue_many
-- A batch in one statement, one row per inserted job out, plus one NOTIFY per queue and priority
-- (at its earliest run_at). What the client would otherwise dump item by item travels as one
-- value: the ids as comma-joined text, the payloads as one JSON array (each already JSON text).
-- Every other column is a scalar when the whole batch shares its value (the usual case: one job,
-- one queue, one enqueue's options), or an array (its scalar then NULL) when the items differ.
-- Rows go in request order, so of two requests sharing a (name, key) the first is the one kept.
-- Requests the conflict clause skipped are resolved by `live_by_keys` in the same transaction.
WITH ins AS (
    INSERT INTO x_jobs (id, run_id, payload, name, queue, state, priority, max_attempts, run_at,
                        idempotency_key, tenant_id, traceparent, enqueued_by, flow_key, flow_max,
                        rate_key, rate_per_second, rate_burst, attempt, created_at, updated_at)
    SELECT t.id, t.run_id, t.payload,
           CASE WHEN %(name_each)s::text[] IS NULL THEN %(name)s::text ELSE t.name END,
           CASE WHEN %(queue_each)s::text[] IS NULL THEN %(queue)s::text ELSE t.queue END,
           CASE WHEN %(state_each)s::text[] IS NULL THEN %(state)s::text ELSE t.state END,
           CASE WHEN %(priority_each)s::int[] IS NULL THEN %(priority)s::int ELSE t.priority END,
           CASE WHEN %(max_attempts_each)s::int[] IS NULL THEN %(max_attempts)s::int ELSE t.max_attempts END,
           CASE WHEN %(run_at_each)s::timestamptz[] IS NULL THEN %(run_at)s::timestamptz ELSE t.run_at END,
           CASE WHEN %(idempotency_key_each)s::text[] IS NULL THEN %(idempotency_key)s::text ELSE t.idempotency_key END,
           CASE WHEN %(tenant_id_each)s::text[] IS NULL THEN %(tenant_id)s::text ELSE t.tenant_id END,
           CASE WHEN %(traceparent_each)s::text[] IS NULL THEN %(traceparent)s::text ELSE t.traceparent END,
           CASE WHEN %(enqueued_by_each)s::text[] IS NULL THEN %(enqueued_by)s::text ELSE t.enqueued_by END,
           CASE WHEN %(flow_key_each)s::text[] IS NULL THEN %(flow_key)s::text ELSE t.flow_key END,
           CASE WHEN %(flow_max_each)s::int[] IS NULL THEN %(flow_max)s::int ELSE t.flow_max END,
           CASE WHEN %(rate_key_each)s::text[] IS NULL THEN %(rate_key)s::text ELSE t.rate_key END,
           CASE WHEN %(rate_per_second_each)s::float8[] IS NULL THEN %(rate_per_second)s::float8 ELSE t.rate_per_second END,
           CASE WHEN %(rate_burst_each)s::int[] IS NULL THEN %(rate_burst)s::int ELSE t.rate_burst END,
           0, %(now)s, %(now)s
    FROM ROWS FROM (
        unnest(string_to_array(%(ids)s::text, ',')),
        unnest(string_to_array(%(run_ids)s::text, ',')),
        jsonb_array_elements(%(payloads)s::jsonb),
        unnest(%(name_each)s::text[]),
        unnest(%(queue_each)s::text[]),
        unnest(%(state_each)s::text[]),
        unnest(%(priority_each)s::int[]),
        unnest(%(max_attempts_each)s::int[]),
        unnest(%(run_at_each)s::timestamptz[]),
        unnest(%(idempotency_key_each)s::text[]),
        unnest(%(tenant_id_each)s::text[]),
        unnest(%(traceparent_each)s::text[]),
        unnest(%(enqueued_by_each)s::text[]),
        unnest(%(flow_key_each)s::text[]),
        unnest(%(flow_max_each)s::int[]),
        unnest(%(rate_key_each)s::text[]),
        unnest(%(rate_per_second_each)s::float8[]),
        unnest(%(rate_burst_each)s::int[])
    ) WITH ORDINALITY AS t(id, run_id, payload, name, queue, state, priority, max_attempts, run_at,
                           idempotency_key, tenant_id, traceparent, enqueued_by, flow_key, flow_max,
                           rate_key, rate_per_second, rate_burst, ord)
    ORDER BY t.ord
    ON CONFLICT (name, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'running', 'suspended')
        DO NOTHING
    RETURNING id, queue, priority, run_at
)
SELECT id, NULL::text AS notified FROM ins
UNION ALL
SELECT NULL, pg_notify(%(channel)s, {{_ready_notice}})::text
FROM (SELECT queue, priority, min(run_at) AS run_at FROM ins GROUP BY queue, priority) AS q

-- name: live_by_keys
-- The live holders of some (name, key) pairs; sees rows this transaction just inserted.
SELECT j.name, j.idempotency_key, j.id, j.run_id
FROM x_jobs AS j
JOIN unnest(%(names)s::text[], %(keys)s::text[]) AS k(name, idempotency_key)
  ON j.name = k.name AND j.idempotency_key = k.idempotency_key
WHERE j.state IN ('ready', 'delayed', 'running', 'suspended')

-- name: jobs_by_ids
-- After a lost connection: which of these ids did the failed attempt already commit?
SELECT id, run_id FROM x_jobs WHERE id = ANY(%(ids)s::text[])

-- name: notify
SELECT pg_notify(%(channel)s, q)::text FROM unnest(%(queues)s::text[]) AS q

-- ----------------------------------------------------------------------------------------------
-- Claim. A claim must not walk the index entries earlier jobs left behind: while a transaction
-- holds the database's oldest snapshot (a pinned MVCC horizon), VACUUM may remove none of them,
-- and a walk from the head of the claim index steps over one entry per job claimed since.
-- So each claimer (PostgresDriver) keeps a cursor per queue: the claim-order key of the first row
-- its last claim could see, and
--   claim_queue_from / claim_any_from  walk from that cursor at its priority, and from the head of
--                                      every other priority (empty in a one-priority queue);
--   claim_queue / claim_any / claim_queues  walk from the head: a claimer's first claim and its
--                                      periodic catch-up (PostgresDriver.CATCH_UP);
--   claim_lapsed                       takes running rows whose visibility ran out, walking only
--                                      visible_at in (floor, now]: run about once a second, floored
--                                      at the previous run (unfloored once a minute).
-- claim_any* and claim_queues add `attempt >= 0` (always true) to match x_jobs_claim_any_idx's
-- predicate, which a one-queue claim does not state: so the planner can never walk that index
-- filtering by one queue when x_jobs_claim_idx walks that queue alone.
-- A job made ready behind a cursor (a late commit, an explicit past run_at, a rescued job) is
-- announced by its NOTIFY payload (see _ready_notice), which moves the cursor back to it.
-- Every branch locks with FOR UPDATE SKIP LOCKED, so concurrent claimers split the work, and skips
-- paused queues with NOT IN over x_queues (a hashed subplan, read once per statement). Not
-- `queue <> ALL(ARRAY(...))`: when every job sits in one queue, the planner reads that as likely to
-- exclude the queue's whole value and trades the index walk for a seq scan and a sort (x10 per
-- claim, measured); NOT IN keeps the index-ordered plan in every case.
-- The picked rows move to running with attempt + 1 and a new claim token (worker : attempt :
-- random) -- new even when the same worker re-claims. `head_*` is the first claimable row the
-- statement could see, locked or not: the claimer's next cursor (a row skipped because another
-- transaction held it is not passed by). The caller puts the rows in claim order.
-- ----------------------------------------------------------------------------------------------

-- name: claim_plan
-- Sent before a plain claim (in its transaction) on a connection that prepares statements: the
-- claim runs the generic plan the server cached for it instead of being planned again each time.
-- set_config(..., true) rather than SET LOCAL: it lasts to the end of the transaction, and a
-- pipeline with no BEGIN is one (implicit) transaction up to its Sync, where SET LOCAL would warn.
-- In auto mode PostgreSQL compares that plan's estimated cost with the plans made for the values:
-- the generic one cannot know that `LIMIT $n` is small or that the cursor range holds few rows,
-- so on a table with many rows in other queues or states it looks dearer, and every claim was
-- planned afresh (about 1 ms of a 2.5 ms claim; claim_growth.py's grown table: p50 1.3 -> 2.4 ms,
-- back to 1.3 ms with this). The plan is made from the table's statistics and remade when they
-- change (ANALYZE), and it walks the claim index from the cursor like the planned-each-time one.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true)

-- name: _claimable
state IN ('ready', 'delayed', 'suspended') AND run_at <= %(now)s
      AND queue NOT IN (SELECT queue FROM x_queues WHERE paused)
      AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
      AND flow_key IS NULL AND rate_key IS NULL

-- name: _in_queues
-- In the queues a claim names (all of them when it names none).
(%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))

-- name: _claimed
-- What every claim returns, in the order rows.claimed_rows reads it by position: a JobRecord's
-- fields, then the claim token (then the statement's head columns). The payload goes as text:
-- json.loads over it costs ~2 us a row less than psycopg's jsonb loader (bench/budget.py).
j.id, j.run_id, j.name, j.queue, j.payload::text AS payload, j.state, j.priority, j.attempt,
j.max_attempts, j.run_at, j.created_at, j.updated_at, j.idempotency_key, j.tenant_id, j.traceparent,
j.enqueued_by, j.claimed_by, j.visible_at, j.finished_at, j.last_error, j.result, j.flow_key,
j.flow_max, j.rate_key, j.rate_per_second, j.rate_burst, j.started_at, j.claim_token

-- name: _claim
-- Joined to `picked`, not `j.id = ANY(ARRAY(SELECT id FROM picked))`: that form's generic plan,
-- cached while the table was small, kept scanning the whole table as it grew (claim p50 1.2 ->
-- 5.9 ms on claim_growth.py's growing table until an ANALYZE). Planned afresh for each call (as
-- behind a transaction-mode pooler), the join may hash `picked` against a scan of a table of some
-- 10k rows (2 of a 100-job claim's 6 ms, EXPLAIN ANALYZE), a cost the cached plan does not pay.
UPDATE x_jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    claimed_by = %(worker)s,
    claim_token = %(worker)s || ':' || (j.attempt + 1) || ':' || left(replace(gen_random_uuid()::text, '-', ''), 12),
    visible_at = %(visible_at)s,
    started_at = %(now)s,
    updated_at = %(now)s
FROM picked
WHERE j.id = picked.id
RETURNING {{_claimed}},
          (SELECT priority FROM head) AS head_priority, (SELECT run_at FROM head) AS head_run_at,
          (SELECT id FROM head) AS head_id

-- name: claim_queue
WITH picked AS (
    SELECT id FROM x_jobs
    WHERE {{_claimable}} AND queue = %(queue)s
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), head AS (
    SELECT priority, run_at, id FROM x_jobs
    WHERE {{_claimable}} AND queue = %(queue)s
    ORDER BY priority DESC, run_at, id
    LIMIT 1
)
{{_claim}}

-- name: claim_queue_from
-- The ranges in claim order: higher priorities; the cursor's priority from the cursor on; lower
-- priorities. An
-- Append under a LIMIT runs them in turn and stops when it has enough (each in a sub-select: a
-- locking clause may not sit on a UNION member itself).
WITH picked AS (
    SELECT id FROM (
        (SELECT id FROM (SELECT id FROM x_jobs
         WHERE {{_claimable}} AND queue = %(queue)s AND priority > %(c_priority)s
         ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS r1)
        UNION ALL
        (SELECT id FROM (SELECT id FROM x_jobs
         WHERE {{_claimable}} AND queue = %(queue)s AND priority = %(c_priority)s
           AND (run_at, id) >= (%(c_run_at)s, %(c_id)s)
         ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS r3)
        UNION ALL
        (SELECT id FROM (SELECT id FROM x_jobs
         WHERE {{_claimable}} AND queue = %(queue)s AND priority < %(c_priority)s
         ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS r4)
    ) AS ranges
    LIMIT %(limit)s
), head AS (
    SELECT priority, run_at, id FROM (
        (SELECT priority, run_at, id FROM x_jobs
         WHERE {{_claimable}} AND queue = %(queue)s AND priority > %(c_priority)s
         ORDER BY priority DESC, run_at, id LIMIT 1)
        UNION ALL
        (SELECT priority, run_at, id FROM x_jobs
         WHERE {{_claimable}} AND queue = %(queue)s AND priority = %(c_priority)s
           AND (run_at, id) >= (%(c_run_at)s, %(c_id)s)
         ORDER BY priority DESC, run_at, id LIMIT 1)
        UNION ALL
        (SELECT priority, run_at, id FROM x_jobs
         WHERE {{_claimable}} AND queue = %(queue)s AND priority < %(c_priority)s
         ORDER BY priority DESC, run_at, id LIMIT 1)
    ) AS ranges
    LIMIT 1
)
{{_claim}}

-- name: claim_any
WITH picked AS (
    SELECT id FROM x_jobs
    WHERE {{_claimable}} AND attempt >= 0
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), head AS (
    SELECT priority, run_at, id FROM x_jobs
    WHERE {{_claimable}} AND attempt >= 0
    ORDER BY priority DESC, run_at, id
    LIMIT 1
)
{{_claim}}

-- name: claim_any_from
WITH picked AS (
    SELECT id FROM (
        (SELECT id FROM (SELECT id FROM x_jobs
         WHERE {{_claimable}} AND attempt >= 0 AND priority > %(c_priority)s
         ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS r5)
        UNION ALL
        (SELECT id FROM (SELECT id FROM x_jobs
         WHERE {{_claimable}} AND attempt >= 0 AND priority = %(c_priority)s AND (run_at, id) >= (%(c_run_at)s, %(c_id)s)
         ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS r7)
        UNION ALL
        (SELECT id FROM (SELECT id FROM x_jobs
         WHERE {{_claimable}} AND attempt >= 0 AND priority < %(c_priority)s
         ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS r8)
    ) AS ranges
    LIMIT %(limit)s
), head AS (
    SELECT priority, run_at, id FROM (
        (SELECT priority, run_at, id FROM x_jobs
         WHERE {{_claimable}} AND attempt >= 0 AND priority > %(c_priority)s
         ORDER BY priority DESC, run_at, id LIMIT 1)
        UNION ALL
        (SELECT priority, run_at, id FROM x_jobs
         WHERE {{_claimable}} AND attempt >= 0 AND priority = %(c_priority)s AND (run_at, id) >= (%(c_run_at)s, %(c_id)s)
         ORDER BY priority DESC, run_at, id LIMIT 1)
        UNION ALL
        (SELECT priority, run_at, id FROM x_jobs
         WHERE {{_claimable}} AND attempt >= 0 AND priority < %(c_priority)s
         ORDER BY priority DESC, run_at, id LIMIT 1)
    ) AS ranges
    LIMIT 1
)
{{_claim}}

-- name: claim_passed
-- Rows a cursor passed while another transaction held them, by primary key (run only when there
-- are some, planned afresh each time: a plan cached while the table was small would scan it).
WITH picked AS (
    SELECT id FROM (
        SELECT id, queue, name, run_at, state, flow_key, rate_key FROM x_jobs
        WHERE id = ANY(%(passed)s::text[])
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS held
    WHERE state IN ('ready', 'delayed', 'suspended') AND run_at <= %(now)s
      AND queue NOT IN (SELECT queue FROM x_queues WHERE paused)
      AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
      AND flow_key IS NULL AND rate_key IS NULL
), head AS (
    SELECT NULL::int AS priority, NULL::timestamptz AS run_at, NULL::text AS id
)
{{_claim}}

-- name: claim_queues
-- Several named queues: `queue = ANY` cannot walk x_jobs_claim_idx in claim order, so this one
-- walks x_jobs_claim_any_idx (`attempt >= 0` lets it) filtered by queue, and keeps no cursor.
WITH picked AS (
    SELECT id FROM x_jobs
    WHERE {{_claimable}} AND attempt >= 0 AND queue = ANY(%(queues)s::text[])
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), head AS (
    SELECT NULL::int AS priority, NULL::timestamptz AS run_at, NULL::text AS id
)
{{_claim}}

-- name: claim_fair
-- Round-robin by tenant (ClaimRequest.fair): up to :limit tenants with due jobs, in tenant order from
-- the claimer's cursor (:start, the last tenant it served + chr(1): byte order; found by a skip scan of x_jobs_fair_idx: one probe per tenant, however
-- many jobs each holds), each giving its weight's part of :limit in claim order; the claim takes
-- every tenant's first turn, then every tenant's second, and so on (a turn: as many jobs as the
-- tenant's weight, 1 unless :weights says otherwise). No tenant -- tenant='none' -- is the tenant ''.
WITH RECURSIVE tenants AS (
    (SELECT coalesce(tenant_id, '') AS tenant FROM x_jobs
     WHERE {{_claimable}} AND {{_in_queues}}
       AND coalesce(tenant_id, '') >= %(start)s
     ORDER BY coalesce(tenant_id, '') LIMIT 1)
    UNION ALL
    SELECT (SELECT coalesce(tenant_id, '') FROM x_jobs
            WHERE {{_claimable}} AND {{_in_queues}}
              AND coalesce(tenant_id, '') > t.tenant
            ORDER BY coalesce(tenant_id, '') LIMIT 1)
    FROM tenants AS t WHERE t.tenant IS NOT NULL
), found AS (
    SELECT tenant FROM tenants WHERE tenant IS NOT NULL LIMIT %(limit)s
), weighed AS (
    SELECT f.tenant, coalesce(w.weight, 1) AS weight FROM found AS f
    LEFT JOIN unnest(%(weight_tenants)s::text[], %(weights)s::int[]) AS w(tenant, weight) ON w.tenant = f.tenant
), chosen AS (
    -- each tenant's part of the claim: its weight's share of :limit, at least one turn
    SELECT tenant, weight, greatest(weight, ceil(%(limit)s::numeric * weight / sum(weight) OVER ()))::int AS n
    FROM weighed
), ranked AS (
    SELECT p.id, p.priority, p.run_at,
           (row_number() OVER (PARTITION BY c.tenant ORDER BY p.priority DESC, p.run_at, p.id) - 1) / c.weight AS turn
    FROM chosen AS c
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM x_jobs
        WHERE {{_claimable}} AND {{_in_queues}}
          AND coalesce(tenant_id, '') = c.tenant
        ORDER BY priority DESC, run_at, id
        LIMIT c.n
        FOR UPDATE SKIP LOCKED
    ) AS p
), picked AS (
    SELECT id FROM ranked ORDER BY turn, priority DESC, run_at, id LIMIT %(limit)s
), head AS (
    SELECT NULL::int AS priority, NULL::timestamptz AS run_at, NULL::text AS id
)
{{_claim}}

-- name: claim_lapsed
WITH picked AS (
    SELECT id FROM x_jobs
    WHERE state = 'running' AND visible_at <= %(now)s AND visible_at > %(floor)s
      AND queue NOT IN (SELECT queue FROM x_queues WHERE paused)
      AND {{_in_queues}}
      AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
    ORDER BY visible_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), head AS (
    SELECT NULL::int AS priority, NULL::timestamptz AS run_at, NULL::text AS id
)
{{_claim}}

-- ----------------------------------------------------------------------------------------------
-- Flow control (see ultimat3.drivers.flow). The claims above leave every row under flow control
-- alone (`flow_key IS NULL AND rate_key IS NULL` in _claimable); a claim that may take them runs
-- these in its transaction first: candidates (locked, SKIP LOCKED), the keys' advisory locks and
-- bucket rows (in key order, so two claimers cannot deadlock), a fresh count of running rows per
-- key (a new statement: its snapshot sees every claim that held a key's lock before), then the
-- claim of the admitted ids and the buckets stored back.
-- ----------------------------------------------------------------------------------------------

-- name: flow_candidates
-- Due rows under flow control in claim order, except under a key whose slots are all running or
-- whose bucket has no whole token now: those are claimable by nothing and stand in no one's way.
SELECT id, flow_key, flow_max, rate_key, rate_per_second, rate_burst FROM x_jobs
WHERE state IN ('ready', 'delayed', 'suspended') AND run_at <= %(now)s
  AND (flow_key IS NOT NULL OR rate_key IS NOT NULL)
  AND {{_in_queues}}
  AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
  AND queue NOT IN (SELECT queue FROM x_queues WHERE paused)
  AND (flow_key IS NULL OR flow_key NOT IN (
        SELECT r.flow_key FROM x_jobs AS r WHERE r.state = 'running' AND r.flow_key IS NOT NULL
        GROUP BY r.flow_key HAVING count(*) >= min(r.flow_max)))
  AND (rate_key IS NULL OR rate_key NOT IN (
        SELECT key FROM x_rates
        WHERE least(burst, tokens + greatest(0, extract(epoch FROM %(now)s - at)) * per_second) < 0.999999))
ORDER BY priority DESC, run_at, id
LIMIT %(scan)s
FOR UPDATE SKIP LOCKED

-- name: flow_lock
SELECT count(pg_advisory_xact_lock(hashtextextended('ultimat3:flow:' || k.key, 0)))
FROM (SELECT key FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS u(key, ord) ORDER BY ord) AS k

-- name: flow_running
SELECT flow_key, count(*) AS n FROM x_jobs
WHERE state = 'running' AND flow_key = ANY(%(keys)s::text[])
GROUP BY flow_key

-- name: flow_bucket_init
-- A key's first bucket, full: made before the buckets are locked, so two claimers meeting a new key
-- both find (and lock) the one row instead of each filling a bucket of its own.
INSERT INTO x_rates (key, tokens, at, per_second, burst)
SELECT k.key, k.burst, %(now)s, k.per_second, k.burst
FROM unnest(%(keys)s::text[], %(per_seconds)s::float8[], %(bursts)s::int[]) WITH ORDINALITY AS k(key, per_second, burst, ord)
ORDER BY k.ord
ON CONFLICT (key) DO NOTHING

-- name: flow_buckets
SELECT key, tokens, extract(epoch FROM at)::float8 AS at, per_second, burst FROM x_rates
WHERE key = ANY(%(keys)s::text[])
ORDER BY key
FOR UPDATE

-- name: flow_next_token
-- When the first empty bucket gets a whole token back: the claimer's wake-up hint.
SELECT min(extract(epoch FROM at)::float8 + (1.0 - tokens) / per_second) AS wake_at FROM x_rates
WHERE least(burst, tokens + greatest(0, extract(epoch FROM %(now)s - at)) * per_second) < 0.999999

-- name: flow_claim
UPDATE x_jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    claimed_by = %(worker)s,
    claim_token = %(worker)s || ':' || (j.attempt + 1) || ':' || left(replace(gen_random_uuid()::text, '-', ''), 12),
    visible_at = %(visible_at)s,
    started_at = %(now)s,
    updated_at = %(now)s
WHERE j.id = ANY(%(ids)s::text[]) AND j.state IN ('ready', 'delayed', 'suspended')
RETURNING {{_claimed}}, NULL::int AS head_priority, NULL::timestamptz AS head_run_at, NULL::text AS head_id

-- name: flow_forget_full
-- Buckets that have refilled to their burst carry nothing a missing one would not (a claim makes
-- a missing bucket full): pruned. A bucket a claim holds locked is re-read once it commits, and
-- stays when that claim spent a token.
DELETE FROM x_rates
WHERE tokens + greatest(0, extract(epoch FROM %(now)s - at)) * per_second >= burst

-- name: flow_holders
SELECT * FROM x_jobs WHERE state = 'running' AND flow_key = %(key)s ORDER BY updated_at, id

-- name: job_completions
-- Throughput for the dashboard's chart: finished rows come off x_jobs_finished_idx.
SELECT queue, floor(extract(epoch FROM finished_at) / %(bucket)s) * %(bucket)s AS at, count(*) AS done
FROM x_jobs
WHERE state = 'done' AND finished_at >= %(since)s
GROUP BY 1, 2
ORDER BY 1, 2

-- name: attempts_of
-- The attempts of a job that ended other than by success (x_jobs_attempt_ended), oldest first.
SELECT * FROM x_attempts WHERE job_id = %(id)s ORDER BY seq

-- name: flow_bucket
SELECT key, tokens, extract(epoch FROM at)::float8 AS at, per_second, burst FROM x_rates WHERE key = %(key)s

-- name: flow_bucket_store
INSERT INTO x_rates (key, tokens, at, per_second, burst)
SELECT * FROM unnest(%(keys)s::text[], %(tokens)s::float8[], %(ats)s::timestamptz[], %(per_seconds)s::float8[],
                     %(bursts)s::int[])
ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens, at = excluded.at, per_second = excluded.per_second,
                                burst = excluded.burst

-- ----------------------------------------------------------------------------------------------
-- Settlement: every write a worker makes is FENCED on (running, its claim token) in the WHERE
-- clause itself, so a stale worker's write matches no row and changes nothing.
-- The state is tested as `state || '' = 'running'`: the same test, which the planner cannot match
-- to the partial index x_jobs_running_visible_idx, so the row is found by its primary key. With
-- `state = 'running'` it may walk that index instead (its statistics say few rows run), and under
-- a pinned horizon the index holds an entry for every job claimed since the pin.
-- ----------------------------------------------------------------------------------------------

-- name: _slot_notice
-- A settled row that held a concurrency slot announces its queue (NOTIFY is sent at commit, and
-- PostgreSQL folds repeats within a transaction into one): a worker of another process waiting on
-- that key claims at once instead of at its next poll.
CASE WHEN flow_key IS NOT NULL THEN pg_notify(%(channel)s, queue)::text END

-- name: ack
WITH done AS (
    UPDATE x_jobs
    SET state = 'done', result = %(result)s, finished_at = %(now)s, updated_at = %(now)s,
        claim_token = NULL, visible_at = NULL, last_error = NULL
    WHERE id = %(id)s AND state || '' = 'running' AND claim_token = %(token)s
    RETURNING id, queue, flow_key
)
SELECT id, {{_slot_notice}} AS woke FROM done

-- name: ack_many
-- Many acks, one statement and one commit; each row is fenced on its own token exactly as `ack` is.
-- The acks come as ONE jsonb object from "id claim_token" to the result: a row is settled only if
-- its own id and current token form a key of it, and its result is looked up there (a binary
-- search in the object's sorted keys). No join: joined to an unnest() of the acks, the planner
-- (which expects few running rows) re-read the whole list for every row, 100 x 100 at a batch of
-- 100. `j.id = ANY(ids)` restricts x_jobs itself, so even with statistics from when the table was
-- small the rows are fetched by primary key, never by a scan of the table. The ids come as a JSON
-- array (one text parameter: the client dumps a text[] element by element in Python).
WITH done AS (
    UPDATE x_jobs AS j
    SET state = 'done', result = %(acks)s::jsonb -> (j.id || ' ' || j.claim_token), finished_at = %(now)s,
        updated_at = %(now)s, claim_token = NULL, visible_at = NULL, last_error = NULL
    WHERE j.id = ANY(ARRAY(SELECT jsonb_array_elements_text(%(ids)s::jsonb))) AND j.state || '' = 'running'
      AND %(acks)s::jsonb ? (j.id || ' ' || j.claim_token)
    RETURNING j.id, j.queue, j.flow_key
)
SELECT id, {{_slot_notice}} AS woke FROM done

-- name: nack
-- dead_letter ends the job; a suspension (counts = false) gives the attempt back, floored at 0;
-- a release gives it back too and returns the job to ready with no claim and no new error;
-- otherwise the job is ready again at run_at. The error is kept only when one is given.
UPDATE x_jobs
SET state = CASE WHEN %(dead)s THEN 'dead' WHEN %(counts)s OR %(release)s THEN 'ready' ELSE 'suspended' END,
    run_at = CASE WHEN %(dead)s THEN run_at ELSE %(run_at)s END,
    attempt = CASE WHEN %(dead)s OR (%(counts)s AND NOT %(release)s) THEN attempt ELSE greatest(attempt - 1, 0) END,
    finished_at = CASE WHEN %(dead)s THEN %(now)s ELSE NULL END,
    last_error = CASE WHEN %(release)s THEN last_error ELSE coalesce(%(error)s, last_error) END,
    claimed_by = CASE WHEN %(release)s THEN NULL ELSE claimed_by END,
    claim_token = NULL,
    visible_at = NULL,
    updated_at = %(now)s
WHERE id = %(id)s AND state || '' = 'running' AND claim_token = %(token)s
RETURNING queue, {{_slot_notice}} AS woke

-- name: heartbeat
UPDATE x_jobs SET visible_at = %(visible_at)s, updated_at = %(now)s
WHERE id = %(id)s AND state || '' = 'running' AND claim_token = %(token)s

-- ----------------------------------------------------------------------------------------------
-- Operator actions
-- ----------------------------------------------------------------------------------------------

-- name: cancel
-- Dropping the claim token is what makes the running attempt's next heartbeat fail.
UPDATE x_jobs
SET state = 'cancelled', last_error = coalesce(%(reason)s, last_error), finished_at = %(now)s,
    updated_at = %(now)s, claim_token = NULL, visible_at = NULL
WHERE id = %(id)s AND state IN ('ready', 'delayed', 'running', 'suspended')
RETURNING *

-- name: cancel_ledger
-- A cancelled run's backfill pass (if it is one) is closed with it, in the same transaction: a
-- pass that is waiting, or whose worker is gone, would otherwise read `running` forever.
UPDATE x_backfills
SET status = 'cancelled', finished_at = %(now)s, error = %(reason)s, throttle = NULL
WHERE run_id = %(run_id)s AND status IN ('running', 'paused')

-- name: retry
-- Same row, same run_id: the run's recorded steps replay. last_error is kept for the operator.
-- Raises a unique violation when another live job took the (name, key) meanwhile. The NOTIFY
-- wakes other processes' workers: the job is runnable now.
UPDATE x_jobs
SET state = 'ready', attempt = 0, run_at = %(now)s, finished_at = NULL, claim_token = NULL,
    visible_at = NULL, updated_at = %(now)s
WHERE id = %(id)s AND state IN ('dead', 'cancelled')
RETURNING *, pg_notify(%(channel)s, queue)::text AS notified

-- name: live_holder
SELECT id FROM x_jobs
WHERE name = %(name)s AND idempotency_key = %(idempotency_key)s AND id <> %(id)s
  AND state IN ('ready', 'delayed', 'running', 'suspended')

-- ----------------------------------------------------------------------------------------------
-- Bulk operator actions: one bounded batch per statement, lowest ids first from a cursor, rows
-- another transaction holds locked skipped (claims and settlements keep flowing; the caller
-- comes back for them). Each batch adds what it touched to its audit row in the same statement.
-- ----------------------------------------------------------------------------------------------

-- name: bulk_retry
-- As `retry`, per row. A row whose (name, key) a live job holds stays as it is, and of two rows
-- under one key only the most recently changed is revived: the unique index would refuse both.
WITH candidates AS (
    SELECT id, name, idempotency_key, updated_at FROM x_jobs AS j
    WHERE {{_job_where}}
      AND id > %(after)s
      AND (%(as_of)s::timestamptz IS NULL OR updated_at <= %(as_of)s)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), chosen AS (
    SELECT id FROM (
        SELECT c.id, c.idempotency_key,
               row_number() OVER (PARTITION BY c.name, c.idempotency_key ORDER BY c.updated_at DESC, c.id) AS nth
        FROM candidates AS c
        WHERE c.idempotency_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM x_jobs AS live
            WHERE live.name = c.name AND live.idempotency_key = c.idempotency_key
              AND live.state IN ('ready', 'delayed', 'running', 'suspended')
        )
    ) AS ranked
    WHERE idempotency_key IS NULL OR nth = 1
), revived AS (
    UPDATE x_jobs AS j
    SET state = 'ready', attempt = 0, run_at = %(now)s, finished_at = NULL, claim_token = NULL,
        visible_at = NULL, updated_at = %(now)s
    FROM chosen WHERE j.id = chosen.id
    RETURNING j.id, j.queue
), audited AS (
    UPDATE x_audit SET touched = touched + (SELECT count(*) FROM revived) WHERE id = %(audit_id)s
)
SELECT 'touched' AS kind, id, queue FROM revived
UNION ALL
SELECT 'last', max(id), NULL FROM candidates

-- name: bulk_cancel
-- As `cancel`, per row, with each cancelled run's running ledger row closed in the same statement.
WITH candidates AS (
    SELECT id FROM x_jobs
    WHERE {{_job_where}}
      AND id > %(after)s
      AND (%(as_of)s::timestamptz IS NULL OR updated_at <= %(as_of)s)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), cancelled AS (
    UPDATE x_jobs AS j
    SET state = 'cancelled', last_error = coalesce(%(reason)s, j.last_error), finished_at = %(now)s,
        updated_at = %(now)s, claim_token = NULL, visible_at = NULL
    FROM candidates WHERE j.id = candidates.id AND j.state IN ('ready', 'delayed', 'running', 'suspended')
    RETURNING j.id, j.queue, j.run_id, j.last_error
), ledger AS (
    UPDATE x_backfills AS b SET status = 'cancelled', finished_at = %(now)s, error = cancelled.last_error
    FROM cancelled WHERE b.run_id = cancelled.run_id AND b.status IN ('running', 'paused')
), audited AS (
    UPDATE x_audit SET touched = touched + (SELECT count(*) FROM cancelled) WHERE id = %(audit_id)s
)
SELECT 'touched' AS kind, id, queue FROM cancelled
UNION ALL
SELECT 'last', max(id), NULL FROM candidates

-- name: bulk_delete
-- Deletes the rows and their runs' steps (a run id belongs to one job), and closes a running
-- ledger row of a deleted run (a waiting pass deleted would otherwise read `running` forever).
WITH candidates AS (
    SELECT id FROM x_jobs
    WHERE {{_job_where}}
      AND id > %(after)s
      AND (%(as_of)s::timestamptz IS NULL OR updated_at <= %(as_of)s)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM x_jobs AS j USING candidates
    WHERE j.id = candidates.id AND j.state <> 'running'
    RETURNING j.id, j.queue, j.run_id
), attempts AS (
    DELETE FROM x_attempts WHERE job_id IN (SELECT id FROM deleted)
), steps AS (
    -- a run id is minted with its job and no other job carries it: the run's steps go with it
    DELETE FROM x_job_steps AS s WHERE s.run_id IN (SELECT run_id FROM deleted)
), ledger AS (
    UPDATE x_backfills AS b SET status = 'cancelled', finished_at = %(now)s, error = 'deleted by operator'
    FROM deleted WHERE b.run_id = deleted.run_id AND b.status IN ('running', 'paused')
), audited AS (
    UPDATE x_audit SET touched = touched + (SELECT count(*) FROM deleted) WHERE id = %(audit_id)s
)
SELECT 'touched' AS kind, id, queue FROM deleted
UNION ALL
SELECT 'last', max(id), NULL FROM candidates

-- name: prune_chunk
-- One bounded chunk, oldest first, with the steps of the deleted jobs' runs (a run id belongs to
-- one job).
WITH doomed AS (
    SELECT id, run_id FROM x_jobs
    WHERE state IN ('done', 'dead', 'cancelled') AND finished_at <= %(cutoff)s
    ORDER BY finished_at
    LIMIT %(chunk)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM x_jobs AS j USING doomed WHERE j.id = doomed.id
    RETURNING j.run_id
), attempts AS (
    DELETE FROM x_attempts WHERE job_id IN (SELECT id FROM doomed)
), steps AS (
    DELETE FROM x_job_steps AS s WHERE s.run_id IN (SELECT run_id FROM deleted)
)
SELECT count(*) FROM deleted

-- ----------------------------------------------------------------------------------------------
-- Introspection
-- ----------------------------------------------------------------------------------------------

-- name: job_get
SELECT * FROM x_jobs WHERE id = %(id)s

-- name: _job_where
-- The operator's job filter (ultimat3.drivers.filters binds it); a NULL parameter means "any".
(%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(name_like)s::text IS NULL OR name LIKE %(name_like)s)
  AND (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(error)s::text IS NULL OR strpos(last_error, %(error)s) > 0)
  AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR updated_at < %(until)s)
  AND (%(ids)s::text[] IS NULL OR id = ANY(%(ids)s::text[]))

-- name: job_list
SELECT * FROM x_jobs
WHERE {{_job_where}}
  AND (%(before)s::text IS NULL OR (created_at, id) < (SELECT created_at, id FROM x_jobs WHERE id = %(before)s))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: job_count
SELECT count(*) FROM x_jobs
WHERE {{_job_where}}
  AND (%(as_of)s::timestamptz IS NULL OR updated_at <= %(as_of)s)

-- name: job_error_groups
-- Grouped by the first line of last_error; the code is read from it in Python.
SELECT split_part(last_error, E'\n', 1) AS message, count(*) AS count, min(updated_at) AS first_seen,
       max(updated_at) AS last_seen, min(id) AS sample_id
FROM x_jobs
WHERE {{_job_where}} AND last_error IS NOT NULL
GROUP BY 1
ORDER BY count(*) DESC, 1
LIMIT %(limit)s

-- name: job_stats
SELECT queue, state, count(*) FROM x_jobs GROUP BY queue, state ORDER BY queue

-- name: job_waiting_names
-- Which names wait in which queues (a worker warns about the ones it cannot run).
SELECT queue, name, count(*) FROM x_jobs
WHERE state IN ('ready', 'delayed', 'suspended')
GROUP BY queue, name ORDER BY queue, name

-- ----------------------------------------------------------------------------------------------
-- Steps
-- ----------------------------------------------------------------------------------------------

-- name: steps_load
SELECT run_id, name, result, created_at FROM x_job_steps WHERE run_id = %(run_id)s

-- name: steps_record
-- FENCED: the job row is share-locked under the fence, so a concurrent ack/nack/cancel either
-- lands first (and the fence fails) or waits for this write. First write of a name wins; the
-- count says whether the fence held, whether or not the name was new.
WITH job AS (
    SELECT run_id FROM x_jobs
    WHERE id = %(id)s AND state || '' = 'running' AND claim_token = %(token)s
    FOR SHARE
), ins AS (
    INSERT INTO x_job_steps (run_id, name, result, created_at)
    SELECT run_id, %(name)s, %(result)s, %(now)s FROM job
    ON CONFLICT (run_id, name) DO NOTHING
)
SELECT count(*) FROM job

-- ----------------------------------------------------------------------------------------------
-- Backfill ledger
-- ----------------------------------------------------------------------------------------------

-- name: backfill_start
-- A retried attempt of the same pass reopens its row; progress, start time and a standing pause
-- request stay.
INSERT INTO x_backfills (run_id, name, checksum, status, batches, rows, started_at, job_id, kind)
VALUES (%(run_id)s, %(name)s, %(checksum)s, 'running', 0, 0, %(now)s, %(job_id)s, %(kind)s)
ON CONFLICT (run_id) DO UPDATE
SET status = 'running', error = NULL, finished_at = NULL,
    job_id = coalesce(x_backfills.job_id, EXCLUDED.job_id)
RETURNING *

-- name: backfill_progress
-- Also answers whether an operator asked the pass to pause.
UPDATE x_backfills SET batches = %(batches)s, rows = %(rows)s, throttle = %(throttle)s
WHERE run_id = %(run_id)s
RETURNING status = 'running' AND paused_by IS NOT NULL AS pause

-- name: backfill_finish
-- Only a running pass is closed: a pass cancelled under its worker's feet stays cancelled.
UPDATE x_backfills SET status = %(status)s, error = %(error)s, finished_at = %(now)s, throttle = NULL,
    paused_by = NULL
WHERE run_id = %(run_id)s AND status = 'running'

-- name: backfill_request_pause
UPDATE x_backfills SET paused_by = %(actor)s
WHERE run_id = (SELECT run_id FROM x_backfills WHERE name = %(name)s AND status = 'running'
                ORDER BY started_at DESC, run_id DESC LIMIT 1)
RETURNING *

-- name: backfill_pause
UPDATE x_backfills SET status = 'paused', throttle = NULL
WHERE run_id = %(run_id)s AND status = 'running' AND paused_by IS NOT NULL

-- name: backfill_resume
-- The newest pass that is paused or asked to pause goes back to running, and its job (suspended
-- by the pause) becomes runnable now, in the same statement; the ready notice moves claim cursors.
WITH run AS (
    UPDATE x_backfills SET status = 'running', paused_by = NULL
    WHERE run_id = (SELECT run_id FROM x_backfills
                    WHERE name = %(name)s AND (status = 'paused' OR (status = 'running' AND paused_by IS NOT NULL))
                    ORDER BY started_at DESC, run_id DESC LIMIT 1)
    RETURNING *
), woken AS (
    UPDATE x_jobs AS j SET run_at = %(now)s, updated_at = %(now)s
    FROM run WHERE j.id = run.job_id AND j.state = 'suspended'
    RETURNING j.priority, j.run_at, j.queue
)
SELECT run.*, (SELECT pg_notify(%(channel)s, {{_ready_notice}})::text FROM woken) AS notified FROM run

-- name: backfill_quarantine
-- Count the keys new to this pass (a replayed batch counts nothing twice), then store them; the
-- count is taken before the upsert in the same statement (CTEs see the snapshot before it).
WITH failed AS (
    SELECT f.key, f.reason FROM unnest(%(keys)s::text[], %(reasons)s::text[]) AS f(key, reason)
), counted AS (
    UPDATE x_backfills SET failures = failures + (
        SELECT count(*) FROM failed
        WHERE NOT EXISTS (SELECT 1 FROM x_backfill_failures AS x
                          WHERE x.name = %(name)s AND x.key = failed.key AND x.run_id = %(run_id)s))
    WHERE run_id = %(run_id)s
), stored AS (
    INSERT INTO x_backfill_failures (name, key, reason, run_id, batch, failed_at)
    SELECT %(name)s, key, reason, %(run_id)s, %(batch)s, %(now)s FROM failed
    ON CONFLICT (name, key) DO UPDATE
    SET reason = EXCLUDED.reason, run_id = EXCLUDED.run_id, batch = EXCLUDED.batch, failed_at = EXCLUDED.failed_at
), forgotten AS (
    DELETE FROM x_backfill_failures WHERE name = %(name)s AND key = ANY(%(handled)s::text[])
)
SELECT 1

-- name: backfill_failures
SELECT * FROM x_backfill_failures
WHERE name = %(name)s AND (%(after)s::text IS NULL OR key > %(after)s)
ORDER BY key
LIMIT %(limit)s

-- name: backfill_outstanding
SELECT count(*) AS n FROM x_backfill_failures WHERE name = %(name)s

-- name: backfill_get
SELECT * FROM x_backfills WHERE run_id = %(run_id)s

-- name: backfill_last_completed
SELECT * FROM x_backfills
WHERE name = %(name)s AND status = 'completed' AND kind = 'pass' AND finished_at IS NOT NULL
ORDER BY finished_at DESC, run_id DESC
LIMIT 1

-- name: backfill_list
SELECT * FROM x_backfills
WHERE %(name)s::text IS NULL OR name = %(name)s
ORDER BY started_at DESC, run_id DESC

-- ----------------------------------------------------------------------------------------------
-- Leases: slots 0..limit-1 of a key; a slot is free when it has no row or its row expired.
-- ----------------------------------------------------------------------------------------------

-- name: lease_lock
-- Serialises acquirers of one key for the transaction: the slot choice below reads, then writes.
SELECT pg_advisory_xact_lock(hashtextextended('ultimat3:lease:' || %(key)s, 0))

-- name: lease_acquire
INSERT INTO x_leases (key, slot, holder, token, expires_at)
SELECT %(key)s, s.slot, %(holder)s, %(token)s, %(expires_at)s
FROM generate_series(0, %(limit)s - 1) AS s(slot)
WHERE NOT EXISTS (
    SELECT 1 FROM x_leases AS l WHERE l.key = %(key)s AND l.slot = s.slot AND l.expires_at > %(now)s
)
ORDER BY s.slot
LIMIT 1
ON CONFLICT (key, slot) DO UPDATE
SET holder = EXCLUDED.holder, token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
WHERE x_leases.expires_at <= %(now)s
RETURNING *

-- name: lease_by_token
SELECT * FROM x_leases WHERE key = %(key)s AND token = %(token)s

-- name: lease_renew
-- Only the token decides: an expired lease nobody re-took is still this holder's.
UPDATE x_leases SET expires_at = %(expires_at)s
WHERE key = %(key)s AND slot = %(slot)s AND token = %(token)s
RETURNING *

-- name: lease_release
DELETE FROM x_leases WHERE key = %(key)s AND slot = %(slot)s AND token = %(token)s

-- name: lease_holders
SELECT * FROM x_leases WHERE key = %(key)s AND expires_at > %(now)s ORDER BY slot

-- ----------------------------------------------------------------------------------------------
-- Worker registry. Liveness is a session-level advisory lock per worker, (hashtext('ultimat3:workers'),
-- hashtext(schema:id)), held on a connection the worker keeps open; the server frees it when that
-- connection dies. Whether a worker lives is read from pg_locks (who holds the key), never by
-- trying the key: advisory locks are re-entrant, so a probe running on a pooled server connection
-- that happens to hold the key would take it and call a live worker dead.
-- ----------------------------------------------------------------------------------------------

-- name: worker_lock
-- One statement: the lock and the server process that took it (each beat checks it stays the same).
SELECT pg_try_advisory_lock(hashtext('ultimat3:workers'), hashtext(current_schema() || ':' || %(id)s)),
       pg_backend_pid()

-- name: worker_upsert
-- A re-registration (after a rescue took the worker for dead) keeps the first start time.
INSERT INTO x_workers (id, host, pid, concurrency, queues, started_at, last_seen_at, clock_offset, backend_pid)
VALUES (%(id)s, %(host)s, %(pid)s, %(concurrency)s, %(queues)s, %(now)s, %(now)s, NULL, %(backend)s)
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, concurrency = EXCLUDED.concurrency,
    queues = EXCLUDED.queues, last_seen_at = EXCLUDED.last_seen_at, backend_pid = EXCLUDED.backend_pid

-- name: worker_beat
-- Through the liveness connection itself; the backend it ran on proves the session is still ours.
UPDATE x_workers SET last_seen_at = %(now)s, clock_offset = %(clock_offset)s, wakeups = %(wakeups)s
WHERE id = %(id)s
RETURNING pg_backend_pid()

-- name: worker_unpin
-- The liveness session went through a pooler: its lock says nothing, so nobody may rescue on it.
UPDATE x_workers SET backend_pid = NULL WHERE id = %(id)s

-- name: worker_delete
DELETE FROM x_workers WHERE id = %(id)s

-- name: worker_list
SELECT w.*, EXISTS (
    SELECT 1 FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = (hashtext('ultimat3:workers')::bigint & 4294967295)::oid
      AND l.objid = (hashtext(current_schema() || ':' || w.id)::bigint & 4294967295)::oid
) AS held
FROM x_workers AS w
ORDER BY w.id

-- name: backend_alive
-- Whether a server backend still exists (an abandoned liveness session the server has not yet ended).
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %(pid)s)

-- name: worker_running
SELECT claimed_by, id FROM x_jobs WHERE state = 'running' AND claimed_by IS NOT NULL ORDER BY id

-- name: worker_dead
-- Inside the rescue's transaction. Dead: pinned to a real session and nobody holds its key; the
-- key is then taken for the rest of the transaction, so the worker cannot re-register mid-rescue.
SELECT w.id FROM x_workers AS w
WHERE w.id <> %(me)s AND w.backend_pid IS NOT NULL
  AND CASE WHEN EXISTS (
    SELECT 1 FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = (hashtext('ultimat3:workers')::bigint & 4294967295)::oid
      AND l.objid = (hashtext(current_schema() || ':' || w.id)::bigint & 4294967295)::oid
) THEN false
           ELSE pg_try_advisory_xact_lock(hashtext('ultimat3:workers'), hashtext(current_schema() || ':' || w.id))
      END
ORDER BY w.id

-- name: worker_release_jobs
-- The dead workers' running jobs, back to ready: the attempt counts (as a lapse does), the claim is
-- cleared, so nothing such a worker may still send can settle them. Their rows go too, and the
-- queues are woken in every process.
WITH doomed AS (
    SELECT id, claimed_by FROM x_jobs
    WHERE state = 'running' AND claimed_by = ANY(%(dead)s::text[])
    FOR UPDATE
), released AS (
    UPDATE x_jobs AS j
    SET state = 'ready', claim_token = NULL, visible_at = NULL, claimed_by = NULL,
        last_error = %(error_prefix)s || d.claimed_by || %(error_suffix)s, updated_at = %(now)s
    FROM doomed AS d
    WHERE j.id = d.id AND j.state = 'running'
    RETURNING j.id, j.queue, j.priority, j.run_at, d.claimed_by AS worker
), gone AS (
    DELETE FROM x_workers WHERE id = ANY(%(dead)s::text[])
)
SELECT id, queue, worker, pg_notify(%(channel)s, {{_ready_notice}})::text AS notified FROM released
ORDER BY id

-- ----------------------------------------------------------------------------------------------
-- Queues and the audit log
-- ----------------------------------------------------------------------------------------------

-- name: queue_set
-- Pause or resume, and the audit row, in one statement. `changed` says whether it was a change.
WITH before AS (
    SELECT coalesce((SELECT paused FROM x_queues WHERE queue = %(queue)s), false) AS paused
), upserted AS (
    INSERT INTO x_queues (queue, paused, changed_at, changed_by)
    SELECT %(queue)s, %(paused)s, %(now)s, %(actor)s FROM before WHERE before.paused <> %(paused)s
    ON CONFLICT (queue) DO UPDATE
    SET paused = excluded.paused, changed_at = excluded.changed_at, changed_by = excluded.changed_by
    RETURNING 1
), audited AS (
    INSERT INTO x_audit (id, at, actor, action, target, touched, status, finished_at)
    VALUES (%(audit_id)s, %(now)s, %(actor)s, %(action)s, %(target)s,
            (SELECT count(*) FROM upserted), 'completed', %(now)s)
)
-- The notice asks every claimer of the queue to walk it from the head: a claim over every queue
-- may have moved its cursor past the rows of this one while it was paused.
SELECT (SELECT count(*) FROM upserted) > 0 AS changed,
       pg_notify(%(channel)s, chr(30) || 'R' || chr(30) || %(queue)s)::text AS notified

-- name: queue_lock
-- Pauses and resumes of one queue take turns, so two operators cannot both read "not paused".
SELECT pg_advisory_xact_lock(hashtext('ultimat3:queues'), hashtext(%(queue)s))

-- name: queues_paused
SELECT queue FROM x_queues WHERE paused ORDER BY queue

-- name: queue_overview
WITH counts AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'ready') AS ready,
           count(*) FILTER (WHERE state = 'delayed') AS delayed,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'suspended') AS suspended,
           count(*) FILTER (WHERE state = 'done') AS done,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE state IN ('ready', 'delayed', 'suspended') AND run_at <= %(now)s) AS due,
           min(run_at) FILTER (WHERE state IN ('ready', 'delayed', 'suspended') AND run_at <= %(now)s) AS oldest_due,
           count(*) FILTER (WHERE state = 'done' AND finished_at >= %(since)s) AS done_recent,
           count(*) FILTER (WHERE state = 'ready' AND attempt > 0 AND last_error IS NOT NULL
                            AND updated_at >= %(since)s) AS failed_recent,
           count(*) FILTER (WHERE state = 'dead' AND finished_at >= %(since)s) AS dead_recent
    FROM x_jobs GROUP BY queue
)
SELECT coalesce(c.queue, q.queue) AS queue, coalesce(q.paused, false) AS paused, q.changed_at, q.changed_by,
       coalesce(c.ready, 0) AS ready, coalesce(c.delayed, 0) AS delayed, coalesce(c.running, 0) AS running,
       coalesce(c.suspended, 0) AS suspended, coalesce(c.done, 0) AS done, coalesce(c.dead, 0) AS dead,
       coalesce(c.cancelled, 0) AS cancelled, coalesce(c.due, 0) AS due, c.oldest_due,
       coalesce(c.done_recent, 0) AS done_recent, coalesce(c.failed_recent, 0) AS failed_recent,
       coalesce(c.dead_recent, 0) AS dead_recent
FROM counts AS c FULL JOIN x_queues AS q ON q.queue = c.queue
ORDER BY 1

-- name: audit_open
INSERT INTO x_audit (id, at, actor, action, target, touched, status)
VALUES (%(id)s, %(now)s, %(actor)s, %(action)s, %(target)s, 0, 'running')
RETURNING *

-- name: audit_close
UPDATE x_audit SET status = %(status)s, finished_at = %(now)s, touched = coalesce(%(touched)s::bigint, touched)
WHERE id = %(id)s AND status = 'running'

-- name: audit_list
SELECT * FROM x_audit
WHERE (%(action)s::text IS NULL OR action = %(action)s)
ORDER BY at DESC, seq DESC
LIMIT %(limit)s

-- ----------------------------------------------------------------------------------------------
-- Schedules: each tick fires once, by a compare-and-set on last_tick in the tick's enqueue transaction
-- ----------------------------------------------------------------------------------------------

-- name: schedule_register
INSERT INTO x_schedules (key, last_tick, updated_at) VALUES (%(key)s, %(start)s, %(now)s)
ON CONFLICT (key) DO NOTHING

-- name: schedule_get
SELECT * FROM x_schedules WHERE key = %(key)s

-- name: schedule_advance
-- Only the first worker to bring a tick gets a row back; the others find last_tick already there.
UPDATE x_schedules SET last_tick = %(tick)s, updated_at = %(now)s, last_job_id = NULL
WHERE key = %(key)s AND last_tick < %(tick)s
RETURNING paused

-- name: schedule_job
UPDATE x_schedules SET last_job_id = %(job_id)s WHERE key = %(key)s

-- name: schedule_set_paused
-- Pause or resume, and its audit row, in one statement; `changed` compares with the row before.
WITH before AS (
    SELECT coalesce((SELECT paused FROM x_schedules WHERE key = %(key)s), false) AS paused
), upserted AS (
    INSERT INTO x_schedules (key, last_tick, paused, changed_at, changed_by, updated_at)
    VALUES (%(key)s, %(now)s, %(paused)s, %(now)s, %(actor)s, %(now)s)
    ON CONFLICT (key) DO UPDATE
    SET paused = excluded.paused, changed_at = excluded.changed_at, changed_by = excluded.changed_by
    WHERE x_schedules.paused <> excluded.paused
    RETURNING 1
), audited AS (
    INSERT INTO x_audit (id, at, actor, action, target, touched, status, finished_at)
    SELECT %(audit_id)s, %(now)s, %(actor)s, %(action)s, %(target)s,
           CASE WHEN before.paused <> %(paused)s THEN 1 ELSE 0 END, 'completed', %(now)s
    FROM before
)
SELECT before.paused <> %(paused)s AS changed, (SELECT count(*) FROM upserted) AS written FROM before

-- name: schedules_list
SELECT * FROM x_schedules ORDER BY key

-- ----------------------------------------------------------------------------------------------
-- Health
-- ----------------------------------------------------------------------------------------------

-- name: oldest_snapshot
-- Who holds the oldest snapshot VACUUM must keep rows for: an open transaction of any backend
-- (idle in transaction, a long report, pg_dump), or a prepared transaction, in this database (the
-- one whose VACUUM it holds back). Our own session excluded.
SELECT 'backend' AS kind, pid, application_name, state, backend_type,
       extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age,
       left(split_part(query, E'\n', 1), 200) AS query
FROM pg_stat_activity
WHERE backend_xmin IS NOT NULL AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
  AND datname = current_database()
UNION ALL
SELECT 'prepared', NULL, gid, 'prepared', 'prepared transaction',
       extract(epoch FROM clock_timestamp() - prepared)::float8, NULL
FROM pg_prepared_xacts
WHERE database = current_database()
ORDER BY age DESC
LIMIT 1
