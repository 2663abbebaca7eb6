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

-- A job's own policies, as enqueued, and what claims and inserts look them
-- up by.
ALTER TABLE qftrio_jobs ADD COLUMN concurrency jsonb;
ALTER TABLE qftrio_jobs ADD COLUMN concurrency_key text;
ALTER TABLE qftrio_jobs ADD COLUMN concurrency_limit int;
ALTER TABLE qftrio_jobs ADD COLUMN "unique" jsonb;
ALTER TABLE qftrio_jobs ADD COLUMN unique_key text;

-- Concurrency keys: how many jobs of each (tenant, key) are running (an
-- expired lease not yet taken back included), kept by triggers in the
-- transaction of every change of status, so that no path out of running
-- can forget it; only jobs that carry a key fire them. A claim locks the
-- rows of the keys it weighs (in order) before it reads them: claims of one
-- key on any server take turns, and none sees a count another has raised.
CREATE TABLE qftrio_concurrency_running (
    tenant text NOT NULL,
    key text NOT NULL,
    running int NOT NULL,
    PRIMARY KEY (tenant, key)
);

CREATE FUNCTION qftrio_concurrency_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO qftrio_concurrency_running (tenant, key, running)
        VALUES (NEW.tenant, NEW.concurrency_key, (NEW.status = 'running')::int)
        ON CONFLICT (tenant, key) DO UPDATE
        SET running = qftrio_concurrency_running.running + (NEW.status = 'running')::int;
    ELSIF TG_OP = 'UPDATE' THEN
        UPDATE qftrio_concurrency_running
        SET running = running + CASE WHEN NEW.status = 'running' THEN 1 ELSE -1 END
        WHERE tenant = NEW.tenant AND key = NEW.concurrency_key;
    ELSE
        UPDATE qftrio_concurrency_running SET running = running - 1
        WHERE tenant = OLD.tenant AND key = OLD.concurrency_key;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER qftrio_jobs_concurrency_insert AFTER INSERT ON qftrio_jobs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL) EXECUTE FUNCTION qftrio_concurrency_count();
CREATE TRIGGER qftrio_jobs_concurrency_update AFTER UPDATE OF status ON qftrio_jobs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND (OLD.status = 'running') <> (NEW.status = 'running'))
    EXECUTE FUNCTION qftrio_concurrency_count();
CREATE TRIGGER qftrio_jobs_concurrency_delete AFTER DELETE ON qftrio_jobs
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'running')
    EXECUTE FUNCTION qftrio_concurrency_count();

-- Unique jobs: a tenant's jobs by unique key. An insert of one takes a
-- transaction-scoped advisory lock on (tenant, key) before it looks here, so
-- that concurrent inserts of one key on any server take turns.
CREATE INDEX qftrio_jobs_unique_idx ON qftrio_jobs (tenant, unique_key, created_at)
    WHERE unique_key IS NOT NULL;

-- Rate limits a tenant declared: at most "limit" claims of its jobs naming
-- one in any window of per_secs. "stamps" holds the times of the claims of
-- the last window (at most "limit" of them, oldest first); a claim locks
-- the rows it weighs, in order, as for concurrency keys.
ALTER TABLE qftrio_jobs ADD COLUMN rate_limit text;
CREATE TABLE qftrio_rate_limits (
    tenant text NOT NULL,
    name text NOT NULL,
    "limit" int NOT NULL,
    per_secs float8 NOT NULL,
    stamps float8[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant, name)
);
