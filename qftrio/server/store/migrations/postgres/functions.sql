-- qftrio's functions: the current definition of every function that
-- statements call (queries/postgres.sql) and applications call
-- (docs/sql-enqueue.md), re-applied by every migration that finds them
-- changed (store/postgres.py, _migrate_on), in the transaction of the
-- numbered migrations; a function a trigger runs stays in the numbered
-- migration that created the trigger.
--
-- A name in double braces is a placeholder: Model.field.keyword names the
-- keyword (maximum, exclusiveMinimum, default, ...) of a field of a request
-- model of qftrio.models, as its JSON schema states it, and NAME a constant
-- of qftrio.models; each is written as an SQL literal when the file is read
-- (store/sql.py, functions; JOB_WIRE is the expression of a job's wire
-- form), so that the bounds and defaults the route
-- enforces are written here by the models alone (tests/test_store_sql.py).


-- Flow control of the claim (0015). The claim statement calls these
-- functions only when one of its candidates has a concurrency key or a rate
-- limit. Their statements are planned and run only then: a claim of jobs
-- that use neither carries none of their plan (which, set up and torn down
-- on every claim, cost a drain without flow control more than the work
-- itself).

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
CREATE OR REPLACE FUNCTION qftrio_claim_held(ids uuid[], tenants text[], keys text[], limits int[], rate_limits text[],
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
CREATE OR REPLACE FUNCTION qftrio_rate_take(tenants text[], rate_limits text[], now float8) RETURNS void
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



-- Enqueue from SQL, inside the application's own transaction (0014, 0016;
-- docs/sql-enqueue.md).
--
--   SELECT * FROM qftrio_enqueue(tenant, kind, payload, config)
--       -> one row (id uuid, created boolean, job jsonb)
--   SELECT * FROM qftrio_enqueue_batch(tenant, jobs)
--       -> a row per job of the array jobs ([{kind, payload, config}], at
--          most 1000), in their order
--
-- Each job is checked as POST /api/v1/jobs (and /api/v1/jobs/batch) checks
-- it, and inserted as the server inserts it: a time-ordered UUIDv7 id,
-- the idempotency key and unique rules (the same advisory locks), the counts
-- kept by the table's own triggers, and a NOTIFY on the channel the servers
-- LISTEN on, which PostgreSQL delivers when the transaction commits: the job
-- exists, and the long polls wake, if and only if the caller commits.
-- `job` is the job as the HTTP API answers it; `created` is false when an
-- idempotency key or a unique key answered an existing job (the route's 200).
--
-- Bad input raises SQLSTATE 22023 (invalid_parameter_value), its message
-- "field: what is wrong" and its column name the field, and stores nothing.
-- tests/test_sql_enqueue.py sends one table of good and bad jobs through
-- this function and through the HTTP route, and asserts the same answer.
--
-- The functions run with the privileges of their caller (the servers'
-- data-only role suffices) and find qftrio's tables in the schema this
-- migration created them in, whatever the caller's search_path.

-- Refuse the call: `field` names what is wrong, as the route's 422 does.
CREATE OR REPLACE FUNCTION qftrio_enqueue_refuse(field text, message text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = field || ': ' || message, COLUMN = field;
END $$;

-- The path of a field inside `field` ('' is the top level).
CREATE OR REPLACE FUNCTION qftrio_enqueue_at(field text, key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT CASE WHEN field = '' THEN key ELSE field || '.' || key END $$;

-- A JSON object holding only the keys `known`, or refused.
CREATE OR REPLACE FUNCTION qftrio_enqueue_object(value jsonb, field text, known text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    extra text;
BEGIN
    IF jsonb_typeof(value) IS DISTINCT FROM 'object' THEN
        PERFORM qftrio_enqueue_refuse(field, 'must be a JSON object');
    END IF;
    SELECT k INTO extra FROM jsonb_object_keys(value) AS k WHERE k <> ALL (known) ORDER BY k LIMIT 1;
    IF extra IS NOT NULL THEN
        PERFORM qftrio_enqueue_refuse(qftrio_enqueue_at(field, extra), 'unknown field');
    END IF;
    RETURN value;
END $$;

-- A JSON number as the double the route reads it as (one too large for a
-- double is infinite here, and out of every field's range; one too small is
-- 0, as the route's JSON parser reads it).
CREATE OR REPLACE FUNCTION qftrio_enqueue_double(value jsonb, field text) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    n numeric;
BEGIN
    IF jsonb_typeof(value) IS DISTINCT FROM 'number' THEN
        PERFORM qftrio_enqueue_refuse(field, 'must be a JSON number');
    END IF;
    n := (value #>> '{}')::numeric;
    IF abs(n) > 1.7976931348623157e308 THEN
        RETURN sign(n) * 'Infinity'::float8;
    ELSIF abs(n) < 1e-320 THEN
        RETURN 0;
    END IF;
    RETURN n::float8;
END $$;

-- A number field: a double within [lo, hi] ((lo, hi] when lo_open).
CREATE OR REPLACE FUNCTION qftrio_enqueue_float(value jsonb, field text, lo float8, lo_open boolean, hi float8) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    f float8 := qftrio_enqueue_double(value, field);
BEGIN
    IF lo_open AND f <= lo THEN
        PERFORM qftrio_enqueue_refuse(field, format('must be greater than %s', lo));
    ELSIF f < lo THEN
        PERFORM qftrio_enqueue_refuse(field, format('must be at least %s', lo));
    ELSIF f > hi THEN
        PERFORM qftrio_enqueue_refuse(field, format('must be at most %s', hi));
    END IF;
    RETURN f;
END $$;

-- An integer field within [lo, hi]: a JSON integer, or a number with no
-- fractional part once read as a double (3.0 is 3), as the route takes it.
CREATE OR REPLACE FUNCTION qftrio_enqueue_int(value jsonb, field text, lo bigint, hi bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n numeric;
    f float8;
BEGIN
    IF jsonb_typeof(value) IS DISTINCT FROM 'number' THEN
        PERFORM qftrio_enqueue_refuse(field, 'must be a JSON number');
    END IF;
    IF strpos(value #>> '{}', '.') > 0 THEN
        f := qftrio_enqueue_double(value, field);
        IF f <> trunc(f) OR f IN ('Infinity', '-Infinity') THEN
            PERFORM qftrio_enqueue_refuse(field, 'must be an integer');
        END IF;
        n := f::numeric;
    ELSE
        n := (value #>> '{}')::numeric;
    END IF;
    IF n < lo THEN
        PERFORM qftrio_enqueue_refuse(field, format('must be at least %s', lo));
    ELSIF n > hi THEN
        PERFORM qftrio_enqueue_refuse(field, format('must be at most %s', hi));
    END IF;
    RETURN n::bigint;
END $$;

-- A string field of min_len..max_len characters.
CREATE OR REPLACE FUNCTION qftrio_enqueue_text(value jsonb, field text, min_len int, max_len int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    s text;
BEGIN
    IF jsonb_typeof(value) IS DISTINCT FROM 'string' THEN
        PERFORM qftrio_enqueue_refuse(field, 'must be a string');
    END IF;
    s := value #>> '{}';
    IF char_length(s) < min_len THEN
        PERFORM qftrio_enqueue_refuse(field, format('must hold at least %s character(s)', min_len));
    ELSIF char_length(s) > max_len THEN
        PERFORM qftrio_enqueue_refuse(field, format('must hold at most %s characters', max_len));
    END IF;
    RETURN s;
END $$;

-- A queue, kind or rate limit name (models.NAME_PATTERN).
CREATE OR REPLACE FUNCTION qftrio_enqueue_name(value jsonb, field text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(value) IS DISTINCT FROM 'string' OR (value #>> '{}') !~ {{NAME_PATTERN}} THEN
        PERFORM qftrio_enqueue_refuse(field, 'must match ' || {{NAME_PATTERN}});
    END IF;
    RETURN value #>> '{}';
END $$;

-- A double as JSON, written as the server writes a float (its shortest
-- exact form, "2.0" rather than "2"), so that both store the same jsonb.
CREATE OR REPLACE FUNCTION qftrio_enqueue_json_float(f float8) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN f::text ~ '[.e]' THEN f::text ELSE f::text || '.0' END::jsonb
$$;

-- config.scheduled_at as epoch seconds: the forms the route reads (RFC 3339
-- and ISO 8601 date-times, T, t, _ or a space between date and time, the
-- seconds and their fraction optional, a fraction cut to microseconds, no
-- offset meaning UTC; a date alone is its midnight, UTC; a string of
-- digits is Unix seconds, or milliseconds beyond 2e10).
CREATE OR REPLACE FUNCTION qftrio_enqueue_time(value jsonb, field text) RETURNS numeric
LANGUAGE plpgsql AS $$
DECLARE
    s text;
    m text[];
    local_secs numeric;
    offset_secs int := 0;
    secs numeric;
    epoch numeric;
BEGIN
    IF jsonb_typeof(value) IS DISTINCT FROM 'string' THEN
        PERFORM qftrio_enqueue_refuse(field, 'must be an RFC 3339 time string');
    END IF;
    s := value #>> '{}';
    IF s ~ '^[+-]?[0-9]+(\.[0-9]*)?$' THEN
        epoch := s::numeric;
        IF abs(epoch) > 2e10 THEN
            epoch := epoch / 1000;
        END IF;
        IF epoch < -62135596800 OR epoch >= 253402300800 THEN  -- years 1 to 9999
            PERFORM qftrio_enqueue_refuse(field, 'must be an RFC 3339 time string (out of range)');
        ELSIF epoch >= 253370764800 THEN  -- the year 9999
            PERFORM qftrio_enqueue_refuse('config', 'scheduled_at must be before the year 9999');
        END IF;
        -- to microseconds, as the route's parser reads the number (a double)
        epoch := extract(epoch FROM to_timestamp(epoch::float8));
        RETURN epoch;
    END IF;
    m := regexp_match(s,
        '^([0-9]{4})-([0-9]{2})-([0-9]{2})'
        '(?:[Tt_ ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:[.,]([0-9]+))?)?'
        '([Zz]|[+-][0-9]{2}:?[0-9]{2})?)?$');
    IF m IS NULL OR m[1]::int = 0 OR m[4]::int > 23 OR m[5]::int > 59 OR m[6]::int > 59
            OR (m[8] IS NOT NULL AND m[8] !~ '^[Zz]$'
                AND (substr(m[8], 2, 2)::int > 23 OR right(m[8], 2)::int > 59)) THEN
        PERFORM qftrio_enqueue_refuse(field, 'must be an RFC 3339 time string');
    END IF;
    IF m[8] IS NOT NULL AND m[8] !~ '^[Zz]$' THEN
        offset_secs := (substr(m[8], 2, 2)::int * 3600 + right(m[8], 2)::int * 60)
            * CASE WHEN left(m[8], 1) = '-' THEN -1 ELSE 1 END;
    END IF;
    secs := coalesce(m[6], '0')::numeric + coalesce(('0.' || left(m[7], 6))::numeric, 0);
    BEGIN
        local_secs := extract(epoch FROM make_timestamp(
            m[1]::int, m[2]::int, m[3]::int, coalesce(m[4], '0')::int, coalesce(m[5], '0')::int, 0));
    EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN
        PERFORM qftrio_enqueue_refuse(field, 'must be an RFC 3339 time string (no such day)');
    END;
    -- the year as written, in its own offset, as the route checks it
    IF m[1]::int = 9999 THEN
        PERFORM qftrio_enqueue_refuse('config', 'scheduled_at must be before the year 9999');
    END IF;
    RETURN local_secs + secs - offset_secs;
END $$;

-- One job ({kind, payload, config}, checked as the route checks it) at
-- `field` ('' for qftrio_enqueue, 'jobs.N' for the batch), as a record of
-- what to insert: every default filled in, floats written as the server
-- writes them, scheduled_at as epoch seconds or delay_secs.
CREATE OR REPLACE FUNCTION qftrio_enqueue_check(job jsonb, field text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    config jsonb;
    at text := qftrio_enqueue_at(field, 'config');
    v jsonb;
    sub jsonb;
    k text;
    checked jsonb := '{}';
    size bigint := 0;
    bad bigint;
BEGIN
    PERFORM qftrio_enqueue_object(job, field, ARRAY['kind', 'payload', 'config']);
    IF job->'kind' IS NULL THEN
        PERFORM qftrio_enqueue_refuse(qftrio_enqueue_at(field, 'kind'), 'required');
    END IF;
    checked := checked || jsonb_build_object('kind', qftrio_enqueue_name(job->'kind', qftrio_enqueue_at(field, 'kind')));
    v := coalesce(job->'payload', '{}');
    IF jsonb_typeof(v) <> 'object' THEN
        PERFORM qftrio_enqueue_refuse(qftrio_enqueue_at(field, 'payload'), 'must be a JSON object');
    END IF;
    -- The numbers the route cannot hold (read only in a payload long
    -- enough to hold one): a fraction beyond a double's range, an integer
    -- of more than 4300 digits.
    IF octet_length(v::text) > 308 THEN
        SELECT t INTO k FROM jsonb_path_query(v, 'strict $.**') AS n, LATERAL (SELECT n::text AS t) AS written
        WHERE jsonb_typeof(n) = 'number' AND CASE WHEN strpos(t, '.') > 0
            THEN abs(t::numeric) > 1.7976931348623157e308 ELSE length(ltrim(t, '-')) > 4300 END
        LIMIT 1;
        IF k IS NOT NULL THEN
            PERFORM qftrio_enqueue_refuse(qftrio_enqueue_at(field, 'payload'), CASE WHEN strpos(k, '.') > 0
                THEN 'holds a number beyond the range of a JSON number' ELSE 'holds an integer of more than 4300 digits' END);
        END IF;
    END IF;
    checked := checked || jsonb_build_object('payload', v);
    config := qftrio_enqueue_object(coalesce(job->'config', '{}'), at, ARRAY[
        'queue', 'priority', 'max_attempts', 'delay_secs', 'scheduled_at', 'idempotency_key', 'timeout_secs',
        'backoff', 'headers', 'concurrency', 'rate_limit', 'unique']);

    checked := checked || jsonb_build_object(
        'queue', CASE WHEN config ? 'queue' THEN qftrio_enqueue_name(config->'queue', at || '.queue') ELSE {{JobConfig.queue.default}} END,
        'priority', CASE WHEN config ? 'priority'
            THEN qftrio_enqueue_int(config->'priority', at || '.priority',
                {{JobConfig.priority.minimum}}, {{JobConfig.priority.maximum}}) ELSE {{JobConfig.priority.default}} END,
        'max_attempts', CASE WHEN config ? 'max_attempts'
            THEN qftrio_enqueue_int(config->'max_attempts', at || '.max_attempts',
                {{JobConfig.max_attempts.minimum}}, {{JobConfig.max_attempts.maximum}}) ELSE {{JobConfig.max_attempts.default}} END);

    v := config->'delay_secs';
    IF v IS NOT NULL AND v <> 'null' THEN
        checked := checked || jsonb_build_object('delay_secs', qftrio_enqueue_json_float(
            qftrio_enqueue_float(v, at || '.delay_secs', {{JobConfig.delay_secs.range}})));
    END IF;
    v := config->'scheduled_at';
    IF v IS NOT NULL AND v <> 'null' THEN
        checked := checked || jsonb_build_object('scheduled_at', qftrio_enqueue_time(v, at || '.scheduled_at'));
        IF checked ? 'delay_secs' THEN
            PERFORM qftrio_enqueue_refuse(at, 'give delay_secs or scheduled_at, not both');
        END IF;
    END IF;

    v := config->'idempotency_key';
    IF v IS NOT NULL AND v <> 'null' THEN
        checked := checked || jsonb_build_object('idempotency_key', qftrio_enqueue_text(v, at || '.idempotency_key',
            {{JobConfig.idempotency_key.minLength}}, {{JobConfig.idempotency_key.maxLength}}));
    END IF;
    v := config->'timeout_secs';
    IF v IS NOT NULL AND v <> 'null' THEN
        checked := checked || jsonb_build_object('timeout_secs', qftrio_enqueue_int(v, at || '.timeout_secs',
            {{JobConfig.timeout_secs.minimum}}, {{JobConfig.timeout_secs.maximum}}));
    END IF;

    v := config->'backoff';
    IF v IS NOT NULL AND v <> 'null' THEN
        PERFORM qftrio_enqueue_object(v, at || '.backoff', ARRAY['initial_secs', 'factor', 'max_secs', 'jitter']);
        checked := checked || jsonb_build_object('backoff', jsonb_build_object(
            'initial_secs', qftrio_enqueue_json_float(CASE WHEN v ? 'initial_secs'
                THEN qftrio_enqueue_float(v->'initial_secs', at || '.backoff.initial_secs', {{BackoffConfig.initial_secs.range}})
                ELSE {{BackoffConfig.initial_secs.default}} END),
            'factor', qftrio_enqueue_json_float(CASE WHEN v ? 'factor'
                THEN qftrio_enqueue_float(v->'factor', at || '.backoff.factor', {{BackoffConfig.factor.range}})
                ELSE {{BackoffConfig.factor.default}} END),
            'max_secs', qftrio_enqueue_json_float(CASE WHEN v ? 'max_secs'
                THEN qftrio_enqueue_float(v->'max_secs', at || '.backoff.max_secs', {{BackoffConfig.max_secs.range}})
                ELSE {{BackoffConfig.max_secs.default}} END),
            'jitter', qftrio_enqueue_json_float(CASE WHEN v ? 'jitter'
                THEN qftrio_enqueue_float(v->'jitter', at || '.backoff.jitter', {{BackoffConfig.jitter.range}})
                ELSE {{BackoffConfig.jitter.default}} END)));
    END IF;

    -- Headers go to workers as they are, maybe as the headers of HTTP
    -- requests: names are HTTP field names, values hold no control
    -- character but the tab, 8 KiB of names and values in all (UTF-8).
    v := config->'headers';
    IF v IS NOT NULL AND v <> 'null' THEN
        IF jsonb_typeof(v) <> 'object' THEN
            PERFORM qftrio_enqueue_refuse(at || '.headers', 'must be a JSON object');
        END IF;
        FOR k, sub IN SELECT * FROM jsonb_each(v) LOOP
            IF k !~ {{HEADER_NAME_PATTERN}} OR char_length(k) > {{MAX_HEADER_NAME}} THEN
                PERFORM qftrio_enqueue_refuse(at || '.headers.' || k, 'a header name must be 1-' || {{MAX_HEADER_NAME}}
                    || ' characters of A-Z a-z 0-9 ! # $ % & '' * + . ^ _ ` | ~ -');
            END IF;
            IF jsonb_typeof(sub) <> 'string' THEN
                PERFORM qftrio_enqueue_refuse(at || '.headers.' || k, 'must be a string');
            END IF;
            IF (sub #>> '{}') !~ {{HEADER_VALUE_PATTERN}} THEN
                PERFORM qftrio_enqueue_refuse(at || '.headers.' || k, 'must hold no control character (a tab is allowed)');
            END IF;
            size := size + octet_length(k) + octet_length(sub #>> '{}');
        END LOOP;
        IF size > {{MAX_HEADERS_BYTES}} THEN
            PERFORM qftrio_enqueue_refuse(at || '.headers',
                format('names and values hold %s bytes in all, over the %s allowed', size, {{MAX_HEADERS_BYTES}}));
        END IF;
        IF v <> '{}' THEN  -- no headers is none
            checked := checked || jsonb_build_object('headers', v);
        END IF;
    END IF;

    v := config->'concurrency';
    IF v IS NOT NULL AND v <> 'null' THEN
        PERFORM qftrio_enqueue_object(v, at || '.concurrency', ARRAY['key', 'limit']);
        IF NOT v ? 'key' THEN
            PERFORM qftrio_enqueue_refuse(at || '.concurrency.key', 'required');
        END IF;
        checked := checked || jsonb_build_object('concurrency', jsonb_build_object(
            'key', qftrio_enqueue_text(v->'key', at || '.concurrency.key',
                {{ConcurrencyConfig.key.minLength}}, {{ConcurrencyConfig.key.maxLength}}),
            'limit', CASE WHEN v ? 'limit'
                THEN qftrio_enqueue_int(v->'limit', at || '.concurrency.limit',
                    {{ConcurrencyConfig.limit.minimum}}, {{ConcurrencyConfig.limit.maximum}})
                ELSE {{ConcurrencyConfig.limit.default}} END));
    END IF;

    v := config->'rate_limit';
    IF v IS NOT NULL AND v <> 'null' THEN
        checked := checked || jsonb_build_object('rate_limit', qftrio_enqueue_name(v, at || '.rate_limit'));
    END IF;

    v := config->'unique';
    IF v IS NOT NULL AND v <> 'null' THEN
        PERFORM qftrio_enqueue_object(v, at || '.unique', ARRAY['key', 'statuses', 'period_secs']);
        IF NOT v ? 'key' THEN
            PERFORM qftrio_enqueue_refuse(at || '.unique.key', 'required');
        END IF;
        sub := coalesce(v->'statuses', {{UniqueConfig.statuses.default}});
        IF jsonb_typeof(sub) <> 'array'
                OR jsonb_array_length(sub) NOT BETWEEN {{UniqueConfig.statuses.minItems}} AND {{UniqueConfig.statuses.maxItems}} THEN
            PERFORM qftrio_enqueue_refuse(at || '.unique.statuses', format('must be a list of %s to %s statuses',
                {{UniqueConfig.statuses.minItems}}, {{UniqueConfig.statuses.maxItems}}));
        END IF;
        SELECT i - 1 INTO bad FROM jsonb_array_elements(sub) WITH ORDINALITY AS s(status, i)
        WHERE status NOT IN ('"pending"', '"running"', '"completed"', '"failed"', '"cancelled"') ORDER BY i LIMIT 1;
        IF FOUND THEN
            PERFORM qftrio_enqueue_refuse(at || '.unique.statuses.' || bad,
                'must be ''pending'', ''running'', ''completed'', ''failed'' or ''cancelled''');
        END IF;
        checked := checked || jsonb_build_object('unique', jsonb_build_object(
            'key', qftrio_enqueue_text(v->'key', at || '.unique.key',
                {{UniqueConfig.key.minLength}}, {{UniqueConfig.key.maxLength}}),
            'statuses', sub,
            'period_secs', CASE WHEN v->'period_secs' IS NOT NULL AND v->'period_secs' <> 'null'
                THEN qftrio_enqueue_json_float(
                    qftrio_enqueue_float(v->'period_secs', at || '.unique.period_secs', {{UniqueConfig.period_secs.range}}))
                END));
    END IF;
    RETURN checked;
END $$;

-- A job's time on the wire: RFC 3339, UTC, microseconds, rounded as the
-- server rounds them (qftrio.models.format_time). One expression, which
-- PostgreSQL inlines into the query calling it.
CREATE OR REPLACE FUNCTION qftrio_wire_time(t float8) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT to_char(to_timestamp(floor(t) + (round((t - floor(t)) * 1e6) = 1e6)::int) AT TIME ZONE 'UTC',
                   'YYYY-MM-DD"T"HH24:MI:SS')
        || '.' || lpad((round((t - floor(t)) * 1e6)::int % 1000000)::text, 6, '0') || 'Z'
$$;

-- A job's error history on the wire ([{attempt, error, at}], at as a time).
CREATE OR REPLACE FUNCTION qftrio_wire_errors(errors jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('attempt', e->'attempt', 'error', e->'error',
                                                 'at', qftrio_wire_time((e->>'at')::float8)) ORDER BY i), '[]')
    FROM jsonb_array_elements(errors) WITH ORDINALITY AS x(e, i)
$$;

-- A job's attempt history on the wire (times as times).
CREATE OR REPLACE FUNCTION qftrio_wire_attempts(attempts jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(e || jsonb_build_object(
        'claimed_at', qftrio_wire_time((e->>'claimed_at')::float8),
        'ended_at', CASE WHEN e->>'ended_at' IS NOT NULL THEN qftrio_wire_time((e->>'ended_at')::float8) END
    ) ORDER BY i), '[]')
    FROM jsonb_array_elements(attempts) WITH ORDINALITY AS x(e, i)
$$;

-- The attempt history's entry of one claim: its number, who and when, and
-- when and how it ended (null while it runs).
CREATE OR REPLACE FUNCTION qftrio_attempt(attempt int, worker_id text, claimed_at float8, ended_at float8,
                                          outcome text, error text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('attempt', attempt, 'worker_id', worker_id, 'claimed_at', claimed_at,
                              'ended_at', ended_at, 'outcome', outcome, 'error', error)
$$;

-- A job's attempt history with its running attempt ended (when, how, with
-- what error), from the row's own attempt, worker_id and claimed_at, which
-- the claim set. The history keeps the ended attempts but a completed one,
-- which is read from the row as the running one is (qftrio_wire_job_attempts),
-- so that neither a claim nor a completion writes it. The oldest entry goes
-- past MAX_ATTEMPTS_KEPT. Every caller ends running jobs only.
--
-- These functions are no more than STABLE, as what they call
-- (jsonb_build_object), and their arguments are columns or values: so
-- PostgreSQL inlines them into the statement. An IMMUTABLE one calling STABLE
-- functions would run as a call of its own for every row, a drain's database
-- CPU a third higher.
CREATE OR REPLACE FUNCTION qftrio_attempt_end(attempts jsonb, attempt int, worker_id text, claimed_at float8,
                                              outcome text, error text, at float8) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN jsonb_array_length(attempts) >= {{MAX_ATTEMPTS_KEPT}} THEN attempts - 0 ELSE attempts END
        || jsonb_build_array(qftrio_attempt(attempt, worker_id, claimed_at, at, outcome, error))
$$;

-- A job's attempts on the wire (qftrio.models.attempt_history): its ended
-- attempts, and its running or completed one from the row (a completed job's
-- updated_at is when it completed), unless an older version wrote the
-- completed one into the history (then last: a completed job is never
-- claimed again).
CREATE OR REPLACE FUNCTION qftrio_wire_job_attempts(j qftrio_jobs) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT qftrio_wire_attempts(jsonb_path_query_array(
        j.attempts || CASE
            WHEN j.claimed_at IS NULL THEN '[]'
            WHEN j.status = 'running'
            THEN jsonb_build_array(qftrio_attempt(j.attempt, j.worker_id, j.claimed_at, NULL, 'running', NULL))
            WHEN j.status = 'completed' AND j.attempts->-1->>'outcome' IS DISTINCT FROM 'completed'
            THEN jsonb_build_array(qftrio_attempt(j.attempt, j.worker_id, j.claimed_at, j.updated_at, 'completed', NULL))
            ELSE '[]' END,
        '$[last - ({{MAX_ATTEMPTS_KEPT}} - 1) to last]'))
$$;

-- A job as the HTTP API answers it (qftrio.models.Job.to_wire), written
-- from Job's fields (store/sql.py, job_wire). One expression too (a new job
-- has no error history to read).
CREATE OR REPLACE FUNCTION qftrio_job_wire(j qftrio_jobs) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT {{JOB_WIRE}}
$$;

-- Insert `jobs` (checked records) of `tenant` in one statement, as the
-- server's jobs_insert does: a repeated idempotency key stands for its
-- first job, and a key taken already (committed, or by a transaction this
-- one waited for) answers that job; the new jobs' queues notified, which
-- PostgreSQL delivers at commit. Answers each job's id and whether it is new.
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

-- Enqueue the checked jobs `jobs` (qftrio_enqueue_check's records) of
-- `tenant` in the caller's transaction, as the server's insert does: one
-- row per job, in order; `field` names the jobs in errors.
CREATE OR REPLACE FUNCTION qftrio_enqueue_insert(tenant text, jobs jsonb[], field text)
RETURNS TABLE (id uuid, created boolean, job jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    now float8 := extract(epoch FROM clock_timestamp());
    missing text;
    first_at bigint;
    ids uuid[] := '{}';
    made boolean[] := '{}';
    one record;
    item jsonb;
    found_id uuid;
BEGIN
    -- A rate limit the tenant has not declared would hold nothing back.
    SELECT j->>'rate_limit', i - 1 INTO missing, first_at FROM unnest(jobs) WITH ORDINALITY AS u(j, i)
    WHERE j ? 'rate_limit' AND NOT EXISTS (
        SELECT 1 FROM qftrio_rate_limits AS r
        WHERE r.tenant = qftrio_enqueue_insert.tenant AND r.name = j->>'rate_limit')
    ORDER BY i LIMIT 1;
    IF missing IS NOT NULL THEN
        PERFORM qftrio_enqueue_refuse(
            CASE WHEN field = '' THEN 'config.rate_limit' ELSE format('%s.%s.config.rate_limit', field, first_at) END,
            format('no rate limit named %L', missing));
    END IF;

    IF NOT EXISTS (SELECT 1 FROM unnest(jobs) AS j WHERE j ? 'unique') THEN
        SELECT * INTO one FROM qftrio_enqueue_rows(tenant, jobs, now);
        ids := one.ids;
        made := one.made;
    ELSE
        -- The lookup after the lock must see what the transactions it waited
        -- for committed: a snapshot older than the lock (REPEATABLE READ,
        -- SERIALIZABLE) would not, and would let a second job of the key in.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION USING ERRCODE = '0A000', COLUMN = 'config.unique', MESSAGE = format(
                'config.unique: a unique job is enqueued only in a READ COMMITTED transaction, not %s',
                upper(current_setting('transaction_isolation')));
        END IF;
        -- The (tenant, key) pairs of unique jobs, locked in order until the
        -- transaction ends, as the server's unique_lock: concurrent inserts
        -- of one key on any server, or here, take turns. Then each job in
        -- turn, so that a repeat later in the batch finds the first.
        PERFORM count(pg_advisory_xact_lock(7265, hashtext(t || chr(1) || k)))
        FROM (SELECT DISTINCT qftrio_enqueue_insert.tenant AS t, j->'unique'->>'key' AS k
              FROM unnest(jobs) AS j WHERE j ? 'unique' ORDER BY 1, 2) AS keys;
        FOREACH item IN ARRAY jobs LOOP
            found_id := NULL;
            IF item ? 'unique' THEN
                SELECT j.id INTO found_id FROM qftrio_jobs AS j
                WHERE j.tenant = qftrio_enqueue_insert.tenant AND j.unique_key = item->'unique'->>'key'
                  AND j.created_at > coalesce(now - (item->'unique'->>'period_secs')::float8, '-Infinity')
                  AND j.status IN (SELECT jsonb_array_elements_text(item->'unique'->'statuses'))
                ORDER BY j.created_at DESC LIMIT 1;
            END IF;
            IF found_id IS NOT NULL THEN
                ids := ids || found_id;
                made := made || false;
            ELSE
                SELECT * INTO one FROM qftrio_enqueue_rows(tenant, ARRAY[item], now);
                ids := ids || one.ids;
                made := made || one.made;
            END IF;
        END LOOP;
    END IF;

    -- each job read by its key (a join may hash the whole table)
    RETURN QUERY
    SELECT ids[p], made[p], (SELECT qftrio_job_wire(j) FROM qftrio_jobs AS j WHERE j.id = ids[p])
    FROM generate_subscripts(ids, 1) AS p
    ORDER BY p;
END $$;

-- The job's (or batch's) JSON is capped as the route caps a request's body:
-- 1 MiB, or the setting qftrio.max_body_bytes (ALTER DATABASE ... SET
-- qftrio.max_body_bytes = ..., as the servers' --max-body-bytes).
CREATE OR REPLACE FUNCTION qftrio_enqueue_fits(tenant text, value jsonb, field text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    cap bigint := coalesce(nullif(current_setting('qftrio.max_body_bytes', true), '')::bigint, 1048576);
    size bigint := octet_length(value::text);
BEGIN
    IF tenant IS NULL OR tenant = '' THEN
        PERFORM qftrio_enqueue_refuse('tenant', 'must name a tenant');
    END IF;
    IF size > cap THEN
        PERFORM qftrio_enqueue_refuse(field,
            format('the JSON is %s bytes, over the %s allowed (qftrio.max_body_bytes)', size, cap));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION qftrio_enqueue(tenant text, kind text, payload jsonb DEFAULT '{}', config jsonb DEFAULT '{}',
    OUT id uuid, OUT created boolean, OUT job jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    request jsonb := jsonb_build_object('kind', kind, 'payload', payload, 'config', config);
BEGIN
    PERFORM qftrio_enqueue_fits(tenant, request, 'payload');
    SELECT * INTO id, created, job FROM qftrio_enqueue_insert(tenant, ARRAY[qftrio_enqueue_check(request, '')], '');
END $$;

CREATE OR REPLACE FUNCTION qftrio_enqueue_batch(tenant text, jobs jsonb) RETURNS TABLE (id uuid, created boolean, job jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    checked jsonb[];
BEGIN
    IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' THEN
        PERFORM qftrio_enqueue_refuse('jobs', 'must be a JSON array');
    ELSIF jsonb_array_length(jobs) NOT BETWEEN {{EnqueueBatchRequest.jobs.minItems}} AND {{EnqueueBatchRequest.jobs.maxItems}} THEN
        PERFORM qftrio_enqueue_refuse('jobs', format('must hold %s to %s jobs, not %s',
            {{EnqueueBatchRequest.jobs.minItems}}, {{EnqueueBatchRequest.jobs.maxItems}}, jsonb_array_length(jobs)));
    END IF;
    PERFORM qftrio_enqueue_fits(tenant, jobs, 'jobs');
    SELECT array_agg(qftrio_enqueue_check(j, 'jobs.' || (i - 1)) ORDER BY i) INTO checked
    FROM jsonb_array_elements(jobs) WITH ORDINALITY AS u(j, i);
    RETURN QUERY SELECT * FROM qftrio_enqueue_insert(tenant, checked, 'jobs');
END $$;

-- The two entry points find qftrio's tables, and the functions above, in
-- the schema they are in, whatever the caller's search_path.
DO $$
DECLARE
    home text := (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                  WHERE c.oid = 'qftrio_jobs'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION qftrio_enqueue(text, text, jsonb, jsonb) SET search_path = %I, pg_temp', home);
    EXECUTE format('ALTER FUNCTION qftrio_enqueue_batch(text, jsonb) SET search_path = %I, pg_temp', home);
END $$;
