-- qftrio schema, version 0021: the live event stream (GET /api/v1/events)
-- fed from any server.
--
-- A server holding a stream open adds a row here for the stream's tenant,
-- renewed while the stream lasts (unlogged: a crash loses only streams,
-- whose clients reconnect). A statement that enqueues a job of such a
-- tenant, or changes its status, attempt or progress, notifies
-- 'event:<json>' on the channel long polls listen on, delivered at commit;
-- a heartbeat that changes none of these notifies nothing. With no stream
-- anywhere, a statement pays one look at an empty table.
--
-- The notification carries the job's progress when it fits in a
-- notification's 8000 bytes; else "progress_omitted": true, and the server
-- reads the job.
CREATE UNLOGGED TABLE qftrio_event_streams (
    id      uuid PRIMARY KEY,
    tenant  text NOT NULL,
    until   double precision NOT NULL  -- a stream whose server died is removed after this
);
CREATE INDEX qftrio_event_streams_tenant_idx ON qftrio_event_streams (tenant);

CREATE FUNCTION qftrio_job_event(n qftrio_jobs) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT 'event:' || CASE
        WHEN n.progress IS NULL OR octet_length(n.progress::text) < 6000
            THEN jsonb_build_object('id', n.id, 'tenant', n.tenant, 'queue', n.queue, 'kind', n.kind,
                 'status', n.status, 'attempt', n.attempt, 'progress', n.progress, 'at', n.updated_at)::text
        ELSE jsonb_build_object('id', n.id, 'tenant', n.tenant, 'queue', n.queue, 'kind', n.kind,
                 'status', n.status, 'attempt', n.attempt, 'progress_omitted', true, 'at', n.updated_at)::text
    END
$$;

CREATE FUNCTION qftrio_jobs_inserted_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM qftrio_event_streams) THEN
        PERFORM pg_notify('qftrio_jobs', qftrio_job_event(n))
        FROM new_rows AS n
        WHERE EXISTS (SELECT 1 FROM qftrio_event_streams AS s WHERE s.tenant = n.tenant);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION qftrio_jobs_updated_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM qftrio_event_streams) THEN
        PERFORM pg_notify('qftrio_jobs', qftrio_job_event(n))
        FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE (n.status, n.attempt, n.progress_at) IS DISTINCT FROM (o.status, o.attempt, o.progress_at)
          AND EXISTS (SELECT 1 FROM qftrio_event_streams AS s WHERE s.tenant = n.tenant);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER qftrio_jobs_inserted_event AFTER INSERT ON qftrio_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION qftrio_jobs_inserted_event();
CREATE TRIGGER qftrio_jobs_updated_event AFTER UPDATE ON qftrio_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION qftrio_jobs_updated_event();
