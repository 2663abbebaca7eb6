-- qftrio schema: cron schedules (docs/schedules.md).
--
-- A schedule's next_run_at is its first unfired tick (NULL while paused):
-- a janitor round reads the due ones from qftrio_schedules_due_idx, locked
-- with SKIP LOCKED, never all of them. qftrio_schedule_ticks holds one row
-- per fired tick, inserted in the transaction that enqueues its job: the
-- primary key lets exactly one server's transaction win a tick, whatever
-- the others did. Rows of ticks no round can fire again are removed as the
-- schedule moves on.
ALTER TABLE qftrio_jobs ADD COLUMN schedule text;

CREATE TABLE qftrio_schedules (
    tenant      text NOT NULL,
    name        text NOT NULL,
    cron        text NOT NULL,
    timezone    text NOT NULL,
    job         jsonb NOT NULL,
    paused      boolean NOT NULL,
    catch_up    text NOT NULL CHECK (catch_up IN ('latest', 'none', 'all')),
    next_run_at double precision,
    last_run_at double precision,
    last_job_id uuid,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE INDEX qftrio_schedules_due_idx ON qftrio_schedules (next_run_at) WHERE next_run_at IS NOT NULL;

CREATE TABLE qftrio_schedule_ticks (
    tenant     text NOT NULL,
    schedule   text NOT NULL,
    tick       double precision NOT NULL,
    created_at double precision NOT NULL,
    PRIMARY KEY (tenant, schedule, tick)
);
