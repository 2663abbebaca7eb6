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
