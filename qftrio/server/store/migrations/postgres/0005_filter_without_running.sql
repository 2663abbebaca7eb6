-- qftrio schema, version 0005: the filter index holds no running job.
--
-- qftrio_jobs_filter_idx (0004) had an entry for every version of a job's
-- row, and a claim, which changes the status, made one more of them: about
-- a quarter of PostgreSQL's work per job went into it (docs/performance.md,
-- "PostgreSQL's CPU per job"). A page or bulk action over running jobs reads
-- them from qftrio_jobs_running_idx instead and sorts them: their number is
-- bounded by the leases workers hold.
--
-- The new index is built before the old one goes, so that reads go on while
-- it builds (writes wait: the migration is one transaction).

CREATE INDEX qftrio_jobs_filter_new_idx ON qftrio_jobs (tenant, queue, status, kind, created_at DESC, id DESC)
    WHERE status <> 'running';
DROP INDEX qftrio_jobs_filter_idx;
ALTER INDEX qftrio_jobs_filter_new_idx RENAME TO qftrio_jobs_filter_idx;
