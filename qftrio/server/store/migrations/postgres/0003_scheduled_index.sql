-- qftrio schema, version 0003: the index of jobs scheduled ahead holds only them.
--
-- Before, every pending job was in it, so a claim (which wants the due jobs
-- in lease order, from qftrio_jobs_claim_idx) could also be planned on it.
-- A planner without statistics (a new table, or a burst of enqueues before
-- autovacuum's first ANALYZE) took it, and sorted the whole backlog on
-- every claim. Jobs scheduled ahead (a delay, a time, a retry) have
-- scheduled_at > created_at, which a claim's conditions do not imply.

DROP INDEX qftrio_jobs_scheduled_idx;

CREATE INDEX qftrio_jobs_scheduled_idx ON qftrio_jobs (queue, scheduled_at)
    WHERE status = 'pending' AND scheduled_at > created_at;
