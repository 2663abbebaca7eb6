"""Dashboard sessions over real HTTP, on both stores: a random id in the
cookie (never the token), kept in the database where every server sees it,
ended by sign-out, by its idle timeout and its lifetime on the server's
clock, and by its token leaving the configuration; purged by the janitor."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio.models import EnqueueRequest, JobConfig, Status
from qftrio.server.dashboard import COOKIE
from qftrio.server.engine import Engine, session_key
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import SqliteStore, open_sqlite_store

from .conftest import EPOCH, RunningServer, serve_store
from .pg import pg_url

ACME = "acme-secret"


@contextlib.asynccontextmanager
async def serving(storage: Store, nursery: trio.Nursery, **overrides: Any) -> AsyncIterator[RunningServer]:
    """A server on *storage* (settings *overrides*), stopped on leaving."""
    async for server in serve_store(storage, nursery, **overrides):
        yield server  # serve_store yields once, then stops its server


@contextlib.asynccontextmanager
async def browser(server: RunningServer, cookie: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """A client of *server*'s dashboard holding the session *cookie*, if any."""
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        if cookie is not None:
            client.cookies.set(COOKIE, cookie, path="/dashboard")
        yield client


async def sign_in(server: RunningServer, token: str = ACME) -> str:
    """A new session's cookie value."""
    async with browser(server) as client:
        answer = await client.post("/dashboard/signin", data={"token": token})
        assert answer.status_code == 303, answer.text
        cookie = client.cookies.get(COOKIE)
        assert cookie
        return cookie


async def signed_in_as(client: httpx.AsyncClient) -> str | None:
    """The tenant the client's session shows, or None when it is sent to sign in."""
    answer = await client.get("/dashboard/")
    if answer.status_code == 303:
        assert answer.headers["Location"].startswith("/dashboard/signin")
        return None
    assert answer.status_code == 200, answer.text
    found = re.search(r'class="tenant"[^>]*>([^<]+)<', answer.text)
    return found[1].strip() if found else "?"


async def csrf_of(client: httpx.AsyncClient) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/dashboard/")).text)
    assert found
    return found[1]


async def a_pending_job(server: RunningServer) -> str:
    (inserted,) = await server.engine.enqueue("acme", [EnqueueRequest(kind="k", config=JobConfig(queue="q"))])
    return inserted.job.id


async def test_the_cookie_holds_a_random_id_never_the_token(server: RunningServer) -> None:
    async with browser(server) as client:
        answer = await client.post("/dashboard/signin", data={"token": ACME})
        set_cookie = answer.headers["set-cookie"]
    first, second = await sign_in(server), await sign_in(server)
    assert ACME not in set_cookie and first != second
    for cookie in (first, second):
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", cookie)  # secrets.token_urlsafe(32)
        # the database keys it by its hash: the id itself is kept nowhere
        session = await server.engine.store.session_get(session_key(cookie), now=server.clock())
        assert session is not None and session.tenant == "acme"
        assert await server.engine.store.session_get(cookie, now=server.clock()) is None
    # a made-up or a too long cookie is no session
    for forged in ("x" * 43, ACME, "y" * 10_000):
        async with browser(server, forged) as client:
            assert await signed_in_as(client) is None


async def test_after_sign_out_the_old_cookie_is_refused(server: RunningServer) -> None:
    job_id = await a_pending_job(server)
    cookie = await sign_in(server)
    async with browser(server, cookie) as client:
        csrf = await csrf_of(client)
        answer = await client.post("/dashboard/signout", data={"csrf": csrf})
        assert answer.status_code == 303 and answer.headers["Location"] == "/dashboard/signin"
    # a copy of the cookie taken before sign-out: no page, no action
    async with browser(server, cookie) as stolen:
        assert await signed_in_as(stolen) is None
        answer = await stolen.post(f"/dashboard/jobs/{job_id}/cancel", data={"csrf": csrf})
        assert answer.status_code == 401
    assert (await server.engine.job_get("acme", job_id)).status is Status.PENDING


async def test_a_session_ends_when_idle_and_at_the_end_of_its_lifetime(storage: Store, nursery: trio.Nursery) -> None:
    idle, lifetime = 600.0, 3600.0
    async with serving(storage, nursery, session_idle_secs=idle, session_lifetime_secs=lifetime) as server:
        async with browser(server, await sign_in(server)) as idler:
            server.clock.advance(idle - 60)
            assert await signed_in_as(idler) == "acme"  # a request moves the idle end on
            server.clock.advance(idle - 60)
            assert await signed_in_as(idler) == "acme"
            server.clock.advance(idle + 1)
            assert await signed_in_as(idler) is None  # idle too long
        # one used every few minutes lasts until its lifetime, not longer
        signed_at = server.clock.offset
        async with browser(server, await sign_in(server)) as busy:
            while server.clock.offset + 300 < signed_at + lifetime:
                server.clock.advance(300)
                assert await signed_in_as(busy) == "acme", server.clock.offset - signed_at
            server.clock.advance(signed_at + lifetime - server.clock.offset + 1)
            assert await signed_in_as(busy) is None


async def test_a_session_whose_token_left_the_configuration_is_refused(storage: Store, nursery: trio.Nursery) -> None:
    async with serving(storage, nursery) as before:
        cookie = await sign_in(before)
        theirs = await sign_in(before, "globex-secret")
        async with browser(before, cookie) as client:
            assert await signed_in_as(client) is not None
    # the same database, served with acme's token changed and globex gone
    tenants = {"acme": "acme-new-secret-0123", "initech": "initech-secret-01"}
    async with serving(storage, nursery, tenants=tenants) as after:
        for old in (cookie, theirs):
            async with browser(after, old) as client:
                assert await signed_in_as(client) is None
            # refused, and deleted
            assert await after.engine.store.session_get(session_key(old), now=0) is None
        async with browser(after, await sign_in(after, "acme-new-secret-0123")) as client:
            assert await signed_in_as(client) is not None


async def test_a_session_from_one_server_is_valid_on_another(storage: Store, nursery: trio.Nursery) -> None:
    if isinstance(storage, SqliteStore):
        pytest.skip("one server per SQLite file")
    from qftrio.server.store.postgres import open_postgres_store

    async with serving(storage, nursery) as first:
        job_id = await a_pending_job(first)
        cookie = await sign_in(first)
        async with (
            open_postgres_store(pg_url() or "", migrate=False, timeout=None) as other_store,
            serving(other_store, nursery) as second,
            browser(second, cookie) as client,
        ):
            assert await signed_in_as(client) is not None
            csrf = await csrf_of(client)
            answer = await client.post(f"/dashboard/jobs/{job_id}/cancel", data={"csrf": csrf})
            assert answer.status_code == 303
            assert (await client.post("/dashboard/signout", data={"csrf": csrf})).status_code == 303
        async with browser(first, cookie) as client:
            assert await signed_in_as(client) is None  # signed out on the other server
        assert (await first.engine.job_get("acme", job_id)).status is Status.CANCELLED


async def test_the_janitor_purges_ended_sessions(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    # Store calls inline on the event loop, so the mock clock cannot jump
    # past the janitor's rounds.
    async with open_sqlite_store(tmp_path / "qftrio.db", threaded=False) as store:
        engine = Engine(store, clock=lambda: EPOCH + trio.current_time(), session_idle_secs=600)
        ended, _ = await engine.session_create("acme", ACME)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run_janitor)
            await trio.sleep(300)
            kept, _ = await engine.session_create("acme", ACME)
            with trio.fail_after(600 + 3 * engine.PURGE_EVERY_SECS):
                while await store.session_get(session_key(ended), now=0) is not None:
                    await trio.sleep(1)
            assert trio.current_time() >= 600
            assert await store.session_get(session_key(kept), now=0) is not None
            nursery.cancel_scope.cancel()
