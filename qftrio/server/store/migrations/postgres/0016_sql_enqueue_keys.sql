-- qftrio schema, version 0016: jobs enqueued by qftrio_enqueue and
-- qftrio_enqueue_batch make their new concurrency keys' rows in order.
--
-- qftrio_enqueue_rows as in 0014, with the keys' rows made before the jobs.

CREATE OR REPLACE FUNCTION qftrio_enqueue_rows(tenant text, jobs jsonb[], now float8, OUT ids uuid[], OUT made boolean[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    -- a UUIDv7's first 48 bits: now in milliseconds (store.base.new_ids)
    stamp text := lpad(to_hex(floor(now * 1000)::bigint & x'FFFFFFFFFFFF'::bigint), 12, '0');
    keys text[];
BEGIN
    -- The rows of concurrency keys new to the table first, in (tenant, key)
    -- order, as the server's jobs_insert makes them: made job by job by the
    -- insert's trigger, two transactions bringing the same new keys in
    -- opposite orders would wait on each other in a cycle.
    INSERT INTO qftrio_concurrency_running (tenant, key, running)
    SELECT DISTINCT qftrio_enqueue_rows.tenant, u.j->'concurrency'->>'key', 0
    FROM unnest(jobs) AS u(j) WHERE u.j->'concurrency'->>'key' IS NOT NULL ORDER BY 1, 2
    ON CONFLICT (tenant, key) DO NOTHING;
    WITH items AS (
        SELECT i, j,
            -- version 7: the stamp, then the random bits of a version 4
            overlay(overlay(replace(gen_random_uuid()::text, '-', '') PLACING stamp FROM 1 FOR 12)
                    PLACING '7' FROM 13 FOR 1)::uuid AS id,
            row_number() OVER (PARTITION BY j->>'idempotency_key' ORDER BY i) AS nth
        FROM unnest(jobs) WITH ORDINALITY AS u(j, i)
    ), inserted AS (
        INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, priority, max_attempts,
            scheduled_at, idempotency_key, timeout_secs, backoff, headers,
            concurrency, concurrency_key, concurrency_limit, rate_limit, "unique", unique_key,
            status, attempt, created_at, updated_at)
        SELECT id, qftrio_enqueue_rows.tenant, j->>'queue', j->>'kind', j->'payload',
            (j->>'priority')::int, (j->>'max_attempts')::int,
            coalesce((j->>'scheduled_at')::numeric::float8, now + coalesce((j->>'delay_secs')::float8, 0)),
            j->>'idempotency_key', (j->>'timeout_secs')::int, j->'backoff', j->'headers',
            j->'concurrency', j->'concurrency'->>'key', (j->'concurrency'->>'limit')::int,
            j->>'rate_limit', j->'unique', j->'unique'->>'key',
            'pending', 0, now, now
        FROM items WHERE j->>'idempotency_key' IS NULL OR nth = 1
        ORDER BY i
        ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id, queue
    ), notified AS (
        SELECT count(pg_notify('qftrio_jobs', q.queue)) AS n FROM (SELECT DISTINCT queue FROM inserted) AS q
    )
    SELECT array_agg(ins.id ORDER BY i), array_agg(ins.id IS NOT NULL ORDER BY i),
        array_agg(items.j->>'idempotency_key' ORDER BY i)
    INTO ids, made, keys
    FROM items CROSS JOIN notified LEFT JOIN inserted AS ins ON ins.id = items.id;
    IF false = ANY (made) THEN
        -- A new snapshot: it sees the jobs this statement waited for.
        SELECT array_agg(coalesce(ids[k], (
            SELECT j.id FROM qftrio_jobs AS j
            WHERE j.tenant = qftrio_enqueue_rows.tenant AND j.idempotency_key = keys[k])) ORDER BY k)
        INTO ids FROM generate_subscripts(keys, 1) AS k;
        IF array_position(ids, NULL) IS NOT NULL THEN
            -- the job of the key vanished before it could be read (pruned)
            RAISE EXCEPTION USING ERRCODE = '40001',
                MESSAGE = 'an idempotency key changed hands during the insert; try again';
        END IF;
    END IF;
END $$;
