-- qftrio embedded schema, version 0001: jobs.
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    queue TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    priority INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    scheduled_at REAL NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    locked_until REAL,
    worker_id TEXT,
    lease_token TEXT,
    result TEXT,
    error TEXT,
    errors TEXT NOT NULL DEFAULT '[]',
    idempotency_key TEXT,
    workflow_id TEXT,
    step TEXT,
    context TEXT
);
CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_ready ON jobs (queue, priority DESC, scheduled_at, created_at)
    WHERE status = 'pending';
CREATE INDEX jobs_leased ON jobs (queue, locked_until) WHERE status = 'running';
CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at DESC, id DESC);
CREATE INDEX jobs_by_tenant_queue ON jobs (tenant, queue, status);
CREATE INDEX jobs_finished ON jobs (updated_at) WHERE status IN ('completed', 'cancelled');
