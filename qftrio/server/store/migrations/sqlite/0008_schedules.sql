-- qftrio embedded schema: cron schedules (docs/schedules.md).
--
-- A schedule's next_run_at is its first unfired tick (NULL while paused):
-- a janitor round reads the due ones from schedules_due, never all of them.
-- schedule_ticks holds one row per fired tick, written in the transaction
-- that enqueues its job, so that a tick enqueues one job at most; rows of
-- ticks no round can fire again are removed as the schedule moves on.
ALTER TABLE jobs ADD COLUMN schedule TEXT;

CREATE TABLE schedules (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    job TEXT NOT NULL,
    paused INTEGER NOT NULL,
    catch_up TEXT NOT NULL,
    next_run_at REAL,
    last_run_at REAL,
    last_job_id TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (tenant, name)
) WITHOUT ROWID;
CREATE INDEX schedules_due ON schedules (next_run_at) WHERE next_run_at IS NOT NULL;

CREATE TABLE schedule_ticks (
    tenant TEXT NOT NULL,
    schedule TEXT NOT NULL,
    tick REAL NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (tenant, schedule, tick)
) WITHOUT ROWID;
