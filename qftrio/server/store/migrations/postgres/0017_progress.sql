-- qftrio schema, version 0017: the last progress a job's handler reported
-- and when. Adding nullable columns rewrites no row.
ALTER TABLE qftrio_jobs ADD COLUMN progress jsonb;
ALTER TABLE qftrio_jobs ADD COLUMN progress_at double precision;

