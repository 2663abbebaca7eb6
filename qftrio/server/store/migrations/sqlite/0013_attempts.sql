-- qftrio embedded schema, version 0013: a job's attempt history, its claims
-- oldest first (JSON text: [{attempt, worker_id, claimed_at, ended_at,
-- outcome, error}], times as epoch seconds); existing jobs start with none.
ALTER TABLE jobs ADD COLUMN attempts TEXT NOT NULL DEFAULT '[]';
