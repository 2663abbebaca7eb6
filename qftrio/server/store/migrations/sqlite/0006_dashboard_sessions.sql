-- qftrio embedded schema: dashboard sessions.
--
-- A signed-in browser holds a random session id; the row is keyed by the
-- id's SHA-256, so reading the database gives no session away. token_mac is
-- an HMAC of the token signed in with, under the session's own secret: a
-- session stays valid only while that token still acts for the tenant.
CREATE TABLE dashboard_sessions (
    key TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    secret TEXT NOT NULL,
    token_mac TEXT NOT NULL,
    created_at REAL NOT NULL,
    idle_until REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
-- idle_until never passes expires_at (a touch keeps it under), so it alone
-- says whether a session is still valid.
CREATE INDEX dashboard_sessions_by_end ON dashboard_sessions (idle_until);
