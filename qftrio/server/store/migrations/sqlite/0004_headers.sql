-- qftrio embedded schema, version 0004: a job's headers (config.headers),
-- a JSON object of strings carried to its worker untouched; NULL when none.
ALTER TABLE jobs ADD COLUMN headers TEXT;
