-- qftrio schema, version 0008: dashboard sessions, seen by every server.
--
-- A signed-in browser holds a random session id; the row is keyed by the
-- id's SHA-256, so reading the database gives no session away. token_mac is
-- an HMAC of the token signed in with, under the session's own secret: a
-- session stays valid only while that token still acts for the tenant.
CREATE TABLE qftrio_dashboard_sessions (
    key             text PRIMARY KEY,
    tenant          text NOT NULL,
    secret          text NOT NULL,
    token_mac       text NOT NULL,
    created_at      double precision NOT NULL,
    idle_until      double precision NOT NULL,
    expires_at      double precision NOT NULL
);
-- idle_until never passes expires_at (a touch keeps it under), so it alone
-- says whether a session is still valid.
CREATE INDEX qftrio_dashboard_sessions_end_idx ON qftrio_dashboard_sessions (idle_until);
