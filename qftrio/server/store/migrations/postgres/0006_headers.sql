-- qftrio schema, version 0006: a job's headers (config.headers), a JSON
-- object of strings carried to its worker untouched; NULL when none. A
-- column with no default: adding it rewrites nothing.
ALTER TABLE qftrio_jobs ADD COLUMN headers jsonb;
