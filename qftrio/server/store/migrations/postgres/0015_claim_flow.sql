-- qftrio schema, version 0015: a claim weighs concurrency keys and rate
-- limits only when a candidate uses them.
--
-- The claim statement (queries/postgres.sql) calls its functions only
-- when one of its candidates has a concurrency key or a rate limit. Their
-- statements are planned and run only then: a claim of jobs that use
-- neither carries none of their plan (which, set up and torn down on every
-- claim, cost a drain without flow control more than the work itself).

-- qftrio_claim_held and qftrio_rate_take are defined in functions.sql.

-- Running counts of concurrency keys move in the trigger that counts jobs
-- by status, which reads the statement's rows already: a statement that
-- changes statuses fires one trigger, not two, and one whose rows carry no
-- key skips the keys after one look at its new rows. The keys still change
-- once per statement, at its end, in (tenant, key) order (0013).
DROP TRIGGER qftrio_jobs_concurrency_moved ON qftrio_jobs;
DROP FUNCTION qftrio_concurrency_moved();

CREATE OR REPLACE FUNCTION qftrio_jobs_counted_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moved record;
BEGIN
    INSERT INTO qftrio_job_counts (tenant, queue, kind, status, n)
    SELECT tenant, queue, kind, status, sum(n) FROM (
        SELECT tenant, queue, kind, status, -1 AS n FROM qftrio_old
        UNION ALL
        SELECT tenant, queue, kind, status, 1 AS n FROM qftrio_new
    ) AS d
    GROUP BY tenant, queue, kind, status
    HAVING sum(n) <> 0;
    IF NOT EXISTS (SELECT 1 FROM qftrio_new WHERE concurrency_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
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
        -- A freed place wakes the polls of the queues holding pending jobs
        -- of the key (0013).
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
