-- qftrio schema (embedded store), version 0009: flow control at claim time.

-- Fair tenants: a lease takes each tenant's ready jobs of a queue in lease
-- order, one tenant after another, so the claim index leads with the tenant
-- after the queue. It replaces the index of 0001 (a job's change updates no
-- more indexes than before); a lease finds a queue's tenants in job_counts.
DROP INDEX jobs_ready;
CREATE INDEX jobs_ready ON jobs (queue, tenant, priority DESC, scheduled_at, created_at)
    WHERE status = 'pending';

-- A job's own policies, as enqueued (JSON), and what claims and inserts
-- look them up by.
ALTER TABLE jobs ADD COLUMN concurrency TEXT;
ALTER TABLE jobs ADD COLUMN concurrency_key TEXT;
ALTER TABLE jobs ADD COLUMN concurrency_limit INTEGER;
ALTER TABLE jobs ADD COLUMN "unique" TEXT;
ALTER TABLE jobs ADD COLUMN unique_key TEXT;

-- Concurrency keys: how many jobs of each (tenant, key) are running (an
-- expired lease not yet taken back included), kept by triggers in the
-- transaction of every change of status, so that no path out of running
-- can forget it. Only jobs that carry a key fire them.
CREATE TABLE concurrency_running (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    running INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE TRIGGER jobs_concurrency_insert AFTER INSERT ON jobs WHEN NEW.concurrency_key IS NOT NULL BEGIN
    INSERT INTO concurrency_running (tenant, key, running)
    VALUES (NEW.tenant, NEW.concurrency_key, NEW.status = 'running')
    ON CONFLICT (tenant, key) DO UPDATE SET running = running + (NEW.status = 'running');
END;
CREATE TRIGGER jobs_concurrency_update AFTER UPDATE OF status ON jobs
WHEN NEW.concurrency_key IS NOT NULL AND (OLD.status = 'running') <> (NEW.status = 'running') BEGIN
    UPDATE concurrency_running SET running = running + CASE WHEN NEW.status = 'running' THEN 1 ELSE -1 END
    WHERE tenant = NEW.tenant AND key = NEW.concurrency_key;
END;
CREATE TRIGGER jobs_concurrency_delete AFTER DELETE ON jobs
WHEN OLD.concurrency_key IS NOT NULL AND OLD.status = 'running' BEGIN
    UPDATE concurrency_running SET running = running - 1 WHERE tenant = OLD.tenant AND key = OLD.concurrency_key;
END;

-- Unique jobs: a tenant's jobs by unique key (one writer owns the file: an
-- insert reads it and writes in one transaction).
CREATE INDEX jobs_unique ON jobs (tenant, unique_key, created_at) WHERE unique_key IS NOT NULL;

-- Rate limits a tenant declared: at most "limit" claims of its jobs naming
-- one in any window of per_secs. "stamps" holds the times of the claims of
-- the last window (a JSON array, at most "limit" of them, oldest first).
ALTER TABLE jobs ADD COLUMN rate_limit TEXT;
CREATE TABLE rate_limits (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    "limit" INTEGER NOT NULL,
    per_secs REAL NOT NULL,
    stamps TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (tenant, name)
) WITHOUT ROWID;
