-- qftrio embedded schema, version 0002: workflows.
--
-- A step's state is 'waiting' until it has a job, 'enqueued' after (the
-- job's status is then the step's), or 'cancelled' if its workflow ended
-- before it had one. 'remaining' counts its dependencies not completed yet;
-- workflow_edges lets a completion find the steps waiting for it without a
-- scan.
CREATE TABLE workflows (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    context TEXT NOT NULL,
    steps_total INTEGER NOT NULL,
    steps_completed INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX workflows_by_tenant ON workflows (tenant, created_at DESC, id DESC);
CREATE INDEX workflows_finished ON workflows (updated_at) WHERE status IN ('completed', 'cancelled');
CREATE TABLE workflow_steps (
    workflow_id TEXT NOT NULL,
    name TEXT NOT NULL,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    depends_on TEXT NOT NULL,
    max_attempts INTEGER NOT NULL,
    state TEXT NOT NULL,
    remaining INTEGER NOT NULL,
    job_id TEXT,
    PRIMARY KEY (workflow_id, name)
) WITHOUT ROWID;
CREATE UNIQUE INDEX workflow_steps_order ON workflow_steps (workflow_id, position);
CREATE TABLE workflow_edges (
    workflow_id TEXT NOT NULL,
    step TEXT NOT NULL,
    dependent TEXT NOT NULL,
    PRIMARY KEY (workflow_id, step, dependent)
) WITHOUT ROWID;
CREATE UNIQUE INDEX jobs_workflow_step ON jobs (workflow_id, step) WHERE workflow_id IS NOT NULL;
