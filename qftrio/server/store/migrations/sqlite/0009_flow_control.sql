-- qftrio schema (embedded store), version 0009: flow control at claim time.

-- Fair tenants: a lease takes each tenant's ready jobs of a queue in lease
-- order, one tenant after another, so the claim index leads with the tenant
-- after the queue. It replaces the index of 0001 (a job's change updates no
-- more indexes than before); a lease finds a queue's tenants in job_counts.
DROP INDEX jobs_ready;
CREATE INDEX jobs_ready ON jobs (queue, tenant, priority DESC, scheduled_at, created_at)
    WHERE status = 'pending';
