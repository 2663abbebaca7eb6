"""Dashboard sessions: random ids kept in the store (under their SHA-256),
each with its tenant, a CSRF secret of its own, an idle end and an absolute
end, and a mark of the token it was signed in with."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable

from .store.base import DashboardSession, Store

__all__ = ["MAX_SESSION_ID", "SESSION_TOUCH_SECS", "Sessions", "session_key", "token_mac"]

#: A session's id is this long (``secrets.token_urlsafe(32)``); a longer
#: cookie is not looked up.
MAX_SESSION_ID = 64
#: A session's idle end moves on at most this often (a write), so that
#: browsing costs a read per page, not a write.
SESSION_TOUCH_SECS = 60.0


def session_key(session_id: str) -> str:
    """What the store keys a dashboard session by: the SHA-256 of its id,
    so that the database holds no id a browser could present."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def token_mac(secret: str, token: str | bytes) -> str:
    """The mark a session keeps of the token it was signed in with: an HMAC
    under the session's own secret, so it matches only that token and is
    worth nothing to anyone reading the database."""
    raw = token if isinstance(token, bytes) else token.encode()
    return hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


class Sessions:
    """The dashboard sessions of *store*, on *clock*: each ends *idle_secs*
    after its last request, and *lifetime_secs* after sign-in whatever
    happens."""

    def __init__(self, store: Store, clock: Callable[[], float], *, idle_secs: float, lifetime_secs: float) -> None:
        self.store = store
        self.clock = clock
        self.idle_secs = idle_secs
        self.lifetime_secs = lifetime_secs

    async def create(self, tenant: str, token: str) -> tuple[str, DashboardSession]:
        """A new session of *tenant*, signed in with *token*: its random id
        (the cookie's value, kept nowhere else) and the session as every
        server reads it from the store."""
        session_id = secrets.token_urlsafe(32)
        secret = secrets.token_urlsafe(32)
        now = self.clock()
        expires_at = now + self.lifetime_secs
        session = DashboardSession(
            tenant=tenant,
            secret=secret,
            token_mac=token_mac(secret, token),
            created_at=now,
            idle_until=min(now + self.idle_secs, expires_at),
            expires_at=expires_at,
        )
        await self.store.session_create(session_key(session_id), session)
        return session_id, session

    async def get(self, session_id: str, tokens_of: Callable[[str], Iterable[bytes]]) -> DashboardSession | None:
        """The valid session of *session_id*, or None: unknown, signed out,
        idle too long, past its lifetime, or signed in with a token that no
        longer acts for its tenant (*tokens_of* answers those that do now;
        such a session is deleted). Moves the idle end on, at most once
        every :data:`SESSION_TOUCH_SECS`."""
        if not session_id or len(session_id) > MAX_SESSION_ID:
            return None
        key = session_key(session_id)
        now = self.clock()
        session = await self.store.session_get(key, now=now)
        if session is None:
            return None
        mac = session.token_mac.encode()
        if not any(hmac.compare_digest(token_mac(session.secret, t).encode(), mac) for t in tokens_of(session.tenant)):
            await self.store.session_delete(key)
            return None
        idle_until = min(now + self.idle_secs, session.expires_at)
        if idle_until - session.idle_until >= SESSION_TOUCH_SECS:
            await self.store.session_touch(key, idle_until=idle_until)
            session = dataclasses.replace(session, idle_until=idle_until)
        return session

    async def delete(self, session_id: str) -> None:
        """Sign the session out (idempotent): its id is worth nothing from now on."""
        if session_id and len(session_id) <= MAX_SESSION_ID:
            await self.store.session_delete(session_key(session_id))
