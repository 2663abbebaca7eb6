-- qftrio embedded schema, version 0012: the last progress a job's handler
-- reported (a JSON object as text) and when.
ALTER TABLE jobs ADD COLUMN progress TEXT;
ALTER TABLE jobs ADD COLUMN progress_at REAL;
