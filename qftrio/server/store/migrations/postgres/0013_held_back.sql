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

-- Running counts change in one order. A statement that starts or ends the
-- running of jobs with concurrency keys changes their keys' counts once, at
-- its end, key by key in (tenant, key) order: two batch reports (or a
-- report and a claim, which locks its keys in that order too) sharing keys
-- never wait on each other in a cycle, whatever order their rows are in.
-- (Per row, in the rows' order, two batches taking the same keys in
-- opposite orders deadlocked.) The job rows are locked before the keys by
-- every statement, the claim included.
--
-- A key whose job stopped running (completed, failed, snoozed, cancelled,
-- taken back) frees a place: the queues holding pending jobs of the key
-- (found by skipping through the index above, one probe per queue) are
-- notified on the channel of postgres.CHANNEL, so that long polls parked on
-- any server claim them at once (delivered when the change commits), as an
-- enqueue wakes them.
DROP TRIGGER qftrio_jobs_concurrency_update ON qftrio_jobs;

CREATE FUNCTION qftrio_concurrency_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moved record;
BEGIN
    FOR moved IN
        SELECT n.tenant, n.concurrency_key AS key, sum(CASE WHEN n.status = 'running' THEN 1 ELSE -1 END) AS delta,
            bool_or(n.status <> 'running') AS freed
        FROM qftrio_new AS n JOIN qftrio_old AS o ON o.id = n.id
        WHERE n.concurrency_key IS NOT NULL AND (o.status = 'running') <> (n.status = 'running')
        GROUP BY n.tenant, n.concurrency_key
        ORDER BY n.tenant, n.concurrency_key
    LOOP
        UPDATE qftrio_concurrency_running SET running = running + moved.delta
        WHERE tenant = moved.tenant AND key = moved.key;
        IF moved.freed THEN
            PERFORM pg_notify('qftrio_jobs', q.queue) FROM (
                WITH RECURSIVE queues AS (
                    (SELECT queue FROM qftrio_jobs
                     WHERE tenant = moved.tenant AND concurrency_key = moved.key AND status = 'pending'
                     ORDER BY queue LIMIT 1)
                    UNION ALL
                    SELECT (SELECT j.queue FROM qftrio_jobs AS j
                            WHERE j.tenant = moved.tenant AND j.concurrency_key = moved.key
                              AND j.status = 'pending' AND j.queue > w.queue
                            ORDER BY j.queue LIMIT 1)
                    FROM queues AS w WHERE w.queue IS NOT NULL
                )
                SELECT queue FROM queues WHERE queue IS NOT NULL
            ) AS q;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER qftrio_jobs_concurrency_moved AFTER UPDATE ON qftrio_jobs
    REFERENCING OLD TABLE AS qftrio_old NEW TABLE AS qftrio_new
    FOR EACH STATEMENT EXECUTE FUNCTION qftrio_concurrency_moved();

-- A new key's row; a pending job takes no place, so its insert changes (and
-- locks) no existing row.
CREATE OR REPLACE FUNCTION qftrio_concurrency_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' AND NEW.status = 'running' THEN
        INSERT INTO qftrio_concurrency_running (tenant, key, running) VALUES (NEW.tenant, NEW.concurrency_key, 1)
        ON CONFLICT (tenant, key) DO UPDATE SET running = qftrio_concurrency_running.running + 1;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO qftrio_concurrency_running (tenant, key, running) VALUES (NEW.tenant, NEW.concurrency_key, 0)
        ON CONFLICT (tenant, key) DO NOTHING;
    ELSE
        UPDATE qftrio_concurrency_running SET running = running - 1
        WHERE tenant = OLD.tenant AND key = OLD.concurrency_key;
    END IF;
    RETURN NULL;
END $$;
