-- qftrio schema, version 0011: flow control at claim time.
--
-- Fair tenants: a lease takes each tenant's ready jobs of a queue in lease
-- order, one tenant after another, so the claim index leads with the tenant
-- after the queue: a claim finds a queue's tenants by skipping through it,
-- and walks each tenant's share in lease order. It replaces the index of
-- 0001, so that a job's change updates no more indexes than before.
--
-- The new index is built before the old one goes, so that reads go on while
-- it builds (writes wait: the migration is one transaction).

CREATE INDEX qftrio_jobs_claim_new_idx ON qftrio_jobs (queue, tenant, priority DESC, scheduled_at, created_at)
    WHERE status = 'pending';
DROP INDEX qftrio_jobs_claim_idx;
ALTER INDEX qftrio_jobs_claim_new_idx RENAME TO qftrio_jobs_claim_idx;
