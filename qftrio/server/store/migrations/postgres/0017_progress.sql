-- qftrio schema, version 0017: the last progress a job's handler reported
-- and when. Adding nullable columns rewrites no row.
ALTER TABLE qftrio_jobs ADD COLUMN progress jsonb;
ALTER TABLE qftrio_jobs ADD COLUMN progress_at double precision;

-- A job as the HTTP API answers it (qftrio.models.Job.to_wire), as in 0014
-- with the progress.
CREATE OR REPLACE FUNCTION qftrio_job_wire(j qftrio_jobs) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', j.id::text, 'tenant', j.tenant, 'queue', j.queue, 'kind', j.kind, 'payload', j.payload,
        'status', j.status, 'priority', j.priority, 'attempt', j.attempt, 'max_attempts', j.max_attempts,
        'scheduled_at', qftrio_wire_time(j.scheduled_at), 'created_at', qftrio_wire_time(j.created_at),
        'updated_at', qftrio_wire_time(j.updated_at), 'locked_until', qftrio_wire_time(j.locked_until),
        'worker_id', j.worker_id, 'result', j.result, 'error', j.error,
        'errors', CASE WHEN j.errors = '[]' THEN j.errors ELSE qftrio_wire_errors(j.errors) END,
        'workflow_id', j.workflow_id::text, 'step', j.step, 'context', j.context,
        'timeout_secs', j.timeout_secs, 'backoff', j.backoff, 'headers', j.headers, 'schedule', j.schedule,
        'concurrency', j.concurrency, 'rate_limit', j.rate_limit, 'unique', j."unique",
        'progress', j.progress, 'progress_at', qftrio_wire_time(j.progress_at))
$$;
