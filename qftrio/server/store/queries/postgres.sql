-- The PostgreSQL store's statements (qftrio.server.store.postgres), by name.
-- "{where}" and "{limit}" are filled in at run time for the pages.

-- name: job_columns
-- A job's columns: the fields of qftrio.models.Job, which postgres._job reads
-- by name, and the lease token and idempotency key (tests/test_store_sql.py).
id, tenant, queue, kind, payload, status, priority, attempt, max_attempts, scheduled_at, created_at,
    updated_at, locked_until, worker_id, lease_token, result, error, errors, idempotency_key, workflow_id, step,
    context, timeout_secs, backoff, headers, schedule, concurrency, rate_limit, "unique", progress, progress_at, attempts,
    -- beyond Job's fields: the last attempt's claim (models.attempt_history)
    claimed_at

-- name: job_bytes
-- What each job of a page takes on the wire, about (changes.fitting): the
-- length of its JSON columns as text (which has a space more than the
-- answer after each ':' and ','), twice that of its error (which the answer
-- escapes), 1 KiB for its names and fixed fields, and the attempt read
-- from the row of a running or completed job. Counted on the server,
-- without sending the job; a column added to job_columns that can be long
-- belongs here too.
SELECT id, 1024 + octet_length(payload::text) + coalesce(octet_length(result::text), 0)
    + coalesce(octet_length(context::text), 0) + octet_length(errors::text)
    + 2 * coalesce(octet_length(error), 0) + coalesce(octet_length(worker_id), 0) + coalesce(octet_length(step), 0)
    + coalesce(octet_length(headers::text), 0) + coalesce(octet_length(concurrency::text), 0)
    + coalesce(octet_length("unique"::text), 0) + coalesce(octet_length(progress::text), 0)
    + octet_length(attempts::text)
    + CASE WHEN status IN ('running', 'completed') THEN 192 + coalesce(octet_length(worker_id), 0) ELSE 0 END
FROM qftrio_jobs WHERE id = ANY($1::uuid[]);

-- name: jobs_by_ids
SELECT {job_columns}
FROM qftrio_jobs WHERE id = ANY($1::uuid[]);

-- name: notify_queues
-- Inside the caller's transaction, so it is delivered on commit only; on
-- the channel postgres.CHANNEL.
SELECT pg_notify('qftrio_jobs', q) FROM unnest($1::text[]) AS q;

-- name: migration_settings
SET lock_timeout = '60s'; SET statement_timeout = 0;

-- name: migration_settings_reset
RESET lock_timeout; RESET statement_timeout;

-- name: migration_lock
SELECT pg_advisory_lock($1);

-- name: migration_unlock
SELECT pg_advisory_unlock($1);

-- name: migrations_table
CREATE TABLE IF NOT EXISTS qftrio_schema_migrations (
    version text PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_table_exists
SELECT to_regclass('qftrio_schema_migrations') IS NOT NULL;

-- name: migrations_applied
SELECT version FROM qftrio_schema_migrations;

-- name: migration_record
INSERT INTO qftrio_schema_migrations (version, name) VALUES ($1, $2);

-- name: functions_applied
-- The digest of the functions.sql the schema has (postgres._migrate_on).
SELECT name FROM qftrio_schema_migrations WHERE version = 'functions';

-- name: functions_record
INSERT INTO qftrio_schema_migrations (version, name) VALUES ('functions', $1)
ON CONFLICT (version) DO UPDATE SET name = excluded.name, applied_at = now();

-- name: claim
-- Fair tenants (transitions.fair_order): the queue's tenants with pending
-- jobs are found by skipping through qftrio_jobs_claim_idx, one probe each,
-- and served in turn from the $7-th (rotated: each claim starts at the next
-- one); each gives at most its share of the lease ($3 over the tenants
-- served), walking its part of the index in lease order. The jobs are
-- handed out each tenant's first, then each one's second, and so on; for a
-- single tenant, lease order itself. Candidates are picked with FOR UPDATE
-- SKIP LOCKED, so concurrent claimers never wait on each other and never
-- take the same row. An expired lease (c.status = 'running') records its
-- lost attempt as "lease expired"; one that ran to its deadline timed out,
-- and is the janitor's (transitions.timed_out). A job with timeout_secs gets
-- its deadline, which its lease never runs past. Tenants that paused the
-- queue are left out. A job whose concurrency key is at its limit is held
-- back, and the walk goes on past it. "more" answers whether a claim after
-- this one may find more (several tenants shared it, or limits held jobs
-- back): a lease left short is filled by claims after it.
WITH RECURSIVE pending_tenants AS (
    (SELECT tenant FROM qftrio_jobs WHERE queue = $1 AND status = 'pending' ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT j.tenant FROM qftrio_jobs AS j
            WHERE j.queue = $1 AND j.status = 'pending' AND j.tenant > t.tenant ORDER BY j.tenant LIMIT 1)
    FROM pending_tenants AS t WHERE t.tenant IS NOT NULL
), tenants AS (
    SELECT tenant, row_number() OVER (ORDER BY tenant) - 1 AS n, count(*) OVER () AS total FROM pending_tenants
    WHERE tenant IS NOT NULL AND tenant <> ALL (ARRAY(SELECT tenant FROM qftrio_queue_pauses WHERE queue = $1))
), served AS (
    SELECT tenant, (n + $7) % total AS turn, ceil($3::float8 / least(total, $3))::int AS share FROM tenants
    WHERE (n + $7) % total < $3
), ready AS (
    SELECT r.*, s.turn FROM served AS s CROSS JOIN LATERAL (
        SELECT id, tenant, status, priority, scheduled_at, created_at, concurrency_key, concurrency_limit, rate_limit
        FROM qftrio_jobs
        -- The walk reads just the rows it takes, in the order of
        -- qftrio_jobs_claim_idx (queue, tenant, then lease order), whatever
        -- the statistics: the tenant is bounded as a row comparison on
        -- (queue, tenant), which an index led by tenant cannot take, and the
        -- order names the queue and tenant, which only this index gives. The
        -- queue has no condition of its own: with "queue = $1" too, the walk
        -- starts at the queue's first tenant, the row comparison only a
        -- filter (every tenant's walk read those before it). With
        -- "tenant = s.tenant" and lease order alone, a queue the statistics
        -- do not know yet (a new one, a burst) is planned as one row from an
        -- index led by tenant: its whole backlog read and sorted each claim.
        WHERE (queue, tenant) >= ($1, s.tenant) AND (queue, tenant) <= ($1, s.tenant)
          AND status = 'pending' AND scheduled_at <= $2
          AND (concurrency_key IS NULL OR concurrency_limit > coalesce(
              (SELECT k.running FROM qftrio_concurrency_running AS k
               WHERE k.tenant = s.tenant AND k.key = qftrio_jobs.concurrency_key), 0))
          AND (rate_limit IS NULL OR NOT EXISTS (
              SELECT 1 FROM qftrio_rate_limits AS r WHERE r.tenant = s.tenant AND r.name = qftrio_jobs.rate_limit
                AND (SELECT count(*) FROM unnest(r.stamps) AS t WHERE t > $2 - r.per_secs) >= r."limit"))
        ORDER BY queue, tenant, priority DESC, scheduled_at, created_at
        LIMIT s.share
        FOR UPDATE SKIP LOCKED
    ) AS r
), expired AS (
    -- An expired lease holds its concurrency key's place already; its claim
    -- takes a unit of its rate limit.
    SELECT id, tenant, status, priority, scheduled_at, created_at, NULL::text, NULL::int, rate_limit, NULL::bigint
    FROM qftrio_jobs
    WHERE queue = $1 AND status = 'running' AND locked_until < $2 AND attempt < max_attempts
      AND (deadline IS NULL OR locked_until < deadline)
      AND tenant <> ALL (ARRAY(SELECT tenant FROM qftrio_queue_pauses WHERE queue = $1))
    ORDER BY priority DESC, scheduled_at, created_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), weighed AS (
    SELECT u.id, u.tenant, u.status, u.concurrency_key, u.concurrency_limit, u.rate_limit,
        row_number() OVER (PARTITION BY u.tenant ORDER BY u.priority DESC, u.scheduled_at, u.created_at) AS rank,
        coalesce(max(u.turn) OVER (PARTITION BY u.tenant), $3) AS turn
    FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) AS u
), held AS (
    -- The candidates held back by their concurrency keys and rate limits
    -- (qftrio_claim_held, which locks and reads the keys' and limits' rows):
    -- called only when a candidate has one, so that a claim of jobs that
    -- use neither carries none of that work.
    SELECT qftrio_claim_held(array_agg(id), array_agg(tenant), array_agg(concurrency_key),
        array_agg(concurrency_limit), array_agg(rate_limit), array_agg(rank), $2) AS ids
    FROM weighed WHERE concurrency_key IS NOT NULL OR rate_limit IS NOT NULL
    HAVING count(*) > 0
), chosen AS (
    SELECT id, status, rank, turn, tenant, rate_limit FROM weighed
    WHERE id <> ALL (coalesce((SELECT ids FROM held), '{}'))
    ORDER BY rank, turn, tenant
    LIMIT $3
), taken AS MATERIALIZED (
    -- The chosen jobs' ids, as an array: the rows are then found by their
    -- key, whatever the generic plan guesses of how many the walks above
    -- choose (a guess of thousands would join them to the whole table).
    -- Their rate limits' units are taken first (qftrio_rate_take), only
    -- when one names one.
    SELECT ARRAY(SELECT id FROM chosen) AS ids, (
        SELECT qftrio_rate_take(array_agg(tenant), array_agg(rate_limit), $2) FROM chosen
        WHERE rate_limit IS NOT NULL HAVING count(*) > 0) AS stamped
)
UPDATE qftrio_jobs AS j SET
    status = 'running',
    attempt = j.attempt + 1,
    locked_until = least($2 + $4::float8, $2 + j.timeout_secs),
    deadline = $2 + j.timeout_secs,
    lease_token = gen_random_uuid(),
    worker_id = $5,
    updated_at = $2,
    claimed_at = $2,
    error = CASE WHEN c.status = 'running' THEN $6 ELSE j.error END,
    errors = CASE WHEN c.status = 'running'
        THEN j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'error', $6::text, 'at', $2))
        ELSE j.errors END,
    -- the history keeps ended attempts: the lost one goes into it (the new
    -- one is the row's own attempt, worker_id and claimed_at)
    attempts = CASE WHEN c.status = 'running'
        THEN qftrio_attempt_end(j.attempts, j.attempt, j.worker_id, j.claimed_at, 'lost', $6, $2)
        ELSE j.attempts END
FROM chosen AS c
WHERE j.id = c.id AND j.id = ANY((SELECT ids FROM taken)::uuid[])
RETURNING j.id, j.tenant, j.queue, j.kind, j.payload, j.status, j.priority, j.attempt, j.max_attempts,
    j.scheduled_at, j.created_at, j.updated_at, j.locked_until, j.worker_id, j.lease_token, j.result, j.error,
    j.errors, j.idempotency_key, j.workflow_id, j.step, j.context, j.timeout_secs, j.backoff, j.headers, j.schedule,
    j.concurrency, j.rate_limit, j."unique", j.progress, j.progress_at, j.attempts, j.claimed_at, c.rank, c.turn,
    (SELECT count(*) FROM served) > 1 OR coalesce((SELECT ids FROM held) <> '{}', false) AS more;

-- name: insert_handing_over
-- Insert a parked long-poll's queue's new jobs, those it takes (the due
-- ones, in lease order, up to its limit) claimed already, unless something
-- older is claimable in the queue; NOTIFY the queue if any stay pending.
-- A tenant that paused the queue gets its jobs inserted pending.
WITH older AS (
    SELECT EXISTS (
        SELECT 1 FROM qftrio_jobs WHERE queue = $3 AND status = 'pending' AND scheduled_at <= $4
    ) OR EXISTS (
        SELECT 1 FROM qftrio_jobs
        WHERE queue = $3 AND status = 'running' AND locked_until < $4 AND attempt < max_attempts
          AND (deadline IS NULL OR locked_until < deadline)
    ) AS found
), input AS (
    SELECT u.*, u.scheduled_at <= $4 AS due,
        row_number() OVER (PARTITION BY u.scheduled_at <= $4 ORDER BY u.priority DESC, u.scheduled_at, u.ord) AS rank
    FROM unnest($1::uuid[], $2::text[], $5::text[], $6::jsonb[], $7::int[], $8::int[], $9::float8[], $14::int[],
                $15::jsonb[], $16::jsonb[])
        WITH ORDINALITY AS u(id, tenant, kind, payload, priority, max_attempts, scheduled_at, timeout_secs, backoff,
                             headers, ord)
), chosen AS (
    SELECT i.*, (i.due AND i.rank <= $10 AND NOT o.found
                 AND i.tenant <> ALL (ARRAY(SELECT tenant FROM qftrio_queue_pauses WHERE queue = $3))) AS hand
    FROM input AS i CROSS JOIN older AS o
), inserted AS (
    INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, priority, max_attempts, scheduled_at,
        timeout_secs, backoff, deadline, headers,
        status, attempt, locked_until, lease_token, worker_id, claimed_at, created_at, updated_at)
    SELECT c.id, c.tenant, $3, c.kind, c.payload, c.priority, c.max_attempts, c.scheduled_at,
        c.timeout_secs, c.backoff, CASE WHEN c.hand THEN $4 + c.timeout_secs END, c.headers,
        CASE WHEN c.hand THEN 'running' ELSE 'pending' END,
        CASE WHEN c.hand THEN 1 ELSE 0 END,
        CASE WHEN c.hand THEN least($4 + $11::float8, $4 + c.timeout_secs) END,
        CASE WHEN c.hand THEN gen_random_uuid() END,
        CASE WHEN c.hand THEN $12::text END,
        CASE WHEN c.hand THEN $4 END,
        $4, $4
    FROM chosen AS c
    RETURNING {job_columns}
), notified AS (
    SELECT count(pg_notify($13, $3)) FROM (SELECT 1 FROM inserted WHERE status = 'pending' LIMIT 1) AS p
)
SELECT inserted.*, (SELECT found FROM older) AS older_found FROM inserted, notified;

-- name: jobs_insert
-- $1 is the batch as JSON, one array per job (PostgresStore._insert_batch):
-- the job's id, then NewJob's fields in their order (base.new_job_row;
-- tests/test_store_sql.py).
-- The NOTIFY of the new jobs' queues is part of the statement (delivered
-- when it commits): no round trip of its own.
WITH batch AS MATERIALIZED (
    SELECT j FROM jsonb_array_elements($1::text::jsonb) AS j
), keys AS (
    -- The rows of concurrency keys new to the table, made in (tenant, key)
    -- order before the jobs (whose insert trigger then finds them): two
    -- batches bringing the same new keys in opposite orders never wait on
    -- each other in a cycle, as they would making them job by job.
    INSERT INTO qftrio_concurrency_running (tenant, key, running)
    SELECT DISTINCT j->>1, j->16->>'key', 0 FROM batch WHERE j->16->>'key' IS NOT NULL ORDER BY 1, 2
    ON CONFLICT (tenant, key) DO NOTHING
), inserted AS (
    INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, priority, max_attempts,
        scheduled_at, idempotency_key, workflow_id, step, context, timeout_secs, backoff, headers, schedule,
        concurrency, concurrency_key, concurrency_limit, rate_limit, "unique", unique_key,
        status, attempt, created_at, updated_at)
    SELECT (j->>0)::uuid, j->>1, j->>2, j->>3, j->4, (j->>5)::int, (j->>6)::int,
        (j->>7)::float8, j->>8, (j->>9)::uuid, j->>10, CASE WHEN j->>11 IS NOT NULL THEN j->11 END,
        (j->>12)::int, CASE WHEN j->>13 IS NOT NULL THEN j->13 END, CASE WHEN j->>14 IS NOT NULL THEN j->14 END,
        j->>15,
        CASE WHEN j->>16 IS NOT NULL THEN j->16 END, j->16->>'key', (j->16->>'limit')::int,
        j->>17,
        CASE WHEN j->>18 IS NOT NULL THEN j->18 END, j->18->>'key',
        'pending', 0, $2::float8, $2::float8
    FROM batch
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue
), notified AS (
    SELECT count(pg_notify($3, q.queue)) FROM (SELECT DISTINCT queue FROM inserted) AS q
)
-- Only which jobs went in: the server knows the rest of each.
SELECT inserted.id::text FROM inserted, notified;

-- name: jobs_by_idempotency_keys
SELECT {job_columns}
FROM qftrio_jobs
WHERE (tenant, idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[]));

-- name: rate_limits_of
-- A tenant's rate limits, all of them ($2 null) or those named in $2.
SELECT name, "limit", per_secs, stamps FROM qftrio_rate_limits
WHERE tenant = $1 AND ($2::text[] IS NULL OR name = ANY($2::text[])) ORDER BY name;

-- name: rate_limit_set
-- A changed limit keeps the claims of the window: they still count.
INSERT INTO qftrio_rate_limits (tenant, name, "limit", per_secs) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, name) DO UPDATE SET "limit" = $3, per_secs = $4
RETURNING xmax = 0 AS created;

-- name: rate_limit_delete
DELETE FROM qftrio_rate_limits WHERE tenant = $1 AND name = $2 RETURNING 1;

-- name: unique_lock
-- Unique jobs' (tenant, key) pairs, locked until the transaction ends, in
-- order (so that two batches never wait on each other in a cycle); the
-- first number keeps these locks apart from qftrio's others.
SELECT count(pg_advisory_xact_lock(7265, hashtext(t || chr(1) || k)))
FROM (SELECT t, k FROM unnest($1::text[], $2::text[]) AS u(t, k) ORDER BY t, k) AS keys;

-- name: job_by_unique_key
-- The tenant's newest job with the unique key in one of the statuses $3
-- created after $4 (read after unique_lock: what committed before it is seen).
SELECT {job_columns}
FROM qftrio_jobs
WHERE tenant = $1 AND unique_key = $2 AND created_at > $4 AND status = ANY($3::text[])
ORDER BY created_at DESC LIMIT 1;

-- name: job_get
SELECT {job_columns}
FROM qftrio_jobs WHERE id = $1;

-- name: job_get_owned
SELECT {job_columns}
FROM qftrio_jobs WHERE id = $1 AND tenant = $2;

-- name: page_keys
-- The keys of a page of a tenant's jobs, newest first. The jobs not running
-- are merged from one range of qftrio_jobs_filter_idx for each (queue,
-- status, kind) combination the filter ("{combos}") matches, listed by the
-- counts' ledger ("{keys}": the page's key, a bulk action's time range).
-- Each combination's newest job comes first; the {limit}-th newest of those
-- is an edge no job of the page is older than, so only the combinations at
-- or above it are read further, at most {limit} keys each: O(combinations +
-- limit²) index entries, whatever the table holds. Running jobs are not in
-- that index (migration 0005): when the filter matches some, they are read
-- from qftrio_jobs_running_idx ("{running}": the filter on their rows) and
-- sorted, as many as the workers hold leases.
WITH combos AS (
    SELECT queue, status, kind FROM qftrio_job_counts WHERE tenant = $1 {combos}
    GROUP BY queue, status, kind HAVING sum(n) > 0
), newest AS (
    SELECT c.queue, c.status, c.kind, f.created_at, f.id FROM combos AS c CROSS JOIN LATERAL (
        SELECT j.created_at, j.id FROM qftrio_jobs AS j
        WHERE j.tenant = $1 AND j.queue = c.queue AND j.status = c.status AND j.kind = c.kind {keys}
          AND j.status <> 'running'
        ORDER BY j.created_at DESC, j.id DESC
        LIMIT 1
    ) AS f
    WHERE c.status <> 'running'
), edge AS (
    SELECT coalesce(max(created_at), '-infinity'::float8) AS created_at,
        coalesce(max(id::text), '00000000-0000-0000-0000-000000000000')::uuid AS id
    FROM (SELECT created_at, id FROM newest ORDER BY created_at DESC, id DESC OFFSET {limit} - 1 LIMIT 1) AS e
)
SELECT created_at, id FROM (
    SELECT k.created_at, k.id FROM newest AS c CROSS JOIN edge AS e CROSS JOIN LATERAL (
        SELECT j.created_at, j.id FROM qftrio_jobs AS j
        WHERE j.tenant = $1 AND j.queue = c.queue AND j.status = c.status AND j.kind = c.kind {keys}
          AND j.status <> 'running' AND (j.created_at, j.id) >= (e.created_at, e.id)
        ORDER BY j.created_at DESC, j.id DESC
        LIMIT {limit}
    ) AS k
    WHERE (c.created_at, c.id) >= (e.created_at, e.id)
    UNION ALL
    (SELECT j.created_at, j.id FROM qftrio_jobs AS j
     WHERE j.status = 'running' AND j.tenant = $1 {running} {keys}
       AND EXISTS (SELECT 1 FROM combos WHERE status = 'running')
     ORDER BY j.created_at DESC, j.id DESC
     LIMIT {limit})
) AS p
ORDER BY created_at DESC, id DESC
LIMIT {limit}

-- name: next_available
-- A lease counts even if it already ran out: its job is claimable now. A
-- job due later was scheduled ahead of its creation, which keeps this on
-- qftrio_jobs_scheduled_idx (migration 0003); the embedded store asks the same.
-- The jobs of tenants that paused the queue are left out.
SELECT least(
    (SELECT min(scheduled_at) FROM qftrio_jobs
     WHERE queue = $1 AND status = 'pending' AND scheduled_at > created_at AND scheduled_at > $2
       AND tenant <> ALL (ARRAY(SELECT tenant FROM qftrio_queue_pauses WHERE queue = $1))),
    (SELECT min(locked_until) FROM qftrio_jobs
     WHERE queue = $1 AND status = 'running' AND attempt < max_attempts
       AND (deadline IS NULL OR locked_until < deadline)
       AND tenant <> ALL (ARRAY(SELECT tenant FROM qftrio_queue_pauses WHERE queue = $1))),
    -- a rate limit with no unit left holding back ready jobs of the queue
    -- (its stamps oldest first: the "limit"-th newest frees the next unit);
    -- the rate limits are few per tenant, each a probe of
    -- qftrio_jobs_rate_pending_idx
    (SELECT min(r.stamps[cardinality(r.stamps) - r."limit" + 1] + r.per_secs) FROM qftrio_rate_limits AS r
     CROSS JOIN LATERAL (
         SELECT 1 FROM qftrio_jobs AS j
         WHERE j.tenant = r.tenant AND j.rate_limit = r.name AND j.queue = $1 AND j.status = 'pending'
           AND j.scheduled_at <= $2
         LIMIT 1) AS h
     WHERE cardinality(r.stamps) >= r."limit" AND r.stamps[cardinality(r.stamps) - r."limit" + 1] > $2 - r.per_secs
       AND r.tenant <> ALL (ARRAY(SELECT tenant FROM qftrio_queue_pauses WHERE queue = $1))));

-- name: heartbeat
-- One statement, so one transaction, per batch. The current leases are
-- extended without being locked first (the guarded write of
-- transitions.heartbeat); the other items' rows are read as they stood, for
-- their outcome. Each row is found by one probe of the primary key, as in
-- complete. A row changed between the read and the write is left alone,
-- and undecided: the store decides it under its lock (heartbeat_lock).
WITH items AS (
    SELECT i.ord, i.id, i.token, i.extend, j.row, j.status, j.lease_token, j.over,
        coalesce(j.status = 'running' AND j.lease_token = i.token AND NOT j.over, false) AS current
    FROM unnest($1::uuid[], $2::uuid[], $3::float8[]) WITH ORDINALITY AS i(id, token, extend, ord)
    LEFT JOIN LATERAL (
        -- over: the attempt ran to its deadline (transitions.attempt_over)
        SELECT ctid AS row, status, lease_token, {attempt_over} AS over
        FROM qftrio_jobs WHERE id = i.id OFFSET 0
    ) AS j ON true
), extended AS (
    -- Never past the attempt's deadline (transitions.heartbeat).
    UPDATE qftrio_jobs AS j SET locked_until = least($4 + c.extend, j.deadline), updated_at = $4
    FROM items AS c
    WHERE j.ctid = ANY(ARRAY(SELECT row FROM items WHERE current))
      AND j.ctid = c.row AND j.status = c.status AND j.lease_token = c.token
    RETURNING c.ord, j.id, j.locked_until
)
-- Every row answers the status the probe read, which the store decides on
-- (transitions.heartbeat): 'running' under the token for those extended.
SELECT e.ord, e.id, true AS changed, e.locked_until, 'running' AS status, true AS current FROM extended AS e
UNION ALL
SELECT i.ord, i.id, false, NULL, i.status, coalesce(i.lease_token = i.token AND NOT i.over, false)
FROM items AS i
WHERE i.ord NOT IN (SELECT ord FROM extended);

-- name: progress
-- A batch of progress reports, one per lease: recorded on running jobs
-- under their current token, extending nothing (the guarded write of
-- transitions.progress, re-checked on the row's latest version should a
-- change commit meanwhile); every item answers the status its probe read.
WITH items AS (
    SELECT i.ord, i.id, i.token, i.progress, j.status,
        coalesce(j.lease_token = i.token AND NOT j.over, false) AS current
    FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) WITH ORDINALITY AS i(id, token, progress, ord)
    LEFT JOIN LATERAL (
        SELECT status, lease_token, {attempt_over} AS over
        FROM qftrio_jobs WHERE id = i.id OFFSET 0
    ) AS j ON true
), written AS (
    UPDATE qftrio_jobs AS j SET progress = c.progress, progress_at = $4, updated_at = $4
    FROM items AS c
    WHERE j.id = c.id AND c.current AND c.status = 'running' AND j.status = 'running' AND j.lease_token = c.token
    RETURNING c.ord
)
SELECT ord, status, current FROM items;

-- name: heartbeat_lock
-- The jobs of heartbeats the heartbeat statement could not decide (they
-- raced another change of their job), locked in id order: each row's
-- status, whether the token is current (attempt_over at $3) and the
-- attempt's deadline, which transitions.heartbeat decides on.
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[]) WITH ORDINALITY AS i(id, token, ord)
), locked AS (
    SELECT id, status, lease_token, deadline, coalesce(status = 'running' AND deadline <= $3, false) AS over
    FROM qftrio_jobs
    WHERE id = ANY($1::uuid[])
    ORDER BY id
    FOR UPDATE
)
SELECT i.ord, l.status, l.deadline, coalesce(l.lease_token = i.token AND NOT l.over, false) AS current
FROM items AS i
LEFT JOIN locked AS l ON l.id = i.id
ORDER BY i.ord;

-- name: heartbeat_write
-- Extend the leases heartbeat_lock locked to what transitions.heartbeat
-- decided (the rows are locked since: no guard but their ids).
UPDATE qftrio_jobs AS j SET locked_until = i.until, updated_at = $3
FROM unnest($1::uuid[], $2::float8[]) AS i(id, until)
WHERE j.id = ANY($1::uuid[]) AND j.id = i.id;

-- name: attempt_over
-- transitions.attempt_over of the row read, at $4: the job runs past its
-- attempt's deadline, so its token is no longer current for a heartbeat, a
-- completion or a snooze.
coalesce(status = 'running' AND deadline <= $4, false)

-- name: complete
-- One statement, so one transaction, per batch of jobs outside workflows:
-- the current leases are completed without being locked first (the guarded
-- write of transitions.complete), the other items' rows read as they stood.
-- A batch holding a workflow step completes nothing here: its steps, and
-- what the statement could not decide, go through complete_lock and
-- complete_write, which lock the steps' workflows first. A
-- job's workflow never changes, so telling them apart needs no lock.
WITH items AS (
    -- One primary key probe per item, whatever the planner estimates of the
    -- running jobs (OFFSET 0 keeps it from joining every running job instead).
    SELECT i.ord, i.token, i.result, j.row, j.status, j.lease_token, j.queue, j.workflow_id, j.over,
        coalesce(j.status = 'running' AND j.lease_token = i.token AND NOT j.over, false) AS current
    FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) WITH ORDINALITY AS i(id, token, result, ord)
    LEFT JOIN LATERAL (
        -- over: the attempt ran to its deadline (transitions.attempt_over)
        SELECT ctid AS row, status, lease_token, queue, workflow_id,
            {attempt_over} AS over
        FROM qftrio_jobs WHERE id = i.id OFFSET 0
    ) AS j ON true
), completed AS (
    -- The rows the probe read, by the addresses of the versions it read (a
    -- TID scan: no second probe, and no estimate makes it look dearer than
    -- reading the table). The guard compares with what the probe read, not
    -- with 'running', which would let the planner join the running jobs'
    -- index instead. A row changed since is left alone, and undecided: the
    -- probe read it running under the token, so the store decides it under
    -- its lock (complete_lock).
    UPDATE qftrio_jobs AS j SET status = 'completed', result = c.result, locked_until = NULL, updated_at = $4
    FROM items AS c
    WHERE j.ctid = ANY(ARRAY(SELECT row FROM items WHERE current))
      AND NOT (SELECT bool_or(workflow_id IS NOT NULL) FROM items)
      AND j.ctid = c.row AND j.status = c.status AND j.lease_token = c.token
    RETURNING c.ord, j.queue, j.kind, j.claimed_at, j.concurrency_key IS NOT NULL AS keyed
)
-- Every row answers the status the probe read, which the store decides on
-- (transitions.complete): 'running' under the token for those completed.
SELECT c.ord, c.queue, true AS applied, 'running' AS status, true AS current, false AS step, c.kind,
    c.claimed_at, c.keyed
FROM completed AS c
UNION ALL
SELECT i.ord, i.queue, false, i.status, coalesce(i.lease_token = i.token AND NOT i.over, false), i.workflow_id IS NOT NULL,
    NULL, NULL, false
FROM items AS i
WHERE i.ord NOT IN (SELECT ord FROM completed);

-- name: complete_lock
-- The jobs of a batch's items that complete could not decide (workflow
-- steps, and rows changed between its read and its write), locked in id
-- order after their workflows: each row's status and whether the token is
-- current (the token, and the attempt not over: attempt_over at $3), which
-- transitions.complete decides on.
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[]) WITH ORDINALITY AS i(id, token, ord)
), locked AS (
    SELECT id, status, lease_token, queue, coalesce(status = 'running' AND deadline <= $3, false) AS over
    FROM qftrio_jobs
    WHERE id = ANY($1::uuid[])
    ORDER BY id
    FOR UPDATE
)
SELECT i.ord, l.status, l.queue, coalesce(l.lease_token = i.token AND NOT l.over, false) AS current
FROM items AS i
LEFT JOIN locked AS l ON l.id = i.id
ORDER BY i.ord;

-- name: complete_write
-- Complete the jobs complete_lock locked and transitions.complete applied
-- ($3: each one's place in the batch). The rows are locked since their
-- decision: no guard but their ids (a filter on the status would let the
-- planner read the running jobs' index instead of probing each).
UPDATE qftrio_jobs AS j SET status = 'completed', result = i.result, locked_until = NULL, updated_at = $4
FROM unnest($1::uuid[], $2::jsonb[], $3::int[]) AS i(id, result, ord)
WHERE j.id = ANY($1::uuid[]) AND j.id = i.id
RETURNING i.ord, j.workflow_id, j.step, j.result, j.kind, j.claimed_at, j.concurrency_key IS NOT NULL AS keyed;

-- name: fail_lock
SELECT id, status, lease_token, queue, attempt, max_attempts, workflow_id, kind, claimed_at, backoff,
    deadline, timeout_secs, concurrency_key IS NOT NULL AS keyed FROM qftrio_jobs
WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE;

-- name: snooze
-- The guarded write of transitions.snooze, for the whole batch (its rows
-- locked by fail_lock): ids, tokens and the times the jobs are due again.
-- The token stays.
UPDATE qftrio_jobs AS j SET
    status = 'pending',
    scheduled_at = u.due,
    max_attempts = j.max_attempts + 1,
    locked_until = NULL,
    updated_at = $4,
    attempts = qftrio_attempt_end(j.attempts, j.attempt, j.worker_id, j.claimed_at, 'snoozed', NULL, $4)
FROM unnest($1::uuid[], $2::uuid[], $3::float8[]) AS u(id, token, due)
WHERE j.id = u.id AND j.status = 'running' AND j.lease_token = u.token
RETURNING j.queue;

-- name: fail
-- The guarded write of transitions.fail, for the whole batch (its rows
-- locked by fail_lock), each row found as in complete.
WITH items AS (
    SELECT u.*, j.row, j.was, coalesce(j.was = 'running' AND j.lease_token = u.token, false) AS current
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::text[])
        AS u(id, token, status, scheduled_at, error)
    LEFT JOIN LATERAL (
        SELECT ctid AS row, status AS was, lease_token FROM qftrio_jobs WHERE id = u.id OFFSET 0
    ) AS j ON true
)
UPDATE qftrio_jobs AS j SET
    status = u.status,
    scheduled_at = coalesce(u.scheduled_at, j.scheduled_at),
    locked_until = NULL,
    error = u.error,
    errors = j.errors || jsonb_build_array(
        jsonb_build_object('attempt', j.attempt, 'error', u.error, 'at', $6::float8)),
    attempts = qftrio_attempt_end(j.attempts, j.attempt, j.worker_id, j.claimed_at, 'failed', u.error, $6),
    updated_at = $6
FROM items AS u
WHERE j.ctid = ANY(ARRAY(SELECT row FROM items WHERE current))
    AND j.ctid = u.row AND j.status = u.was AND j.lease_token = u.token
RETURNING j.id, j.queue, j.status;

-- name: reap_lock_workflows
-- A step dead-lettered by the janitor fails its workflow, whose row must be
-- locked before the step's (the lock order): the workflows first, skipping
-- those busy elsewhere; their steps wait for the next round.
SELECT id FROM qftrio_workflows
WHERE id IN (SELECT workflow_id FROM qftrio_jobs
             WHERE status = 'running' AND locked_until < $1 AND attempt >= max_attempts
               AND workflow_id IS NOT NULL)
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: expired
-- The janitor's round, first expired first, skipping rows another server is
-- working on.
SELECT j.id, j.queue, j.kind, j.attempt, j.max_attempts, j.locked_until, j.workflow_id, j.step,
    coalesce(s.position, 0) AS position, j.deadline, j.timeout_secs, j.backoff, j.concurrency_key IS NOT NULL AS keyed
FROM qftrio_jobs AS j
LEFT JOIN qftrio_workflow_steps AS s ON s.workflow_id = j.workflow_id AND s.name = j.step
WHERE j.status = 'running' AND j.locked_until < $1
  AND (j.workflow_id IS NULL OR j.attempt < j.max_attempts OR j.workflow_id = ANY($3::uuid[]))
ORDER BY j.locked_until
LIMIT $2
FOR UPDATE OF j SKIP LOCKED;

-- name: reap
-- The janitor takes the jobs back as transitions.reap decided: their tokens
-- go stale, their worker_id stays; a timed-out job retried is due at $5's time.
-- Each running attempt ends as $6 says (timed_out or lost).
UPDATE qftrio_jobs AS j SET
    status = u.status,
    locked_until = NULL,
    lease_token = NULL,
    error = u.error,
    errors = j.errors || jsonb_build_array(
        jsonb_build_object('attempt', j.attempt, 'error', u.error, 'at', $4::float8)),
    attempts = qftrio_attempt_end(j.attempts, j.attempt, j.worker_id, j.claimed_at, u.outcome, u.error, $4),
    scheduled_at = coalesce(u.retry_at, j.scheduled_at),
    updated_at = $4
FROM unnest($1::uuid[], $2::text[], $3::text[], $5::float8[], $6::text[]) AS u(id, status, error, retry_at, outcome)
WHERE j.id = u.id AND j.status = 'running' AND j.locked_until < $4;

-- name: prune_jobs
-- A workflow's jobs go only with the whole workflow.
WITH doomed AS (
    SELECT id FROM qftrio_jobs
    WHERE status IN ('completed', 'cancelled') AND updated_at < $1 AND workflow_id IS NULL
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM qftrio_jobs WHERE id IN (SELECT id FROM doomed) RETURNING 1;

-- name: prune_finished_workflows
-- Completed or cancelled workflows go whole; failed ones stay, like dead letters.
SELECT id FROM qftrio_workflows
WHERE status IN ('completed', 'cancelled') AND updated_at < $1
ORDER BY updated_at
LIMIT 100
FOR UPDATE SKIP LOCKED;

-- name: prune_workflow_jobs
DELETE FROM qftrio_jobs WHERE workflow_id = $1 RETURNING 1;

-- name: prune_workflow_edges
-- They go with their workflow (ON DELETE CASCADE).

-- name: prune_workflow_steps
-- They go with their workflow (ON DELETE CASCADE).

-- name: prune_workflow_collects
-- They go with their workflow (ON DELETE CASCADE).

-- name: prune_workflow
-- Its steps and edges go with it (ON DELETE CASCADE).
DELETE FROM qftrio_workflows WHERE id = $1;

-- name: job_workflow
SELECT workflow_id FROM qftrio_jobs WHERE id = $1 AND tenant = $2;

-- name: workflow_lock
SELECT 1 FROM qftrio_workflows WHERE id = $1 FOR UPDATE;

-- name: job_lock_status
SELECT status FROM qftrio_jobs WHERE id = $1 AND tenant = $2 FOR UPDATE;

-- name: job_cancel
-- The lease token stays: a late heartbeat of the running attempt must
-- still be told "cancelled", not "conflict". The deadline goes: the job
-- is not running. A running attempt ends as cancelled.
UPDATE qftrio_jobs SET status = 'cancelled', locked_until = NULL, updated_at = $2,
    attempts = CASE WHEN status = 'running' THEN qftrio_attempt_end(attempts, attempt, worker_id, claimed_at, 'cancelled', NULL, $2) ELSE attempts END
WHERE id = $1 AND status IN ('pending', 'running')
RETURNING {job_columns};

-- name: job_reset
UPDATE qftrio_jobs SET status = 'pending', attempt = 0, scheduled_at = $2, updated_at = $2,
    locked_until = NULL, lease_token = NULL
WHERE id = $1 AND status IN ('failed', 'cancelled')
RETURNING {job_columns};

-- name: failed_step
SELECT step, id FROM qftrio_jobs WHERE workflow_id = $1 AND status = 'failed' ORDER BY updated_at, id LIMIT 1;

-- name: queue_times
-- The times of the stats of each queue p (p.tenant, p.queue) at $1: one
-- probe of an index each; the next lease walks the queue's running jobs,
-- whose number the workers bound. A rate limit with no unit left that holds
-- back ready jobs of the queue makes them available when its next unit frees.
(SELECT j.scheduled_at FROM qftrio_jobs AS j
     WHERE j.tenant = p.tenant AND j.queue = p.queue AND j.status = 'pending' AND j.scheduled_at <= $1
     ORDER BY j.scheduled_at LIMIT 1) AS oldest_ready_at,
    least(
        (SELECT j.scheduled_at FROM qftrio_jobs AS j
         WHERE j.tenant = p.tenant AND j.queue = p.queue AND j.status = 'pending' AND j.scheduled_at > $1
         ORDER BY j.scheduled_at LIMIT 1),
        (SELECT min(j.locked_until) FROM qftrio_jobs AS j
         WHERE j.queue = p.queue AND j.status = 'running' AND j.tenant = p.tenant),
        (SELECT min(r.next_at) FROM spent AS r CROSS JOIN LATERAL (
            SELECT 1 FROM qftrio_jobs AS j
            WHERE j.tenant = r.tenant AND j.rate_limit = r.name AND j.queue = p.queue AND j.status = 'pending'
              AND j.scheduled_at <= $1
            LIMIT 1) AS h
         WHERE r.tenant = p.tenant)) AS next_available_at,
    -- the pending jobs whose time has not come, counted up to models.MAX_SCHEDULED_COUNT
    (SELECT count(*) FROM (
        SELECT 1 FROM qftrio_jobs AS j
        WHERE j.tenant = p.tenant AND j.queue = p.queue AND j.status = 'pending' AND j.scheduled_at > $1
        LIMIT 10000) AS s) AS scheduled,
    -- the ready jobs held back by a concurrency key at its limit (one range
    -- of qftrio_jobs_concurrency_pending_idx per key with running jobs), and
    -- by a rate limit with no unit left (one range of
    -- qftrio_jobs_rate_pending_idx per such limit), each counted up to
    -- models.MAX_SCHEDULED_COUNT
    (SELECT count(*) FROM (
        SELECT 1 FROM held_keys AS k CROSS JOIN LATERAL (
            SELECT 1 FROM qftrio_jobs AS j
            WHERE j.tenant = k.tenant AND j.concurrency_key = k.key AND j.queue = p.queue AND j.status = 'pending'
              AND j.scheduled_at <= $1 AND j.concurrency_limit <= k.running
            LIMIT 10000) AS h
        WHERE k.tenant = p.tenant LIMIT 10000) AS s) AS held_concurrency,
    (SELECT count(*) FROM (
        SELECT 1 FROM spent AS r CROSS JOIN LATERAL (
            SELECT 1 FROM qftrio_jobs AS j
            WHERE j.tenant = r.tenant AND j.rate_limit = r.name AND j.queue = p.queue AND j.status = 'pending'
              AND j.scheduled_at <= $1
            LIMIT 10000) AS h
        WHERE r.tenant = p.tenant LIMIT 10000) AS s) AS held_rate_limit

-- name: held_back
-- What queue_times weighs held-back jobs by, once per statement: the
-- concurrency keys with running jobs (found from the running jobs, whose
-- number the workers bound) and their running counts, and the rate limits
-- with no unit left at $1 (their stamps are kept oldest first, so the
-- "limit"-th newest decides) with the time their next unit frees. Both are
-- MATERIALIZED: read once, not once per queue (a CTE named once would be
-- inlined into queue_times' subquery and walk the running jobs per queue).
held_keys AS MATERIALIZED (
    SELECT r.tenant, r.key, k.running
    FROM (SELECT DISTINCT tenant, concurrency_key AS key FROM qftrio_jobs
          WHERE status = 'running' AND concurrency_key IS NOT NULL) AS r
    CROSS JOIN LATERAL (
        SELECT running FROM qftrio_concurrency_running AS k WHERE k.tenant = r.tenant AND k.key = r.key OFFSET 0
    ) AS k
), spent AS MATERIALIZED (
    SELECT tenant, name, stamps[cardinality(stamps) - "limit" + 1] + per_secs AS next_at FROM qftrio_rate_limits
    WHERE cardinality(stamps) >= "limit" AND stamps[cardinality(stamps) - "limit" + 1] > $1 - per_secs
)

-- name: queues_stats
-- The queues with jobs (counts from the ledger) or paused, of every tenant
-- or of those "{where}" names ($2, $3), and per queue one probe of an index
-- for each time; the next lease walks the queue's running jobs, whose number
-- the workers bound.
-- Counts and pauses are joined to the pairs (hash joins), not looked up in
-- the CTEs per pair, which would be quadratic in the number of queues.
WITH {held_back}, counts AS (
    SELECT tenant, queue, jsonb_object_agg(status, n) AS counts FROM (
        SELECT tenant, queue, status, sum(n) AS n FROM qftrio_job_counts WHERE true {where}
        GROUP BY tenant, queue, status HAVING sum(n) <> 0
    ) AS s GROUP BY tenant, queue
), paused AS (
    SELECT tenant, queue FROM qftrio_queue_pauses WHERE true {where}
), pairs AS (
    SELECT tenant, queue FROM counts UNION SELECT tenant, queue FROM paused
)
SELECT p.tenant, p.queue,
    coalesce(c.counts, '{{}}'::jsonb) AS counts,
    x.queue IS NOT NULL AS paused,
    {queue_times}
FROM pairs AS p
LEFT JOIN counts AS c ON c.tenant = p.tenant AND c.queue = p.queue
LEFT JOIN paused AS x ON x.tenant = p.tenant AND x.queue = p.queue
ORDER BY p.queue COLLATE "C", p.tenant COLLATE "C";

-- name: queues_page
-- The stats of a page of a tenant's ($2) queues with jobs or paused, named
-- after $3, at $1, by name (in the database's order of text): O($4) probes
-- of indexes, however many queues the tenant has. The names with jobs are
-- walked one index probe each (qftrio_job_counts_idx), skipping those whose
-- ledger rows sum to nothing, and merged with the paused ones
-- (qftrio_queue_pauses_tenant_idx of migration 0012); then each name's
-- counts, pause and times are probes of their own.
WITH RECURSIVE {held_back}, counted AS (
    (SELECT queue FROM qftrio_job_counts WHERE tenant = $2 AND queue > $3 ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT c.queue FROM qftrio_job_counts AS c WHERE c.tenant = $2 AND c.queue > w.queue
            ORDER BY c.queue LIMIT 1)
    FROM counted AS w WHERE w.queue IS NOT NULL
), names AS (
    SELECT queue FROM (
        (SELECT queue FROM counted AS w WHERE queue IS NOT NULL
            AND (SELECT sum(c.n) FROM qftrio_job_counts AS c WHERE c.tenant = $2 AND c.queue = w.queue) <> 0
         LIMIT $4)
        UNION
        (SELECT queue FROM qftrio_queue_pauses WHERE tenant = $2 AND queue > $3 ORDER BY queue LIMIT $4)
    ) AS u
    ORDER BY queue LIMIT $4
)
SELECT p.queue,
    coalesce((SELECT jsonb_object_agg(status, n) FROM (
        SELECT status, sum(n) AS n FROM qftrio_job_counts AS c WHERE c.tenant = p.tenant AND c.queue = p.queue
        GROUP BY status HAVING sum(n) <> 0) AS s), '{}'::jsonb) AS counts,
    EXISTS (SELECT FROM qftrio_queue_pauses AS x WHERE x.tenant = p.tenant AND x.queue = p.queue) AS paused,
    {queue_times}
FROM (SELECT $2::text AS tenant, queue FROM names) AS p
ORDER BY p.queue;

-- name: jobs_scheduled
-- The tenant's jobs whose time has not come, next to run first: the queues
-- holding pending jobs from the ledger, one range of
-- qftrio_jobs_pending_tenant_idx each ($3: one queue, or all).
WITH queues AS (
    SELECT queue FROM qftrio_job_counts
    WHERE tenant = $1 AND status = 'pending' AND ($3::text IS NULL OR queue = $3)
    GROUP BY queue HAVING sum(n) > 0
)
SELECT j.* FROM queues AS q CROSS JOIN LATERAL (
    SELECT {job_columns}
    FROM qftrio_jobs
    WHERE tenant = $1 AND queue = q.queue AND status = 'pending' AND scheduled_at > $2
    ORDER BY scheduled_at
    LIMIT $4
) AS j
ORDER BY j.scheduled_at, j.id
LIMIT $4;

-- name: counts_fold
-- Sums the ledger rows of each combination that has several into one (the
-- others are left alone, so an idle ledger is not rewritten). Rows another
-- server's fold deleted meanwhile are skipped by this one (it waits for that
-- fold, then finds them gone), so nothing is counted twice; appends
-- committed after this statement began are left for the next fold.
WITH many AS (
    SELECT tenant, queue, kind, status FROM qftrio_job_counts
    GROUP BY tenant, queue, kind, status HAVING count(*) > 1
), gone AS (
    DELETE FROM qftrio_job_counts AS l USING many AS m
    WHERE l.tenant = m.tenant AND l.queue = m.queue AND l.kind = m.kind AND l.status = m.status
    RETURNING l.tenant, l.queue, l.kind, l.status, l.n
)
INSERT INTO qftrio_job_counts (tenant, queue, kind, status, n)
SELECT tenant, queue, kind, status, sum(n) FROM gone GROUP BY tenant, queue, kind, status HAVING sum(n) <> 0;

-- name: queue_pause
INSERT INTO qftrio_queue_pauses (queue, tenant, paused_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING;

-- name: queue_resume
-- Inside the caller's transaction, so other servers' long polls look again
-- once it commits.
WITH resumed AS (DELETE FROM qftrio_queue_pauses WHERE queue = $1 AND tenant = $2 RETURNING queue)
SELECT pg_notify($3, $1);

-- name: bulk_lock
-- A bulk batch's jobs, locked in id order (their workflows locked before).
SELECT id, status, queue, workflow_id FROM qftrio_jobs WHERE id = ANY($1::uuid[]) AND tenant = $2
ORDER BY id FOR UPDATE;

-- name: bulk_workflow_statuses
SELECT id, status FROM qftrio_workflows WHERE id = ANY($1::uuid[]);

-- name: bulk_cancel
-- As job_cancel, for a batch.
UPDATE qftrio_jobs SET status = 'cancelled', locked_until = NULL, updated_at = $2,
    attempts = CASE WHEN status = 'running' THEN qftrio_attempt_end(attempts, attempt, worker_id, claimed_at, 'cancelled', NULL, $2) ELSE attempts END
WHERE id = ANY($1::uuid[]) AND status IN ('pending', 'running')
RETURNING id, workflow_id, concurrency_key IS NOT NULL AS keyed;

-- name: bulk_reset
-- As job_reset, for a batch.
UPDATE qftrio_jobs SET status = 'pending', attempt = 0, scheduled_at = $2, updated_at = $2,
    locked_until = NULL, lease_token = NULL
WHERE id = ANY($1::uuid[]) AND status IN ('failed', 'cancelled')
RETURNING queue;

-- name: bulk_delete
DELETE FROM qftrio_jobs
WHERE id = ANY($1::uuid[]) AND status IN ('completed', 'failed', 'cancelled') AND workflow_id IS NULL;

-- name: bulk_after
-- A bulk batch's jobs by status once it is done: what it changed.
SELECT status, count(*) AS n FROM qftrio_jobs WHERE id = ANY($1::uuid[]) GROUP BY status;

-- name: workers
-- A row per running job of tenant $1 (the partial index walks the running
-- jobs, whose number the workers bound) with its holder and latest claim or
-- heartbeat, and one per worker seen leasing since $2 a queue that holds
-- jobs of the tenant (the ledger's sum) or that it paused (sightings the
-- servers cap).
SELECT worker_id, queue, id::text AS job_id, updated_at AS seen FROM qftrio_jobs
WHERE status = 'running' AND tenant = $1 AND worker_id IS NOT NULL
UNION ALL
SELECT s.worker_id, s.queue, NULL, s.seen_at FROM qftrio_worker_sightings AS s
WHERE s.seen_at >= $2 AND (
    (SELECT sum(c.n) FROM qftrio_job_counts AS c WHERE c.tenant = $1 AND c.queue = s.queue) > 0
    OR EXISTS (SELECT 1 FROM qftrio_queue_pauses AS p WHERE p.queue = s.queue AND p.tenant = $1));

-- name: workers_seen
-- $1, $2: the workers' ids and queues, seen at $3. Sorted, so that two
-- servers writing the same pairs lock them in the same order.
INSERT INTO qftrio_worker_sightings (worker_id, queue, seen_at)
SELECT w, q, $3 FROM unnest($1::text[], $2::text[]) AS u(w, q) ORDER BY w, q
ON CONFLICT (worker_id, queue) DO UPDATE SET seen_at = greatest(qftrio_worker_sightings.seen_at, excluded.seen_at);

-- name: sightings_purge
DELETE FROM qftrio_worker_sightings WHERE seen_at < $1;

-- name: session_create
INSERT INTO qftrio_dashboard_sessions (key, tenant, secret, token_mac, created_at, idle_until, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: session_get
SELECT tenant, secret, token_mac, created_at, idle_until, expires_at FROM qftrio_dashboard_sessions
WHERE key = $1 AND idle_until > $2;

-- name: session_touch
UPDATE qftrio_dashboard_sessions SET idle_until = least($2, expires_at) WHERE key = $1;

-- name: session_delete
DELETE FROM qftrio_dashboard_sessions WHERE key = $1;

-- name: sessions_purge
DELETE FROM qftrio_dashboard_sessions WHERE idle_until <= $1;

-- name: lock_workflows_of_jobs
-- One probe of the primary key per job (OFFSET 0 keeps the planner from
-- reading every workflow step's job instead, which an estimate of few steps
-- makes look cheap), then one of the workflows' per workflow.
SELECT id FROM qftrio_workflows
WHERE id = ANY(ARRAY(
    SELECT s.workflow_id FROM unnest($1::uuid[]) AS u(id)
    CROSS JOIN LATERAL (SELECT workflow_id FROM qftrio_jobs WHERE id = u.id OFFSET 0) AS s
    WHERE s.workflow_id IS NOT NULL
))
ORDER BY id
FOR UPDATE;

-- name: enqueue_steps
-- $7 holds a new job id for each name of $2. Marks the steps too.
-- The steps are found by their key (name = ANY), whatever the generic plan
-- guesses of the workflow's size: else it may walk all its steps for each.
WITH ready AS (
    SELECT s.name, s.kind, s.payload, s.max_attempts, s.position, n.job_id
    FROM qftrio_workflow_steps AS s
    JOIN unnest($2::text[], $7::uuid[]) AS n(name, job_id) ON n.name = s.name
    WHERE s.workflow_id = $1 AND s.name = ANY($2::text[]) AND s.state = 'waiting'
), inserted AS (
    INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts,
        scheduled_at, created_at, updated_at, workflow_id, step, context)
    SELECT job_id, $3, $4, kind, payload, 'pending', 0, 0, max_attempts, $5, $5, $5, $1, name, $6::jsonb
    FROM ready ORDER BY position
    RETURNING 1
)
UPDATE qftrio_workflow_steps AS s SET state = 'enqueued', job_id = r.job_id
FROM ready AS r
WHERE s.workflow_id = $1 AND s.name = r.name;

-- name: steps_enqueued
-- enqueue_steps marks them.

-- name: workflow_step_completed
UPDATE qftrio_workflows SET context = context || $2::jsonb, steps_completed = steps_completed + 1, updated_at = $3
WHERE id = $1
RETURNING tenant, status, context, steps_total, steps_completed;

-- name: steps_unblock
-- The steps waiting for a completed one, their count lowered.
-- Their names are read first, as an array, so that the steps are found by
-- their key whatever the generic plan guesses of how many there are (a
-- guess of a few, for a step waited on by thousands, would walk every step
-- of the workflow for each).
UPDATE qftrio_workflow_steps SET remaining = remaining - 1
WHERE workflow_id = $1
  AND name = ANY(ARRAY(SELECT dependent FROM qftrio_workflow_edges WHERE workflow_id = $1 AND step = $2))
RETURNING position, name, remaining, state;

-- name: step_collected
-- A completed step's collect key (migration 0020), its count lowered.
UPDATE qftrio_workflow_collects SET remaining = remaining - 1
WHERE workflow_id = $1 AND key = (SELECT collect FROM qftrio_workflow_steps WHERE workflow_id = $1 AND name = $2)
RETURNING key, remaining;

-- name: collect_write
-- The results of the steps collected under $2, in the order added, as a
-- list under that key of the context.
UPDATE qftrio_workflows SET context = context || jsonb_build_object($2::text, (
    SELECT coalesce(jsonb_agg(coalesce(j.result, '{}'::jsonb) ORDER BY s.position), '[]'::jsonb)
    FROM qftrio_workflow_steps AS s JOIN qftrio_jobs AS j ON j.id = s.job_id
    WHERE s.workflow_id = $1 AND s.collect = $2)), updated_at = $3
WHERE id = $1
RETURNING context;

-- name: workflow_complete
UPDATE qftrio_workflows SET status = 'completed' WHERE id = $1;

-- name: workflow_end
UPDATE qftrio_workflows SET status = $2, updated_at = $3 WHERE id = $1 AND status = 'running' RETURNING 1;

-- name: workflow_jobs_cancel
-- The lease token stays, as for any cancel: a late heartbeat of a running
-- step is told "cancelled"; its attempt ends as cancelled.
UPDATE qftrio_jobs SET status = 'cancelled', locked_until = NULL, updated_at = $2,
    attempts = CASE WHEN status = 'running' THEN qftrio_attempt_end(attempts, attempt, worker_id, claimed_at, 'cancelled', NULL, $2) ELSE attempts END
WHERE workflow_id = $1 AND status IN ('pending', 'running');

-- name: workflow_steps_cancel
UPDATE qftrio_workflow_steps SET state = 'cancelled' WHERE workflow_id = $1 AND state = 'waiting';

-- name: workflow_resume
UPDATE qftrio_workflows SET status = 'running', updated_at = $2 WHERE id = $1 RETURNING tenant, context;

-- name: workflow_jobs_resume
-- The failed step and those cancelled by the failure: their dependencies
-- had completed, so they are ready again at once.
UPDATE qftrio_jobs SET status = 'pending', attempt = 0, scheduled_at = $3, updated_at = $3,
    context = $4::jsonb, locked_until = NULL, lease_token = NULL
WHERE workflow_id = $1 AND (status = 'cancelled' OR id = $2);

-- name: workflow_steps_wait_again
UPDATE qftrio_workflow_steps SET state = 'waiting' WHERE workflow_id = $1 AND state = 'cancelled'
RETURNING position, name, remaining;

-- name: workflow_status
SELECT status FROM qftrio_workflows WHERE id = $1;

-- name: workflow_owned_lock
SELECT status FROM qftrio_workflows WHERE id = $1 AND tenant = $2 FOR UPDATE;

-- name: workflow_get
SELECT id, tenant, name, status, context, created_at, updated_at FROM qftrio_workflows WHERE id = $1;

-- name: workflows_page
-- The keys of a page, after the key ($3, $4) of the previous page's last
-- workflow, if any.
SELECT created_at, id FROM qftrio_workflows
WHERE tenant = $1 AND ($2::text IS NULL OR status = $2)
    AND (created_at, id) < (coalesce($3::float8, 'infinity'), coalesce($4::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
ORDER BY created_at DESC, id DESC LIMIT $5;

-- name: workflow_bytes
-- What each workflow of a page takes on the wire without its steps' jobs,
-- about, as job_bytes reckons a job's: its context, and each step's payload,
-- dependencies and names.
SELECT w.id, 512 + octet_length(w.context::text) + coalesce((
    SELECT sum(256 + octet_length(s.payload::text) + octet_length(s.depends_on::text) + octet_length(s.name)
        + octet_length(s.kind))
    FROM qftrio_workflow_steps AS s WHERE s.workflow_id = w.id), 0)
FROM qftrio_workflows AS w WHERE w.id = ANY($1::uuid[]);

-- name: workflows_by_ids
SELECT id, tenant, name, status, context, created_at, updated_at FROM qftrio_workflows WHERE id = ANY($1::uuid[]);

-- name: steps_of_workflows
SELECT workflow_id, name, kind, payload, depends_on, max_attempts, state, job_id, added_by
FROM qftrio_workflow_steps WHERE workflow_id = ANY($1::uuid[]) ORDER BY workflow_id, position;

-- name: jobs_of_workflows
SELECT {job_columns}
FROM qftrio_jobs WHERE workflow_id = ANY($1::uuid[]);

-- name: job_statuses_of_workflows
SELECT id, status FROM qftrio_jobs WHERE workflow_id = ANY($1::uuid[]);

-- name: workflow_insert
INSERT INTO qftrio_workflows (id, tenant, name, status, context, steps_total, steps_completed, created_at, updated_at)
VALUES ($1, $2, $3, 'running', $4::jsonb, $5, 0, $6, $6);

-- name: workflow_step_insert
INSERT INTO qftrio_workflow_steps (workflow_id, name, position, kind, payload, depends_on, max_attempts, state,
    remaining, job_id)
VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8, $9, $10);

-- name: workflow_edge_insert
INSERT INTO qftrio_workflow_edges (workflow_id, step, dependent) VALUES ($1, $2, $3);

-- Steps added at run time (changes.steps_add, migration 0020).

-- name: step_of_job
SELECT workflow_id, step FROM qftrio_jobs WHERE id = $1;

-- name: step_lease
SELECT status, coalesce(lease_token::text = $2::text, false) FROM qftrio_jobs WHERE id = $1 FOR UPDATE;

-- name: steps_named
-- The steps of these names, each with its job's status.
SELECT s.name, s.kind, s.payload, s.depends_on, s.max_attempts, s.added_by, s.collect, j.status
FROM qftrio_workflow_steps AS s LEFT JOIN qftrio_jobs AS j ON j.id = s.job_id
WHERE s.workflow_id = $1 AND s.name = ANY($2::text[]);

-- name: workflow_steps_total
SELECT steps_total, steps_added FROM qftrio_workflows WHERE id = $1;

-- name: step_dependents
-- The steps waiting for $2, but for those it added itself.
SELECT e.dependent FROM qftrio_workflow_edges AS e
JOIN qftrio_workflow_steps AS s ON s.workflow_id = e.workflow_id AND s.name = e.dependent
WHERE e.workflow_id = $1 AND e.step = $2 AND s.added_by IS DISTINCT FROM $2 ORDER BY e.dependent;

-- name: collect_owner
SELECT added_by FROM qftrio_workflow_collects WHERE workflow_id = $1 AND key = $2;

-- name: added_step_insert
INSERT INTO qftrio_workflow_steps (workflow_id, name, position, kind, payload, depends_on, max_attempts, state,
    remaining, job_id, added_by, collect)
VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, 'waiting', $8, NULL, $9, $10);

-- name: steps_wait_more
UPDATE qftrio_workflow_steps SET remaining = remaining + $3
WHERE workflow_id = $1 AND name = ANY($2::text[]);

-- name: workflow_grow
UPDATE qftrio_workflows SET steps_total = steps_total + $2, steps_added = steps_added + $2, updated_at = $3 WHERE id = $1;

-- name: collect_add
INSERT INTO qftrio_workflow_collects AS c (workflow_id, key, added_by, remaining) VALUES ($1, $2, $3, $4)
ON CONFLICT (workflow_id, key) DO UPDATE SET remaining = c.remaining + excluded.remaining;

-- name: step_job_insert
INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts, scheduled_at,
    created_at, updated_at, workflow_id, step, context)
VALUES ($1, $2, $3, $4, $5::jsonb, 'pending', 0, 0, $6, $7, $7, $7, $8, $9, $10::jsonb);


-- Cron schedules (docs/schedules.md; store/changes.py, "schedules").

-- name: schedule_columns
-- A schedule's columns, in the order of the fields of qftrio.models.Schedule.
name, tenant, cron, timezone, job, paused, catch_up, next_run_at, last_run_at, last_job_id, created_at, updated_at

-- name: schedule_get
SELECT {schedule_columns} FROM qftrio_schedules WHERE tenant = $1 AND name = $2;

-- name: schedule_lock
SELECT cron, timezone, paused, next_run_at FROM qftrio_schedules WHERE tenant = $1 AND name = $2 FOR UPDATE;

-- name: schedule_upsert
INSERT INTO qftrio_schedules AS s (tenant, name, cron, timezone, job, paused, catch_up, next_run_at, created_at,
    updated_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $9)
ON CONFLICT (tenant, name) DO UPDATE SET cron = $3, timezone = $4, job = $5::jsonb, paused = $6, catch_up = $7,
    next_run_at = $8, updated_at = $9
RETURNING {schedule_columns};

-- name: schedules_page
SELECT {schedule_columns} FROM qftrio_schedules
WHERE tenant = $1 AND ($2::text IS NULL OR name > $2) ORDER BY name LIMIT $3;

-- name: schedule_delete
DELETE FROM qftrio_schedules WHERE tenant = $1 AND name = $2 RETURNING name;

-- name: schedule_ticks_delete
DELETE FROM qftrio_schedule_ticks WHERE tenant = $1 AND schedule = $2;

-- name: schedule_set_paused
UPDATE qftrio_schedules SET paused = $3, next_run_at = $4, updated_at = $5
WHERE tenant = $1 AND name = $2
RETURNING {schedule_columns};

-- name: schedules_due
-- A round's due schedules, from qftrio_schedules_due_idx; those another
-- server is firing are skipped (it advances them).
SELECT tenant, name, cron, timezone, job, catch_up, next_run_at FROM qftrio_schedules
WHERE next_run_at <= $1
ORDER BY next_run_at
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: schedule_ticks_claim
-- The ticks this transaction wins (tenant, schedule, tick: parallel
-- arrays): one whose row exists was fired already.
INSERT INTO qftrio_schedule_ticks (tenant, schedule, tick, created_at)
SELECT t.tenant, t.schedule, t.tick, $4 FROM unnest($1::text[], $2::text[], $3::float8[]) AS t(tenant, schedule, tick)
ON CONFLICT DO NOTHING
RETURNING tenant, schedule, tick;

-- name: schedule_advance
-- Each schedule of the batch (tenant, name, next run, last run, last job:
-- parallel arrays) moved on, in one statement.
UPDATE qftrio_schedules AS s SET next_run_at = u.next_run_at, last_run_at = coalesce(u.last_run_at, s.last_run_at),
    last_job_id = coalesce(u.last_job_id, s.last_job_id), updated_at = $6
FROM unnest($1::text[], $2::text[], $3::float8[], $4::float8[], $5::uuid[])
    AS u(tenant, name, next_run_at, last_run_at, last_job_id)
WHERE s.tenant = u.tenant AND s.name = u.name;

-- name: schedule_ticks_prune
-- Ticks before each schedule's first unfired one (parallel arrays): no
-- round can try them again.
DELETE FROM qftrio_schedule_ticks AS k
USING unnest($1::text[], $2::text[], $3::float8[]) AS u(tenant, schedule, tick)
WHERE k.tenant = u.tenant AND k.schedule = u.schedule AND k.tick < u.tick;

-- name: job_wait_begin
-- A wait parked on a job (migration 0018), and those whose server died
-- before removing theirs, past their time, removed. The job's row is locked
-- (FOR SHARE) while the wait's row goes in: a change of the job that began
-- first commits before, and the wait reads it next; one that comes after
-- waits for this commit, so its trigger sees the wait and notifies.
WITH job AS (SELECT id FROM qftrio_jobs WHERE id = $2 FOR SHARE),
    gone AS (DELETE FROM qftrio_job_waits WHERE until < $3)
INSERT INTO qftrio_job_waits (id, job_id, until) SELECT $1, id, $3 + $4 FROM job;

-- name: job_wait_end
DELETE FROM qftrio_job_waits WHERE id = $1;

-- name: events_begin
-- An event stream of a tenant's (migration 0021), and those whose server
-- died before removing theirs, past their time, removed.
WITH gone AS (DELETE FROM qftrio_event_streams WHERE until < $3)
INSERT INTO qftrio_event_streams (id, tenant, until) VALUES ($1, $2, $4);

-- name: events_renew
UPDATE qftrio_event_streams SET until = $2 WHERE id = $1;

-- name: events_end
DELETE FROM qftrio_event_streams WHERE id = $1;
