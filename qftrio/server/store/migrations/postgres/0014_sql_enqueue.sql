-- qftrio schema, version 0014: enqueue from SQL, inside the application's
-- own transaction (docs/sql-enqueue.md). Its functions (qftrio_enqueue,
-- qftrio_enqueue_batch and their parts) are defined in functions.sql, which
-- every migration applies after the numbered ones.
SELECT 1;
