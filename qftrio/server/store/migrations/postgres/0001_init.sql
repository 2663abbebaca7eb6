-- qftrio schema, version 0001: jobs.
--
-- Times are double precision seconds since the Unix epoch, exactly the floats
-- the store interface passes around (no rounding to microseconds).
-- Workflows come in a later migration; the workflow_id/step/context columns
-- are here already so that steps are ordinary jobs.

CREATE TABLE qftrio_jobs (
    id              uuid PRIMARY KEY,
    tenant          text NOT NULL,
    queue           text NOT NULL,
    kind            text NOT NULL,
    payload         jsonb NOT NULL DEFAULT '{}'::jsonb,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    priority        integer NOT NULL DEFAULT 0,
    attempt         integer NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    scheduled_at    double precision NOT NULL,
    created_at      double precision NOT NULL,
    updated_at      double precision NOT NULL,
    locked_until    double precision,           -- set while running
    worker_id       text,
    lease_token     uuid,                       -- kept after complete/fail/cancel (replays)
    result          jsonb,
    error           text,
    errors          jsonb NOT NULL DEFAULT '[]'::jsonb,  -- [{attempt, error, at}]
    idempotency_key text,
    workflow_id     uuid,
    step            text,
    context         jsonb
);

-- A queue table churns: vacuum and analyze it well before the defaults (20 %)
-- would, so that dead tuples do not pile up under the claim index.
ALTER TABLE qftrio_jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- Claims: the ready pending jobs of a queue, in lease order. Partial, so its
-- size follows the backlog, not the table.
CREATE INDEX qftrio_jobs_claim_idx ON qftrio_jobs (queue, priority DESC, scheduled_at, created_at)
    WHERE status = 'pending';

-- Claims of expired leases, the janitor, and when a lease next runs out.
CREATE INDEX qftrio_jobs_running_idx ON qftrio_jobs (queue, locked_until)
    WHERE status = 'running';

-- When the next scheduled job of a queue comes due (long-polls wait until then).
CREATE INDEX qftrio_jobs_scheduled_idx ON qftrio_jobs (queue, scheduled_at)
    WHERE status = 'pending';

-- Idempotent enqueue.
CREATE UNIQUE INDEX qftrio_jobs_idempotency_idx ON qftrio_jobs (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Listing a tenant's jobs, newest first (keyset pagination on created_at, id).
CREATE INDEX qftrio_jobs_list_idx ON qftrio_jobs (tenant, created_at DESC, id DESC);

-- Retention: finished jobs by age.
CREATE INDEX qftrio_jobs_prune_idx ON qftrio_jobs (updated_at)
    WHERE status IN ('completed', 'cancelled');

-- The steps of a workflow.
CREATE INDEX qftrio_jobs_workflow_idx ON qftrio_jobs (workflow_id)
    WHERE workflow_id IS NOT NULL;
