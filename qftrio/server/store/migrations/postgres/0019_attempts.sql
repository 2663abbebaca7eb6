-- qftrio schema, version 0019: a job's attempt history, its claims oldest
-- first ([{attempt, worker_id, claimed_at, ended_at, outcome, error}], times
-- as epoch seconds); existing jobs start with none. A constant default
-- rewrites no row.
ALTER TABLE qftrio_jobs ADD COLUMN attempts jsonb NOT NULL DEFAULT '[]';
