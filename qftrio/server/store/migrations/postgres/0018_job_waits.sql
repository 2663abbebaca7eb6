-- qftrio schema, version 0018: waits on jobs (GET /api/v1/jobs/{id}/wait)
-- woken from any server.
--
-- A server parking a wait on a job adds a row here for as long as it waits
-- (unlogged: a crash loses only waits, whose callers then time out or
-- reconnect). A statement that ends a job someone waits on notifies
-- 'ended:<id>' on the channel long polls listen on, delivered at commit.
-- With no wait anywhere, a statement pays one look at an empty table.
CREATE UNLOGGED TABLE qftrio_job_waits (
    id      uuid PRIMARY KEY,
    job_id  uuid NOT NULL,
    until   double precision NOT NULL  -- a wait whose server died is removed after this
);
CREATE INDEX qftrio_job_waits_job_idx ON qftrio_job_waits (job_id);

CREATE FUNCTION qftrio_jobs_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM qftrio_job_waits) THEN
        PERFORM pg_notify('qftrio_jobs', 'ended:' || n.id::text)
        FROM (SELECT DISTINCT n.id FROM ended_rows AS n
              WHERE n.status IN ('completed', 'failed', 'cancelled')
                AND EXISTS (SELECT 1 FROM qftrio_job_waits AS w WHERE w.job_id = n.id)) AS n;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER qftrio_jobs_ended AFTER UPDATE ON qftrio_jobs
    REFERENCING NEW TABLE AS ended_rows FOR EACH STATEMENT EXECUTE FUNCTION qftrio_jobs_ended();
