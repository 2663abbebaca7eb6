-- qftrio schema, version 0016: jobs enqueued by qftrio_enqueue and
-- qftrio_enqueue_batch make their new concurrency keys' rows in order
-- (qftrio_enqueue_rows, in functions.sql).
SELECT 1;
