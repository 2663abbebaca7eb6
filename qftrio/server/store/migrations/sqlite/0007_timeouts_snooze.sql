-- qftrio schema: a job's own timeout and backoff (as PostgreSQL's 0009).
--
-- timeout_secs and backoff are the job's policies as enqueued (null: none,
-- the server's default backoff). deadline is the running attempt's end,
-- its claim time plus timeout_secs, which no heartbeat extends the lease past;
-- a claim sets it anew.

ALTER TABLE jobs ADD COLUMN timeout_secs INTEGER;
ALTER TABLE jobs ADD COLUMN backoff TEXT;
ALTER TABLE jobs ADD COLUMN deadline REAL;
