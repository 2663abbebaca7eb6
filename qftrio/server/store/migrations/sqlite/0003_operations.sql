-- qftrio embedded schema, version 0003: operations (pause, exact counts,
-- lists and stats whose cost does not grow with the table).
--
-- job_counts holds how many jobs each (tenant, queue, kind, status) has,
-- kept by triggers in the transaction of every change: one writer at a time
-- owns the file, so a counter row costs no concurrency here. It is also the
-- catalogue of combinations a filtered page merges (jobs_by_filter).
CREATE TABLE job_counts (
    tenant TEXT NOT NULL,
    queue TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (tenant, queue, kind, status)
) WITHOUT ROWID;
INSERT INTO job_counts (tenant, queue, kind, status, n)
    SELECT tenant, queue, kind, status, count(*) FROM jobs GROUP BY tenant, queue, kind, status;

CREATE TRIGGER jobs_counted_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO job_counts (tenant, queue, kind, status, n) VALUES (NEW.tenant, NEW.queue, NEW.kind, NEW.status, 1)
    ON CONFLICT (tenant, queue, kind, status) DO UPDATE SET n = n + 1;
END;
-- A job's tenant, queue and kind never change.
CREATE TRIGGER jobs_counted_update AFTER UPDATE OF status ON jobs WHEN OLD.status <> NEW.status BEGIN
    UPDATE job_counts SET n = n - 1
    WHERE tenant = OLD.tenant AND queue = OLD.queue AND kind = OLD.kind AND status = OLD.status;
    INSERT INTO job_counts (tenant, queue, kind, status, n) VALUES (NEW.tenant, NEW.queue, NEW.kind, NEW.status, 1)
    ON CONFLICT (tenant, queue, kind, status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER jobs_counted_delete AFTER DELETE ON jobs BEGIN
    UPDATE job_counts SET n = n - 1
    WHERE tenant = OLD.tenant AND queue = OLD.queue AND kind = OLD.kind AND status = OLD.status;
END;

-- Paused (tenant, queue) pairs; claims look them up by queue.
CREATE TABLE queue_pauses (
    queue TEXT NOT NULL,
    tenant TEXT NOT NULL,
    paused_at REAL NOT NULL,
    PRIMARY KEY (queue, tenant)
) WITHOUT ROWID;

-- When the attempt a report ends was claimed (the run time metric).
ALTER TABLE jobs ADD COLUMN claimed_at REAL;

-- Pages: one (tenant, queue, status, kind) combination newest first; a page
-- of any filter merges the combinations job_counts lists for it. Replaces
-- the per-tenant indexes of 0001.
CREATE INDEX jobs_by_filter ON jobs (tenant, queue, status, kind, created_at DESC, id DESC);
DROP INDEX jobs_by_tenant;
DROP INDEX jobs_by_tenant_queue;

-- A tenant's queue's oldest ready job and next scheduled one.
CREATE INDEX jobs_pending_by_tenant ON jobs (tenant, queue, scheduled_at) WHERE status = 'pending';
