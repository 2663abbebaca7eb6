-- qftrio embedded schema, version 0011: what flow control holds back, seen.
--
-- A tenant's pending jobs by concurrency key and by rate limit, then queue
-- and time: queue stats count a queue's ready jobs held back by a key at its
-- limit (one range per key with running jobs) or by a rate limit with no
-- unit left (one range per such limit), never a walk of every pending job.
-- Only jobs that carry a key or a rate limit have entries.
CREATE INDEX jobs_concurrency_pending ON jobs (tenant, concurrency_key, queue, scheduled_at, concurrency_limit)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_rate_pending ON jobs (tenant, rate_limit, queue, scheduled_at)
    WHERE status = 'pending' AND rate_limit IS NOT NULL;
