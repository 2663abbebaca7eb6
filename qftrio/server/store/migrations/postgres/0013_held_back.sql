-- qftrio schema, version 0013: what flow control holds back, seen and woken.
--
-- A tenant's pending jobs by concurrency key and by rate limit, then queue
-- and time: queue stats count a queue's ready jobs held back by a key at its
-- limit (one range per key with running jobs) or by a rate limit with no
-- unit left (one range per such limit), never a walk of every pending job.
-- Only jobs that carry a key or a rate limit have entries, so that jobs
-- without them cost no more to enqueue or claim.
CREATE INDEX qftrio_jobs_concurrency_pending_idx ON qftrio_jobs (tenant, concurrency_key, queue, scheduled_at)
    INCLUDE (concurrency_limit) WHERE status = 'pending' AND concurrency_key IS NOT NULL;
CREATE INDEX qftrio_jobs_rate_pending_idx ON qftrio_jobs (tenant, rate_limit, queue, scheduled_at)
    WHERE status = 'pending' AND rate_limit IS NOT NULL;

-- A job of a concurrency key that stops running frees a place of its key:
-- the queues holding pending jobs of the key (found by skipping through the
-- index above, one probe per queue) are notified on the channel of
-- postgres.CHANNEL, so that long polls parked on any server claim them at
-- once (delivered when the change commits), as an enqueue wakes them.
CREATE OR REPLACE FUNCTION qftrio_concurrency_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO qftrio_concurrency_running (tenant, key, running)
        VALUES (NEW.tenant, NEW.concurrency_key, (NEW.status = 'running')::int)
        ON CONFLICT (tenant, key) DO UPDATE
        SET running = qftrio_concurrency_running.running + (NEW.status = 'running')::int;
    ELSIF TG_OP = 'UPDATE' THEN
        UPDATE qftrio_concurrency_running
        SET running = running + CASE WHEN NEW.status = 'running' THEN 1 ELSE -1 END
        WHERE tenant = NEW.tenant AND key = NEW.concurrency_key;
        IF NEW.status <> 'running' THEN
            PERFORM pg_notify('qftrio_jobs', q.queue) FROM (
                WITH RECURSIVE queues AS (
                    (SELECT queue FROM qftrio_jobs
                     WHERE tenant = NEW.tenant AND concurrency_key = NEW.concurrency_key AND status = 'pending'
                     ORDER BY queue LIMIT 1)
                    UNION ALL
                    SELECT (SELECT j.queue FROM qftrio_jobs AS j
                            WHERE j.tenant = NEW.tenant AND j.concurrency_key = NEW.concurrency_key
                              AND j.status = 'pending' AND j.queue > w.queue
                            ORDER BY j.queue LIMIT 1)
                    FROM queues AS w WHERE w.queue IS NOT NULL
                )
                SELECT queue FROM queues WHERE queue IS NOT NULL
            ) AS q;
        END IF;
    ELSE
        UPDATE qftrio_concurrency_running SET running = running - 1
        WHERE tenant = OLD.tenant AND key = OLD.concurrency_key;
    END IF;
    RETURN NULL;
END $$;
