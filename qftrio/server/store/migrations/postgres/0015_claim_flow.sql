-- qftrio schema, version 0015: a claim weighs concurrency keys and rate
-- limits only when a candidate uses them.
--
-- The claim statement (queries/postgres.sql) calls these functions only
-- when one of its candidates has a concurrency key or a rate limit. Their
-- statements are planned and run only then: a claim of jobs that use
-- neither carries none of their plan (which, set up and torn down on every
-- claim, cost a drain without flow control more than the work itself).

-- The candidates (id, tenant, concurrency key and limit, rate limit, rank
-- within the tenant in lease order) a claim must hold back: one with a key
-- beyond its limit less the key's running jobs (counting the tenant's
-- candidates of the key before it), one with a rate limit beyond the units
-- left in its window (likewise; a limit no longer declared holds nothing
-- back). The keys' rows are locked first, then the rate limits' rows, each
-- in (tenant, name) order, and read as they are now: claims of one key or
-- limit on any server take turns, none sees a count another has raised,
-- and no two statements wait on each other in a cycle (reports lock the
-- keys in that order too).
CREATE FUNCTION qftrio_claim_held(ids uuid[], tenants text[], keys text[], limits int[], rate_limits text[],
    ranks bigint[], now float8) RETURNS uuid[]
LANGUAGE plpgsql AS $$
DECLARE
    held uuid[];
BEGIN
    -- One probe of each row, in order (not a join with every key ever used,
    -- which a plan could read whole).
    PERFORM 1 FROM (SELECT DISTINCT t, n FROM unnest(tenants, keys) AS c(t, n) WHERE n IS NOT NULL ORDER BY 1, 2) AS c
    CROSS JOIN LATERAL (
        SELECT 1 FROM qftrio_concurrency_running AS k WHERE k.tenant = c.t AND k.key = c.n FOR UPDATE) AS l;
    PERFORM 1 FROM (SELECT DISTINCT t, n FROM unnest(tenants, rate_limits) AS c(t, n) WHERE n IS NOT NULL ORDER BY 1, 2) AS c
    CROSS JOIN LATERAL (
        SELECT 1 FROM qftrio_rate_limits AS r WHERE r.tenant = c.t AND r.name = c.n FOR UPDATE) AS l;
    SELECT coalesce(array_agg(w.id), '{}') INTO held FROM (
        SELECT c.id,
            (c.key IS NULL OR row_number() OVER (PARTITION BY c.tenant, c.key ORDER BY c.rank)
                <= c.lim - coalesce(c.running, 0))
            AND (c.units IS NULL OR row_number() OVER (PARTITION BY c.tenant, c.rate ORDER BY c.rank) <= c.units)
            AS fits
        FROM (
            SELECT c.*,
                (SELECT k.running FROM qftrio_concurrency_running AS k
                 WHERE k.tenant = c.tenant AND k.key = c.key) AS running,
                (SELECT r."limit" - (SELECT count(*) FROM unnest(r.stamps) AS t WHERE t > now - r.per_secs)
                 FROM qftrio_rate_limits AS r WHERE r.tenant = c.tenant AND r.name = c.rate) AS units
            FROM unnest(ids, tenants, keys, limits, rate_limits, ranks) AS c(id, tenant, key, lim, rate, rank)
        ) AS c
    ) AS w WHERE NOT w.fits;
    RETURN held;
END $$;

-- The claims of a statement take their units: for each (tenant, rate limit)
-- of the claimed jobs, one time `now` each joins the newest "limit" ones
-- (transitions.rate_window: not those of this claim's window only, as
-- claims need not commit in the order of their times). The rows are locked
-- already (qftrio_claim_held).
CREATE FUNCTION qftrio_rate_take(tenants text[], rate_limits text[], now float8) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE qftrio_rate_limits AS r SET stamps = (
        SELECT coalesce(array_agg(t ORDER BY t), '{}') FROM (
            SELECT t FROM unnest(r.stamps) AS t
            UNION ALL SELECT now FROM generate_series(1, c.n)
            ORDER BY 1 DESC LIMIT r."limit") AS w)
    FROM (SELECT t, n AS name, count(*) AS n FROM unnest(tenants, rate_limits) AS c(t, n) GROUP BY 1, 2) AS c
    WHERE r.tenant = c.t AND r.name = c.name;
END $$;

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
