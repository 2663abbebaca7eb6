-- qftrio schema, version 0002: workflows (DESIGN §4).
--
-- A workflow's steps become ordinary jobs (qftrio_jobs.workflow_id/step/context)
-- once their dependencies have completed. Advancing one touches only the steps
-- that depend on the step that completed: each step counts its unfinished
-- dependencies (``remaining``), and each dependency is a row of
-- qftrio_workflow_edges.
--
-- Lock order, everywhere a transaction touches both: the workflow row first
-- (``FOR UPDATE``, in id order), then its jobs. Heartbeats and claims lock
-- jobs only and never wait for a workflow, so they cannot close a cycle.

CREATE TABLE qftrio_workflows (
    id              uuid PRIMARY KEY,
    tenant          text NOT NULL,
    name            text NOT NULL,
    status          text NOT NULL DEFAULT 'running'
                    CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    context         jsonb NOT NULL DEFAULT '{}'::jsonb,
    steps_total     integer NOT NULL,
    steps_completed integer NOT NULL DEFAULT 0,
    created_at      double precision NOT NULL,
    updated_at      double precision NOT NULL
);

-- Listing a tenant's workflows, newest first (keyset pagination on created_at, id).
CREATE INDEX qftrio_workflows_list_idx ON qftrio_workflows (tenant, created_at DESC, id DESC);

-- Retention: finished workflows by age (failed ones are kept, like dead letters).
CREATE INDEX qftrio_workflows_prune_idx ON qftrio_workflows (updated_at)
    WHERE status IN ('completed', 'cancelled');

-- state: 'waiting' until the step has a job, 'enqueued' after (the job's
-- status is then the step's), 'cancelled' when the workflow ended before it
-- had one.
CREATE TABLE qftrio_workflow_steps (
    workflow_id     uuid NOT NULL REFERENCES qftrio_workflows (id) ON DELETE CASCADE,
    name            text NOT NULL,
    position        integer NOT NULL,
    kind            text NOT NULL,
    payload         jsonb NOT NULL DEFAULT '{}'::jsonb,
    depends_on      jsonb NOT NULL DEFAULT '[]'::jsonb,  -- the names, in the order given
    max_attempts    integer NOT NULL CHECK (max_attempts >= 1),
    state           text NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'enqueued', 'cancelled')),
    remaining       integer NOT NULL,
    job_id          uuid,
    PRIMARY KEY (workflow_id, name),
    UNIQUE (workflow_id, position)
);

-- One row per dependency: ``dependent`` waits for ``step``.
CREATE TABLE qftrio_workflow_edges (
    workflow_id     uuid NOT NULL REFERENCES qftrio_workflows (id) ON DELETE CASCADE,
    step            text NOT NULL,
    dependent       text NOT NULL,
    PRIMARY KEY (workflow_id, step, dependent)
);

-- One job per step, ever: a second one cannot be inserted. Replaces the plain
-- index of 0001 (same leading column).
CREATE UNIQUE INDEX qftrio_jobs_workflow_step_idx ON qftrio_jobs (workflow_id, step)
    WHERE workflow_id IS NOT NULL;
DROP INDEX qftrio_jobs_workflow_idx;
