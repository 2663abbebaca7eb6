-- qftrio embedded schema: workers seen when idle.
--
-- One row per (worker id, queue) a lease call named, with when it last did.
-- Each server writes a pair at most once every few seconds and caps the
-- pairs it writes; the janitor deletes rows older than the window the
-- workers list shows, so the table stays small whatever callers send.
CREATE TABLE worker_sightings (
    worker_id TEXT NOT NULL,
    queue TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (worker_id, queue)
) WITHOUT ROWID;
CREATE INDEX worker_sightings_by_time ON worker_sightings (seen_at);
