-- qftrio schema, version 0004: operations (pause, exact counts, lists and
-- stats whose cost does not grow with the table).
--
-- Counts. A row per (tenant, queue, kind, status) updated by every change
-- would be a hot row: every claim of a queue would wait for the one before
-- to commit. Instead, statement-level triggers append the net change of each
-- statement to a ledger, qftrio_job_counts (a few rows per statement, none
-- for a heartbeat), in the statement's own transaction: appends never wait
-- on each other, and a count is the sum of its rows, exact at any snapshot.
-- The janitor folds the ledger (qftrio_job_counts_fold) every round, so
-- that a read sums a few rows per combination, not one per change.
-- The ledger also lists the (queue, status, kind) combinations of a tenant's
-- jobs, which a filtered page merges (qftrio_jobs_filter_idx).

CREATE TABLE qftrio_job_counts (
    tenant          text NOT NULL,
    queue           text NOT NULL,
    kind            text NOT NULL,
    status          text NOT NULL,
    n               bigint NOT NULL
);
CREATE INDEX qftrio_job_counts_idx ON qftrio_job_counts (tenant, queue);

CREATE FUNCTION qftrio_jobs_counted_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO qftrio_job_counts (tenant, queue, kind, status, n)
    SELECT tenant, queue, kind, status, count(*) FROM qftrio_new GROUP BY tenant, queue, kind, status;
    RETURN NULL;
END $$;

-- A job's tenant, queue and kind never change; a heartbeat's statement
-- changes no status and appends nothing.
CREATE FUNCTION qftrio_jobs_counted_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO qftrio_job_counts (tenant, queue, kind, status, n)
    SELECT tenant, queue, kind, status, sum(n) FROM (
        SELECT tenant, queue, kind, status, -1 AS n FROM qftrio_old
        UNION ALL
        SELECT tenant, queue, kind, status, 1 AS n FROM qftrio_new
    ) AS d
    GROUP BY tenant, queue, kind, status
    HAVING sum(n) <> 0;
    RETURN NULL;
END $$;

CREATE FUNCTION qftrio_jobs_counted_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO qftrio_job_counts (tenant, queue, kind, status, n)
    SELECT tenant, queue, kind, status, -count(*) FROM qftrio_old GROUP BY tenant, queue, kind, status;
    RETURN NULL;
END $$;

-- The triggers first: from here on no write commits uncounted (creating
-- them locks out writers until this migration commits), then the count of
-- what is there.
CREATE TRIGGER qftrio_jobs_counted_insert AFTER INSERT ON qftrio_jobs
    REFERENCING NEW TABLE AS qftrio_new FOR EACH STATEMENT EXECUTE FUNCTION qftrio_jobs_counted_insert();
CREATE TRIGGER qftrio_jobs_counted_update AFTER UPDATE ON qftrio_jobs
    REFERENCING OLD TABLE AS qftrio_old NEW TABLE AS qftrio_new
    FOR EACH STATEMENT EXECUTE FUNCTION qftrio_jobs_counted_update();
CREATE TRIGGER qftrio_jobs_counted_delete AFTER DELETE ON qftrio_jobs
    REFERENCING OLD TABLE AS qftrio_old FOR EACH STATEMENT EXECUTE FUNCTION qftrio_jobs_counted_delete();

INSERT INTO qftrio_job_counts (tenant, queue, kind, status, n)
SELECT tenant, queue, kind, status, count(*) FROM qftrio_jobs GROUP BY tenant, queue, kind, status;

-- Paused (tenant, queue) pairs; claims look them up by queue.
CREATE TABLE qftrio_queue_pauses (
    queue           text NOT NULL,
    tenant          text NOT NULL,
    paused_at       double precision NOT NULL,
    PRIMARY KEY (queue, tenant)
);

-- When the attempt a report ends was claimed (the run time metric).
ALTER TABLE qftrio_jobs ADD COLUMN claimed_at double precision;

-- Pages: one (tenant, queue, status, kind) combination newest first; a page
-- of any filter merges the combinations the ledger lists for it. Replaces
-- the per-tenant index of 0001, so that a job's change updates no more
-- indexes than before.
CREATE INDEX qftrio_jobs_filter_idx ON qftrio_jobs (tenant, queue, status, kind, created_at DESC, id DESC);
DROP INDEX qftrio_jobs_list_idx;

-- A tenant's queue's oldest ready job and next scheduled one. "tenant IS
-- NOT NULL" is always true; a claim, which names no tenant, cannot prove
-- it, so claims stay on qftrio_jobs_claim_idx (see 0003) while the stats,
-- whose "tenant = ..." implies it, use this one.
CREATE INDEX qftrio_jobs_pending_tenant_idx ON qftrio_jobs (tenant, queue, scheduled_at)
    WHERE status = 'pending' AND tenant IS NOT NULL;
