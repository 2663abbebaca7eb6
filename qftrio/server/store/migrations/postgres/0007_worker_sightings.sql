-- qftrio schema, version 0007: workers seen when idle.
--
-- One row per (worker id, queue) a lease call named, with when it last did.
-- Each server writes a pair at most once every few seconds and caps the
-- pairs it writes; the janitor deletes rows older than the window the
-- workers list shows, so the table stays small whatever callers send.
CREATE TABLE qftrio_worker_sightings (
    worker_id       text NOT NULL,
    queue           text NOT NULL,
    seen_at         double precision NOT NULL,
    PRIMARY KEY (worker_id, queue)
);
CREATE INDEX qftrio_worker_sightings_time_idx ON qftrio_worker_sightings (seen_at);
