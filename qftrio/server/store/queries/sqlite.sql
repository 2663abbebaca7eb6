-- The embedded store's statements (qftrio.server.store.sqlite), by name.
-- "{marks}" stands for a list of "?" the length of a batch, filled in at run time.
-- A statement of store/changes.py takes an array as JSON text: json_each(?1) reads
-- it, and json_extract(?2, '$[' || i.key || ']') the same item of a parallel one
-- (joining two json_each on their keys would read one whole for each item of the other).

-- name: job_columns
-- A job's columns, in the order of the fields of qftrio.models.Job, which
-- sqlite._row_to_job reads them in (tests/test_store_sql.py checks it).
id, tenant, queue, kind, payload, status, priority, attempt, max_attempts, scheduled_at, created_at,
    updated_at, locked_until, worker_id, result, error, errors, workflow_id, step, context, timeout_secs, backoff, headers,
    schedule, concurrency, rate_limit, "unique", progress, progress_at, attempts,
    -- beyond Job's fields: the last attempt's claim (models.attempt_history)
    claimed_at

-- name: job_bytes
-- What each job of a page takes on the wire, about (changes.fitting): the
-- stored length of its variable columns, in bytes (JSON is kept as the text
-- the answer writes), twice that of its error (which the answer escapes),
-- 1 KiB for its names and fixed fields, and the attempt read from the row
-- of a running or completed job. Counted without loading the job; a
-- column added to job_columns that can be long belongs here too.
SELECT id, 1024 + length(CAST(payload AS BLOB)) + coalesce(length(CAST(result AS BLOB)), 0)
    + coalesce(length(CAST(context AS BLOB)), 0) + length(CAST(errors AS BLOB))
    + 2 * coalesce(length(CAST(error AS BLOB)), 0) + coalesce(length(CAST(worker_id AS BLOB)), 0)
    + coalesce(length(CAST(step AS BLOB)), 0) + coalesce(length(CAST(headers AS BLOB)), 0)
    + coalesce(length(CAST(concurrency AS BLOB)), 0) + coalesce(length(CAST("unique" AS BLOB)), 0)
    + coalesce(length(CAST(progress AS BLOB)), 0) + length(CAST(attempts AS BLOB))
    + CASE WHEN status IN ('running', 'completed') THEN 192 + coalesce(length(CAST(worker_id AS BLOB)), 0) ELSE 0 END
FROM jobs WHERE id IN (SELECT value FROM json_each(?1));

-- name: job_get
SELECT {job_columns}
FROM jobs WHERE id = ?;

-- name: job_by_idempotency_key
SELECT {job_columns}
FROM jobs WHERE tenant = ? AND idempotency_key = ?;

-- name: job_insert
-- The job's id, then NewJob's fields in their order (base.new_job_row), then
-- the insert's time (tests/test_store_sql.py).
INSERT INTO jobs (id, tenant, queue, kind, payload, priority, max_attempts, scheduled_at,
    idempotency_key, workflow_id, step, context, timeout_secs, backoff, headers, schedule,
    concurrency, concurrency_key, concurrency_limit, rate_limit, "unique", unique_key,
    status, attempt, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
    ?17, json_extract(?17, '$.key'), json_extract(?17, '$.limit'), ?18, ?19, json_extract(?19, '$.key'),
    'pending', 0, ?20, ?20);

-- name: job_by_unique_key
-- The tenant's newest job with the unique key in one of the statuses (?3, a
-- JSON array) created after ?4.
SELECT {job_columns}
FROM jobs INDEXED BY jobs_unique
WHERE tenant = ?1 AND unique_key = ?2 AND created_at > ?4 AND status IN (SELECT value FROM json_each(?3))
ORDER BY created_at DESC LIMIT 1;

-- name: reports_of
-- What a report batch decides on: each job's state and current token.
SELECT id, status, lease_token, queue, attempt, max_attempts, workflow_id, step, kind, claimed_at, deadline,
    concurrency_key IS NOT NULL AS keyed
FROM jobs WHERE id IN ({marks});

-- name: paused_tenants
-- The tenants that paused a queue: claims leave out their jobs of it.
SELECT tenant FROM queue_pauses WHERE queue = ?;

-- name: claim_tenants
-- The tenants with pending jobs on a queue (some may be scheduled ahead),
-- from the counts the triggers of migration 0003 keep.
SELECT DISTINCT tenant FROM job_counts WHERE queue = ? AND status = 'pending' AND n > 0;

-- name: claim_ready
-- A tenant's ready jobs of a queue, in lease order: its share of a lease.
-- A job whose concurrency key is at its limit is held back, and the walk
-- goes on past it.
SELECT id, tenant, priority, scheduled_at, created_at, concurrency_key, concurrency_limit, rate_limit
FROM jobs INDEXED BY jobs_ready
WHERE queue = ?1 AND tenant = ?2 AND status = 'pending' AND scheduled_at <= ?3
  AND (concurrency_key IS NULL OR concurrency_limit > coalesce(
      (SELECT running FROM concurrency_running AS c WHERE c.tenant = ?2 AND c.key = jobs.concurrency_key), 0))
  AND (rate_limit IS NULL OR NOT EXISTS (
      SELECT 1 FROM rate_limits AS r WHERE r.tenant = ?2 AND r.name = jobs.rate_limit
        AND (SELECT count(*) FROM json_each(r.stamps) WHERE value > ?3 - r.per_secs) >= r."limit"))
ORDER BY priority DESC, scheduled_at, created_at LIMIT ?4;

-- name: concurrency_running
-- How many jobs of each of a tenant's concurrency keys (?2, a JSON array) run.
SELECT key, running FROM concurrency_running WHERE tenant = ?1 AND key IN (SELECT value FROM json_each(?2));

-- name: claim_expired
-- A job whose lease ran to its deadline timed out: the janitor fails it
-- (transitions.timed_out), no claim takes it. An expired lease holds its
-- concurrency key's place already; its claim takes a unit of its rate limit.
SELECT id, tenant, priority, scheduled_at, created_at, NULL, NULL, rate_limit FROM jobs INDEXED BY jobs_leased
WHERE queue = ? AND status = 'running' AND locked_until < ? AND attempt < max_attempts
    AND (deadline IS NULL OR locked_until < deadline) {paused}
ORDER BY locked_until LIMIT ?;

-- name: rate_limits_of
-- A tenant's rate limits, all of them or those named in ?2 (a JSON array).
SELECT name, "limit", per_secs, stamps FROM rate_limits
WHERE tenant = ?1 AND (?2 IS NULL OR name IN (SELECT value FROM json_each(?2))) ORDER BY name;

-- name: rate_limit_stamps
UPDATE rate_limits SET stamps = ?3 WHERE tenant = ?1 AND name = ?2;

-- name: rate_limit_set
-- A changed limit keeps the claims of the window: they still count.
INSERT INTO rate_limits (tenant, name, "limit", per_secs) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (tenant, name) DO UPDATE SET "limit" = ?3, per_secs = ?4;

-- name: rate_limit_delete
DELETE FROM rate_limits WHERE tenant = ?1 AND name = ?2 RETURNING 1;

-- name: claim
-- One statement for the whole batch; "{tokens}" is one "WHEN ? THEN ?" per
-- job. SET expressions see the row as it was, so status = 'running' marks
-- the expired leases, whose lost attempt goes into the error history. A job
-- with timeout_secs gets its deadline, which its lease never runs past.
-- The attempt history keeps ended attempts but a completed one (the running
-- and the completed one are the row's own attempt, worker_id and claimed_at,
-- models.attempt_history): the lost attempt goes into it, the
-- oldest entry dropped past MAX_ATTEMPTS_KEPT (20), as every end of an
-- attempt below writes it. Its times are written with every digit of the
-- double ("%!.17g": JSON's own form of a real keeps 15, tens of microseconds
-- of an epoch time).
UPDATE jobs SET status = 'running', attempt = attempt + 1,
    locked_until = CASE WHEN timeout_secs IS NULL THEN ? ELSE min(?, ? + timeout_secs) END,
    deadline = ? + timeout_secs,
    worker_id = ?, updated_at = ?, claimed_at = ?,
    lease_token = CASE id {tokens} END,
    error = CASE WHEN status = 'running' THEN ? ELSE error END,
    errors = CASE WHEN status = 'running' THEN json_insert(errors, '$[#]',
        json_object('attempt', attempt, 'error', ?, 'at', ?)) ELSE errors END,
    attempts = CASE WHEN status = 'running' THEN json_insert(CASE WHEN json_array_length(attempts) >= 20 THEN json_remove(attempts, '$[0]') ELSE attempts END, '$[#]',
        json_object('attempt', attempt, 'worker_id', worker_id, 'claimed_at', json(printf('%!.17g', claimed_at)),
                    'ended_at', json(printf('%!.17g', ?)), 'outcome', 'lost', 'error', ?)) ELSE attempts END
WHERE id IN ({marks})
RETURNING {job_columns};

-- name: next_scheduled
-- A job scheduled ahead of its creation (a delay, a time, a retry); one
-- due when created is claimable at once and never "next". As on PostgreSQL.
SELECT min(scheduled_at) FROM jobs INDEXED BY jobs_ready
WHERE queue = ? AND status = 'pending' AND scheduled_at > created_at AND scheduled_at > ? {paused};

-- name: next_lease
-- A lease counts even if it already ran out: its job is claimable now.
SELECT min(locked_until) FROM jobs INDEXED BY jobs_leased
WHERE queue = ? AND status = 'running' AND attempt < max_attempts
    AND (deadline IS NULL OR locked_until < deadline) {paused};

-- name: heartbeat
-- The guarded write of a heartbeat: only a running job under the token.
UPDATE jobs SET locked_until = ?, updated_at = ?
WHERE id = ? AND status = 'running' AND lease_token = ?;

-- name: progress
-- The guarded write of transitions.progress: only a running job under the token.
UPDATE jobs SET progress = ?1, progress_at = ?2, updated_at = ?2
WHERE id = ?3 AND status = 'running' AND lease_token = ?4;

-- name: complete
-- The completed attempt is read from the row (models.attempt_history): no
-- history is written.
UPDATE jobs SET status = 'completed', result = ?1, locked_until = NULL, updated_at = ?2
WHERE id = ?3 AND status = 'running' AND lease_token = ?4;

-- name: fail_lock
-- What a fail batch decides on (changes.jobs_fail).
SELECT id, status, lease_token, queue, attempt, max_attempts, workflow_id, kind, claimed_at, backoff,
    deadline, timeout_secs, concurrency_key IS NOT NULL AS keyed FROM jobs
WHERE id IN (SELECT value FROM json_each(?1));

-- name: snooze
-- The guarded write of transitions.snooze, for the whole batch: ids, tokens
-- and the times the jobs are due again, item by item. The token stays.
UPDATE jobs SET status = 'pending', scheduled_at = u.due, max_attempts = max_attempts + 1, locked_until = NULL,
    updated_at = ?4, attempts = json_insert(CASE WHEN json_array_length(attempts) >= 20 THEN json_remove(attempts, '$[0]') ELSE attempts END, '$[#]',
        json_object('attempt', attempt, 'worker_id', worker_id, 'claimed_at', json(printf('%!.17g', claimed_at)),
                    'ended_at', json(printf('%!.17g', ?4)), 'outcome', 'snoozed', 'error', NULL))
FROM (SELECT i.value AS id, json_extract(?2, '$[' || i.key || ']') AS token,
          json_extract(?3, '$[' || i.key || ']') AS due
      FROM json_each(?1) AS i) AS u
WHERE jobs.id = u.id AND jobs.status = 'running' AND jobs.lease_token = u.token
RETURNING jobs.queue;

-- name: fail
-- The guarded write of transitions.fail, for the whole batch: ids, tokens,
-- statuses, scheduled_at (null: unchanged) and errors, item by item.
UPDATE jobs SET status = u.status, scheduled_at = coalesce(u.retry_at, jobs.scheduled_at), locked_until = NULL,
    error = u.error, errors = json_insert(errors, '$[#]', json_object('attempt', attempt, 'error', u.error, 'at', ?6)),
    updated_at = ?6, attempts = json_insert(CASE WHEN json_array_length(attempts) >= 20 THEN json_remove(attempts, '$[0]') ELSE attempts END, '$[#]',
        json_object('attempt', attempt, 'worker_id', worker_id, 'claimed_at', json(printf('%!.17g', claimed_at)),
                    'ended_at', json(printf('%!.17g', ?6)), 'outcome', 'failed', 'error', u.error))
FROM (SELECT i.value AS id, json_extract(?2, '$[' || i.key || ']') AS token,
          json_extract(?3, '$[' || i.key || ']') AS status, json_extract(?4, '$[' || i.key || ']') AS retry_at,
          json_extract(?5, '$[' || i.key || ']') AS error
      FROM json_each(?1) AS i) AS u
WHERE jobs.id = u.id AND jobs.status = 'running' AND jobs.lease_token = u.token
RETURNING jobs.id, jobs.queue, jobs.status;

-- name: reap_lock_workflows
-- Other servers' janitors do not exist: no workflows to lock first.

-- name: expired
-- The janitor's round: running jobs whose lease ran out, first expired first.
SELECT j.id, j.queue, j.kind, j.attempt, j.max_attempts, j.locked_until, j.workflow_id, j.step, coalesce(s.position, 0),
    j.deadline, j.timeout_secs, j.backoff, j.concurrency_key IS NOT NULL
FROM jobs AS j LEFT JOIN workflow_steps AS s ON s.workflow_id = j.workflow_id AND s.name = j.step
WHERE j.status = 'running' AND j.locked_until < ?1
ORDER BY j.locked_until LIMIT ?2;

-- name: reap
-- The janitor takes the jobs back as transitions.reap decided: their tokens
-- go stale, their worker_id stays; a timed-out job retried is due at ?5's time.
-- Each running attempt ends as ?6 says (timed_out or lost).
UPDATE jobs SET status = u.status, locked_until = NULL, lease_token = NULL, error = u.error,
    errors = json_insert(errors, '$[#]', json_object('attempt', attempt, 'error', u.error, 'at', ?4)),
    scheduled_at = coalesce(u.retry_at, jobs.scheduled_at), updated_at = ?4,
    attempts = json_insert(CASE WHEN json_array_length(attempts) >= 20 THEN json_remove(attempts, '$[0]') ELSE attempts END, '$[#]',
        json_object('attempt', attempt, 'worker_id', worker_id, 'claimed_at', json(printf('%!.17g', claimed_at)),
                    'ended_at', json(printf('%!.17g', ?4)), 'outcome', u.outcome, 'error', u.error))
FROM (SELECT i.value AS id, json_extract(?2, '$[' || i.key || ']') AS status,
          json_extract(?3, '$[' || i.key || ']') AS error, json_extract(?5, '$[' || i.key || ']') AS retry_at,
          json_extract(?6, '$[' || i.key || ']') AS outcome
      FROM json_each(?1) AS i) AS u
WHERE jobs.id = u.id AND jobs.status = 'running' AND jobs.locked_until < ?4;

-- name: job_workflow
-- What the single-job changes (changes.py) decide on: the job's workflow, then
-- its status (no lock: one writer owns the file).
SELECT workflow_id FROM jobs WHERE id = ?1 AND tenant = ?2;

-- name: workflow_lock

-- name: job_lock_status
SELECT status FROM jobs WHERE id = ?1 AND tenant = ?2;

-- name: notify_queues
-- No other server shares the file: nobody to notify.

-- name: job_cancel
-- The lease token stays: a late heartbeat of the running attempt must
-- still be told "cancelled", not "conflict". The deadline goes: the job
-- is not running. A running attempt ends as cancelled.
UPDATE jobs SET status = 'cancelled', locked_until = NULL, updated_at = ?2,
    attempts = CASE WHEN status = 'running' THEN json_insert(CASE WHEN json_array_length(attempts) >= 20 THEN json_remove(attempts, '$[0]') ELSE attempts END, '$[#]',
        json_object('attempt', attempt, 'worker_id', worker_id, 'claimed_at', json(printf('%!.17g', claimed_at)),
                    'ended_at', json(printf('%!.17g', ?2)), 'outcome', 'cancelled', 'error', NULL)) ELSE attempts END
WHERE id = ?1 AND status IN ('pending', 'running')
RETURNING {job_columns};

-- name: job_reset
UPDATE jobs SET status = 'pending', attempt = 0, scheduled_at = ?2, updated_at = ?2,
    locked_until = NULL, lease_token = NULL
WHERE id = ?1 AND status IN ('failed', 'cancelled')
RETURNING {job_columns};

-- name: failed_step
SELECT step, id FROM jobs WHERE workflow_id = ? AND status = 'failed' ORDER BY updated_at, id LIMIT 1;

-- name: counts
-- Jobs by tenant, queue and status, from the counts the triggers of
-- migration 0003 keep; "{where}" narrows it to a tenant or a queue.
SELECT tenant, queue, status, sum(n) FROM job_counts WHERE true {where} GROUP BY tenant, queue, status;

-- name: pauses
SELECT tenant, queue FROM queue_pauses WHERE true {where};

-- name: queues_page
-- The names of a page of a tenant's queues with jobs or paused, after ?2:
-- each side read in order from an index (job_counts' key, and
-- queue_pauses_by_tenant of migration 0010), a page's worth at most.
SELECT queue FROM (
    SELECT DISTINCT queue FROM job_counts WHERE tenant = ?1 AND queue > ?2 AND n > 0 ORDER BY queue LIMIT ?3)
UNION
SELECT queue FROM (
    SELECT queue FROM queue_pauses INDEXED BY queue_pauses_by_tenant WHERE tenant = ?1 AND queue > ?2
    ORDER BY queue LIMIT ?3)
ORDER BY queue LIMIT ?3;

-- name: queue_oldest_ready
SELECT scheduled_at FROM jobs INDEXED BY jobs_pending_by_tenant
WHERE tenant = ? AND queue = ? AND status = 'pending' AND scheduled_at <= ? ORDER BY scheduled_at LIMIT 1;

-- name: queue_next_scheduled
SELECT scheduled_at FROM jobs INDEXED BY jobs_pending_by_tenant
WHERE tenant = ? AND queue = ? AND status = 'pending' AND scheduled_at > ? ORDER BY scheduled_at LIMIT 1;

-- name: queue_scheduled
-- The pending jobs whose time has not come, counted up to ?4 (models.MAX_SCHEDULED_COUNT).
SELECT count(*) FROM (
    SELECT 1 FROM jobs INDEXED BY jobs_pending_by_tenant
    WHERE tenant = ?1 AND queue = ?2 AND status = 'pending' AND scheduled_at > ?3 LIMIT ?4);

-- name: held_keys
-- The concurrency keys with running jobs (found from the running jobs,
-- whose number the workers bound) and their running counts.
SELECT c.tenant, c.key, c.running
FROM (SELECT DISTINCT tenant, concurrency_key FROM jobs INDEXED BY jobs_leased
      WHERE status = 'running' AND concurrency_key IS NOT NULL) AS r
JOIN concurrency_running AS c ON c.tenant = r.tenant AND c.key = r.concurrency_key;

-- name: rate_limits_spent
-- The rate limits with no unit left at ?1, and when the next unit of each
-- frees: stamps are kept oldest first, so the "limit"-th newest decides.
SELECT tenant, name, next_at FROM (
    SELECT tenant, name, per_secs,
        json_extract(stamps, '$[' || (json_array_length(stamps) - "limit") || ']') + per_secs AS next_at
    FROM rate_limits WHERE json_array_length(stamps) >= "limit")
WHERE next_at > ?1;

-- name: queue_held_concurrency
-- A queue's ready jobs held back by a concurrency key at its limit (?2:
-- [[key, running], ...] of the tenant's keys with running jobs), counted up
-- to ?5 (models.MAX_SCHEDULED_COUNT): one range of jobs_concurrency_pending
-- per key.
SELECT count(*) FROM (
    SELECT 1 FROM json_each(?2) AS k
    JOIN jobs AS j INDEXED BY jobs_concurrency_pending
        ON j.tenant = ?1 AND j.concurrency_key = json_extract(k.value, '$[0]') AND j.queue = ?3
        AND j.status = 'pending' AND j.scheduled_at <= ?4 AND j.concurrency_limit <= json_extract(k.value, '$[1]')
    LIMIT ?5);

-- name: queue_held_rate_limits
-- For each of the tenant's rate limits with no unit left (?2, their names),
-- the queue's ready jobs it holds back, counted up to ?5: one range of
-- jobs_rate_pending each.
SELECT r.value, (SELECT count(*) FROM (
    SELECT 1 FROM jobs INDEXED BY jobs_rate_pending
    WHERE tenant = ?1 AND rate_limit = r.value AND queue = ?3 AND status = 'pending' AND scheduled_at <= ?4
    LIMIT ?5))
FROM json_each(?2) AS r;

-- name: pending_queues
-- The queues holding a tenant's pending jobs ("{where}": one queue).
SELECT DISTINCT queue FROM job_counts WHERE tenant = ? AND status = 'pending' AND n > 0 {where};

-- name: queue_scheduled_jobs
-- A queue's jobs whose time has not come, next to run first.
SELECT {job_columns}
FROM jobs INDEXED BY jobs_pending_by_tenant
WHERE tenant = ?1 AND queue = ?2 AND status = 'pending' AND scheduled_at > ?3 ORDER BY scheduled_at LIMIT ?4;

-- name: queue_next_lease
-- Walks the queue's running jobs, whose number the workers bound.
SELECT min(locked_until) FROM jobs INDEXED BY jobs_leased WHERE queue = ? AND status = 'running' AND tenant = ?;

-- name: queue_pause
INSERT INTO queue_pauses (queue, tenant, paused_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING;

-- name: queue_resume
DELETE FROM queue_pauses WHERE queue = ? AND tenant = ?;

-- name: page_combos
-- The (queue, status, kind) combinations of a tenant's jobs that a filter
-- ("{where}") matches: a page merges one index range of each.
SELECT queue, status, kind FROM job_counts WHERE tenant = ? AND n > 0 {where};

-- name: combo_page
-- One combination's jobs, newest first; "{where}" adds the page's key and
-- a bulk action's time range.
SELECT created_at, id FROM jobs INDEXED BY jobs_by_filter
WHERE tenant = ? AND queue = ? AND status = ? AND kind = ? {where}
ORDER BY created_at DESC, id DESC LIMIT ?;

-- name: jobs_by_ids
SELECT {job_columns}
FROM jobs WHERE id IN (SELECT value FROM json_each(?1));

-- name: lock_workflows_of_jobs
-- The workflows of a bulk batch's jobs, to lock first: one writer owns the file.

-- name: bulk_lock
-- A bulk batch's jobs.
SELECT id, status, queue, workflow_id FROM jobs WHERE id IN (SELECT value FROM json_each(?1)) AND tenant = ?2
ORDER BY id;

-- name: bulk_workflow_statuses
SELECT id, status FROM workflows WHERE id IN (SELECT value FROM json_each(?1));

-- name: bulk_cancel
-- As job_cancel, for a batch.
UPDATE jobs SET status = 'cancelled', locked_until = NULL, updated_at = ?2,
    attempts = CASE WHEN status = 'running' THEN json_insert(CASE WHEN json_array_length(attempts) >= 20 THEN json_remove(attempts, '$[0]') ELSE attempts END, '$[#]',
        json_object('attempt', attempt, 'worker_id', worker_id, 'claimed_at', json(printf('%!.17g', claimed_at)),
                    'ended_at', json(printf('%!.17g', ?2)), 'outcome', 'cancelled', 'error', NULL)) ELSE attempts END
WHERE id IN (SELECT value FROM json_each(?1)) AND status IN ('pending', 'running')
RETURNING id, workflow_id, concurrency_key IS NOT NULL;

-- name: bulk_reset
-- As job_reset, for a batch.
UPDATE jobs SET status = 'pending', attempt = 0, scheduled_at = ?2, updated_at = ?2,
    locked_until = NULL, lease_token = NULL
WHERE id IN (SELECT value FROM json_each(?1)) AND status IN ('failed', 'cancelled')
RETURNING queue;

-- name: bulk_delete
DELETE FROM jobs
WHERE id IN (SELECT value FROM json_each(?1)) AND status IN ('completed', 'failed', 'cancelled') AND workflow_id IS NULL;

-- name: bulk_after
-- A bulk batch's jobs by status once it is done: what it changed.
SELECT status, count(*) FROM jobs WHERE id IN (SELECT value FROM json_each(?1)) GROUP BY status;

-- name: workers
-- A row per running job of tenant ?1 (the partial index walks the running
-- jobs, whose number the workers bound) with its holder and latest claim or
-- heartbeat, and one per worker seen leasing since ?2 a queue that holds
-- jobs of the tenant or that it paused (sightings the servers cap).
SELECT worker_id, queue, id, updated_at FROM jobs INDEXED BY jobs_leased
WHERE status = 'running' AND tenant = ?1 AND worker_id IS NOT NULL
UNION ALL
SELECT s.worker_id, s.queue, NULL, s.seen_at FROM worker_sightings AS s
WHERE s.seen_at >= ?2 AND (
    EXISTS (SELECT 1 FROM job_counts AS c WHERE c.tenant = ?1 AND c.queue = s.queue AND c.n > 0)
    OR EXISTS (SELECT 1 FROM queue_pauses AS p WHERE p.queue = s.queue AND p.tenant = ?1));

-- name: workers_seen
-- ?1: [[worker_id, queue], ...] seen at ?2.
INSERT INTO worker_sightings (worker_id, queue, seen_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), ?2 FROM json_each(?1) WHERE true
ON CONFLICT (worker_id, queue) DO UPDATE SET seen_at = max(seen_at, excluded.seen_at);

-- name: sightings_purge
DELETE FROM worker_sightings WHERE seen_at < ?;

-- name: session_create
INSERT INTO dashboard_sessions (key, tenant, secret, token_mac, created_at, idle_until, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?);

-- name: session_get
SELECT tenant, secret, token_mac, created_at, idle_until, expires_at FROM dashboard_sessions
WHERE key = ?1 AND idle_until > ?2;

-- name: session_touch
UPDATE dashboard_sessions SET idle_until = min(?2, expires_at) WHERE key = ?1;

-- name: session_delete
DELETE FROM dashboard_sessions WHERE key = ?;

-- name: sessions_purge
DELETE FROM dashboard_sessions WHERE idle_until <= ?;

-- name: prune_jobs
DELETE FROM jobs WHERE id IN (
    SELECT id FROM jobs INDEXED BY jobs_finished
    WHERE status IN ('completed', 'cancelled') AND updated_at < ?1 AND workflow_id IS NULL
    LIMIT ?2)
RETURNING 1;

-- name: prune_finished_workflows
-- Workflows go whole, so that a workflow never shows a step whose job has
-- vanished; failed ones stay, like dead-lettered jobs.
SELECT id FROM workflows INDEXED BY workflows_finished
WHERE status IN ('completed', 'cancelled') AND updated_at < ? LIMIT 100;

-- name: prune_workflow_jobs
DELETE FROM jobs WHERE workflow_id = ?1 RETURNING 1;

-- name: prune_workflow_edges
DELETE FROM workflow_edges WHERE workflow_id = ?;

-- name: prune_workflow_steps
DELETE FROM workflow_steps WHERE workflow_id = ?;

-- name: prune_workflow_collects
DELETE FROM workflow_collects WHERE workflow_id = ?;

-- name: prune_workflow
DELETE FROM workflows WHERE id = ?;

-- name: workflow_insert
INSERT INTO workflows (id, tenant, name, status, context, steps_total, steps_completed, created_at, updated_at)
VALUES (?1, ?2, ?3, 'running', ?4, ?5, 0, ?6, ?6);

-- name: workflow_step_insert
INSERT INTO workflow_steps (workflow_id, name, position, kind, payload, depends_on, max_attempts, state,
    remaining, job_id)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: workflow_edge_insert
INSERT INTO workflow_edges (workflow_id, step, dependent) VALUES (?, ?, ?);

-- Steps added at run time (changes.steps_add, migration 0014).

-- name: step_of_job
SELECT workflow_id, step FROM jobs WHERE id = ?1;

-- name: step_lease
SELECT status, lease_token IS ?2 FROM jobs WHERE id = ?1;

-- name: steps_named
-- The steps of these names, each with its job's status.
SELECT s.name, s.kind, s.payload, s.depends_on, s.max_attempts, s.added_by, s.collect, j.status
FROM workflow_steps AS s LEFT JOIN jobs AS j ON j.id = s.job_id
WHERE s.workflow_id = ?1 AND s.name IN (SELECT value FROM json_each(?2));

-- name: workflow_steps_total
SELECT steps_total, steps_added FROM workflows WHERE id = ?1;

-- name: step_dependents
-- The steps waiting for ?2, but for those it added itself.
SELECT e.dependent FROM workflow_edges AS e
JOIN workflow_steps AS s ON s.workflow_id = e.workflow_id AND s.name = e.dependent
WHERE e.workflow_id = ?1 AND e.step = ?2 AND s.added_by IS NOT ?2 ORDER BY e.dependent;

-- name: collect_owner
SELECT added_by FROM workflow_collects WHERE workflow_id = ?1 AND key = ?2;

-- name: added_step_insert
INSERT INTO workflow_steps (workflow_id, name, position, kind, payload, depends_on, max_attempts, state,
    remaining, job_id, added_by, collect)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'waiting', ?8, NULL, ?9, ?10);

-- name: steps_wait_more
UPDATE workflow_steps SET remaining = remaining + ?3
WHERE workflow_id = ?1 AND name IN (SELECT value FROM json_each(?2));

-- name: workflow_grow
UPDATE workflows SET steps_total = steps_total + ?2, steps_added = steps_added + ?2, updated_at = ?3 WHERE id = ?1;

-- name: collect_add
INSERT INTO workflow_collects (workflow_id, key, added_by, remaining) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (workflow_id, key) DO UPDATE SET remaining = remaining + excluded.remaining;

-- name: step_job_insert
INSERT INTO jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts,
    scheduled_at, created_at, updated_at, workflow_id, step, context)
VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 0, 0, ?6, ?7, ?7, ?7, ?8, ?9, ?10);

-- name: enqueue_steps
-- ?7 holds a new job id for each name of ?2; steps_enqueued then marks the steps.
INSERT INTO jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts,
    scheduled_at, created_at, updated_at, workflow_id, step, context)
SELECT json_extract(?7, '$[' || n.key || ']'), ?3, ?4, s.kind, s.payload, 'pending', 0, 0, s.max_attempts, ?5, ?5, ?5,
    ?1, s.name, ?6
FROM json_each(?2) AS n
-- CROSS JOIN keeps the names outermost, each step found by its key: else
-- SQLite walks every step of the workflow in order, a cost that grows with it
CROSS JOIN workflow_steps AS s ON s.workflow_id = ?1 AND s.name = n.value
WHERE s.state = 'waiting'
ORDER BY s.position;

-- name: steps_enqueued
UPDATE workflow_steps SET state = 'enqueued', job_id = (
    SELECT json_extract(?7, '$[' || n.key || ']') FROM json_each(?2) AS n WHERE n.value = workflow_steps.name)
WHERE workflow_id = ?1 AND state = 'waiting' AND name IN (SELECT value FROM json_each(?2));

-- name: workflow_step_completed
-- qftrio_merge: the top-level merge of two JSON objects (later wins), as
-- PostgreSQL's jsonb || does; the store registers it.
UPDATE workflows SET context = qftrio_merge(context, ?2), steps_completed = steps_completed + 1, updated_at = ?3
WHERE id = ?1
RETURNING tenant, status, context, steps_total, steps_completed;

-- name: steps_unblock
-- The steps waiting for a completed one, their count lowered.
UPDATE workflow_steps SET remaining = remaining - 1
WHERE workflow_id = ?1 AND name IN (SELECT dependent FROM workflow_edges WHERE workflow_id = ?1 AND step = ?2)
RETURNING position, name, remaining, state;

-- name: step_collected
-- A completed step's collect key (migration 0014), its count lowered.
UPDATE workflow_collects SET remaining = remaining - 1
WHERE workflow_id = ?1 AND key = (SELECT collect FROM workflow_steps WHERE workflow_id = ?1 AND name = ?2)
RETURNING key, remaining;

-- name: collect_write
-- The results of the steps collected under ?2, in the order added, as a
-- list under that key of the context.
UPDATE workflows SET context = qftrio_merge(context, json_object(?2, (
    SELECT json_group_array(json(coalesce(r, '{}'))) FROM (
        SELECT j.result AS r FROM workflow_steps AS s JOIN jobs AS j ON j.id = s.job_id
        WHERE s.workflow_id = ?1 AND s.collect = ?2 ORDER BY s.position)))), updated_at = ?3
WHERE id = ?1
RETURNING context;

-- name: workflow_complete
UPDATE workflows SET status = 'completed' WHERE id = ?1;

-- name: workflow_end
UPDATE workflows SET status = ?2, updated_at = ?3 WHERE id = ?1 AND status = 'running' RETURNING 1;

-- name: workflow_jobs_cancel
-- The lease token stays, as for any cancel: a running step's next
-- heartbeat is told "cancelled"; its attempt ends as cancelled.
UPDATE jobs SET status = 'cancelled', locked_until = NULL, updated_at = ?2,
    attempts = CASE WHEN status = 'running' THEN json_insert(CASE WHEN json_array_length(attempts) >= 20 THEN json_remove(attempts, '$[0]') ELSE attempts END, '$[#]',
        json_object('attempt', attempt, 'worker_id', worker_id, 'claimed_at', json(printf('%!.17g', claimed_at)),
                    'ended_at', json(printf('%!.17g', ?2)), 'outcome', 'cancelled', 'error', NULL)) ELSE attempts END
WHERE workflow_id = ?1 AND status IN ('pending', 'running');

-- name: workflow_steps_cancel
UPDATE workflow_steps SET state = 'cancelled' WHERE workflow_id = ? AND state = 'waiting';

-- name: workflow_resume
UPDATE workflows SET status = 'running', updated_at = ?2 WHERE id = ?1 RETURNING tenant, context;

-- name: workflow_jobs_resume
-- The failed step and those cancelled by the failure: their dependencies had
-- completed, so they are ready again at once.
UPDATE jobs SET status = 'pending', attempt = 0, scheduled_at = ?3, updated_at = ?3, context = ?4,
    locked_until = NULL, lease_token = NULL
WHERE workflow_id = ?1 AND (status = 'cancelled' OR id = ?2);

-- name: workflow_steps_wait_again
UPDATE workflow_steps SET state = 'waiting' WHERE workflow_id = ? AND state = 'cancelled'
RETURNING position, name, remaining;

-- name: workflow_status
SELECT status FROM workflows WHERE id = ?;

-- name: workflow_owned_lock
SELECT status FROM workflows WHERE id = ?1 AND tenant = ?2;

-- name: workflow_get
SELECT id, tenant, name, status, context, created_at, updated_at FROM workflows WHERE id = ?;

-- name: workflows_page
-- The keys of a page, after the key (?3, ?4) of the previous page's last
-- workflow, if any.
SELECT created_at, id FROM workflows
WHERE tenant = ?1 AND (?2 IS NULL OR status = ?2) AND (created_at, id) < (coalesce(?3, 1e999), coalesce(?4, ''))
ORDER BY created_at DESC, id DESC LIMIT ?5;

-- name: workflow_bytes
-- What each workflow of a page takes on the wire without its steps' jobs,
-- about, as job_bytes reckons a job's: its context, and each step's payload,
-- dependencies and names.
SELECT w.id, 512 + length(CAST(w.context AS BLOB)) + coalesce((
    SELECT sum(256 + length(CAST(s.payload AS BLOB)) + length(CAST(s.depends_on AS BLOB)) + length(s.name)
        + length(s.kind))
    FROM workflow_steps AS s WHERE s.workflow_id = w.id), 0)
FROM workflows AS w WHERE w.id IN (SELECT value FROM json_each(?1));

-- name: workflows_by_ids
SELECT id, tenant, name, status, context, created_at, updated_at FROM workflows
WHERE id IN (SELECT value FROM json_each(?1));

-- name: steps_of_workflows
SELECT workflow_id, name, kind, payload, depends_on, max_attempts, state, job_id, added_by
FROM workflow_steps WHERE workflow_id IN (SELECT value FROM json_each(?1)) ORDER BY workflow_id, position;

-- name: jobs_of_workflows
SELECT {job_columns}
FROM jobs WHERE workflow_id IN (SELECT value FROM json_each(?1));

-- name: job_statuses_of_workflows
SELECT id, status FROM jobs WHERE workflow_id IN (SELECT value FROM json_each(?1));


-- Cron schedules (docs/schedules.md; store/changes.py, "schedules"). One
-- writer owns the file: nothing is locked.

-- name: schedule_columns
-- A schedule's columns, in the order of the fields of qftrio.models.Schedule.
name, tenant, cron, timezone, job, paused, catch_up, next_run_at, last_run_at, last_job_id, created_at, updated_at

-- name: schedule_get
SELECT {schedule_columns} FROM schedules WHERE tenant = ?1 AND name = ?2;

-- name: schedule_lock
SELECT cron, timezone, paused, next_run_at FROM schedules WHERE tenant = ?1 AND name = ?2;

-- name: schedule_upsert
INSERT INTO schedules (tenant, name, cron, timezone, job, paused, catch_up, next_run_at, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)
ON CONFLICT (tenant, name) DO UPDATE SET cron = ?3, timezone = ?4, job = ?5, paused = ?6, catch_up = ?7,
    next_run_at = ?8, updated_at = ?9
RETURNING {schedule_columns};

-- name: schedules_page
SELECT {schedule_columns} FROM schedules
WHERE tenant = ?1 AND (?2 IS NULL OR name > ?2) ORDER BY name LIMIT ?3;

-- name: schedule_delete
DELETE FROM schedules WHERE tenant = ?1 AND name = ?2 RETURNING name;

-- name: schedule_ticks_delete
DELETE FROM schedule_ticks WHERE tenant = ?1 AND schedule = ?2;

-- name: schedule_set_paused
UPDATE schedules SET paused = ?3, next_run_at = ?4, updated_at = ?5
WHERE tenant = ?1 AND name = ?2
RETURNING {schedule_columns};

-- name: schedules_due
SELECT tenant, name, cron, timezone, job, catch_up, next_run_at FROM schedules
WHERE next_run_at <= ?1
ORDER BY next_run_at
LIMIT ?2;

-- name: schedule_ticks_claim
INSERT INTO schedule_ticks (tenant, schedule, tick, created_at)
SELECT json_extract(?1, '$[' || t.key || ']'), json_extract(?2, '$[' || t.key || ']'), t.value, ?4
FROM json_each(?3) AS t WHERE true
ON CONFLICT DO NOTHING
RETURNING tenant, schedule, tick;

-- name: schedule_advance
-- Each schedule of the batch (tenant, name, next run, last run, last job:
-- parallel arrays) moved on, in one statement.
UPDATE schedules SET next_run_at = u.next_run_at, last_run_at = coalesce(u.last_run_at, schedules.last_run_at),
    last_job_id = coalesce(u.last_job_id, schedules.last_job_id), updated_at = ?6
FROM (SELECT i.value AS tenant, json_extract(?2, '$[' || i.key || ']') AS name,
          json_extract(?3, '$[' || i.key || ']') AS next_run_at, json_extract(?4, '$[' || i.key || ']') AS last_run_at,
          json_extract(?5, '$[' || i.key || ']') AS last_job_id
      FROM json_each(?1) AS i) AS u
WHERE schedules.tenant = u.tenant AND schedules.name = u.name;

-- name: schedule_ticks_prune
-- Each schedule's ticks before its first unfired one (parallel arrays).
DELETE FROM schedule_ticks WHERE (tenant, schedule, tick) IN (
    SELECT k.tenant, k.schedule, k.tick FROM json_each(?1) AS i JOIN schedule_ticks AS k
        ON k.tenant = i.value AND k.schedule = json_extract(?2, '$[' || i.key || ']')
           AND k.tick < json_extract(?3, '$[' || i.key || ']'));

-- name: job_wait_begin
-- A wait parked on a job, in this connection's own table (the store's
-- TEMP trigger jobs_ended reads it): ?1 wait id, ?2 job id.
INSERT INTO temp.job_waits (id, job_id) VALUES (?1, ?2);

-- name: job_wait_end
DELETE FROM temp.job_waits WHERE id = ?1;

-- name: events_begin
-- An event stream of a tenant's, in this connection's own table (the
-- store's TEMP triggers jobs_inserted_event and jobs_updated_event read
-- it): ?1 stream id, ?2 tenant.
INSERT INTO temp.event_streams (id, tenant) VALUES (?1, ?2);

-- name: events_end
DELETE FROM temp.event_streams WHERE id = ?1;
