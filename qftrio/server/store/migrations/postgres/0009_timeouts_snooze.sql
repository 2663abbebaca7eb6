-- qftrio schema, version 0009: a job's own timeout and backoff.
--
-- timeout_secs and backoff are the job's policies as enqueued (null: none,
-- the server's default backoff). deadline is the running attempt's end,
-- its claim time plus timeout_secs, which no heartbeat extends the lease past;
-- a claim sets it anew. Adding nullable columns rewrites no row.

ALTER TABLE qftrio_jobs ADD COLUMN timeout_secs integer;
ALTER TABLE qftrio_jobs ADD COLUMN backoff jsonb;
ALTER TABLE qftrio_jobs ADD COLUMN deadline double precision;
