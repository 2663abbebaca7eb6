"""Waiting on a job (DESIGN §3, "Waiting and watching"):
``GET /api/v1/jobs/{id}/wait`` over real HTTP on every backend, and across
two servers on one PostgreSQL database. On the real clock: the stores'
threads and sockets make Trio's autojump clock fire the clients' timeouts;
every wait here ends by the work (a wake-up, a parked count), never a guess."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from qftrio.server.engine import Engine
from qftrio.server.store.base import Store

from .conftest import RunningServer, serve_store
from .test_protocol import enqueue, lease, report


async def wait(http: httpx.AsyncClient, server: RunningServer, job_id: str, who: str = "acme", **query) -> httpx.Response:
    return await http.get(f"/api/v1/jobs/{job_id}/wait", params=query, headers=server.headers(who))


async def parked(engine: Engine, n: int = 1) -> None:
    """Until *n* waits are parked on *engine*: a wait's state, not a time
    (the cap only turns a hang into a failure)."""
    with trio.fail_after(60):
        while len(engine.waits) < n:
            await trio.sleep(0.001)


async def test_a_wait_answers_the_job_once_it_completes(http, server) -> None:
    job = await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=300)
    answer: list[httpx.Response] = []
    async with trio.open_nursery() as nursery:

        async def waiting() -> None:
            answer.append(await wait(http, server, job["id"], timeout_secs=60))

        nursery.start_soon(waiting)
        await parked(server.engine)
        assert not answer
        r = await report(http, server, job["id"], "complete", lease_token=leased["lease_token"], result={"ok": 1})
        assert r.status_code == 204
    (r,) = answer
    assert r.status_code == 200 and r.json()["status"] == "completed" and r.json()["result"] == {"ok": 1}
    assert len(server.engine.waits) == 0


async def test_a_wait_ends_with_a_failure_and_a_cancel_too(http, server) -> None:
    failing, cancelled = await enqueue(http, server, max_attempts=1), await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=300)
    assert leased["job"]["id"] == failing["id"]
    answers: dict[str, httpx.Response] = {}
    async with trio.open_nursery() as nursery:
        for job in (failing, cancelled):
            nursery.start_soon(lambda job_id: _into(answers, job_id, wait(http, server, job_id, timeout_secs=60)), job["id"])
        await parked(server.engine, 2)
        await report(http, server, failing["id"], "fail", lease_token=leased["lease_token"], error="boom")
        await http.post(f"/api/v1/jobs/{cancelled['id']}/cancel", headers=server.headers())
    assert answers[failing["id"]].json()["status"] == "failed"
    assert answers[cancelled["id"]].json()["status"] == "cancelled"


async def _into(answers: dict[str, httpx.Response], key: str, call) -> None:
    answers[key] = await call


async def test_a_wait_on_an_ended_job_answers_at_once_and_a_timeout_answers_it_as_it_stands(
    http, server
) -> None:
    job = await enqueue(http, server)
    started = trio.current_time()
    r = await wait(http, server, job["id"], timeout_secs=0.3)
    assert r.status_code == 200 and r.json()["status"] == "pending"
    assert trio.current_time() - started >= 0.3
    assert (await wait(http, server, job["id"], timeout_secs=0)).json()["status"] == "pending"
    await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
    started = trio.current_time()
    r = await wait(http, server, job["id"], timeout_secs=60)
    # At once: nothing would wake it, and it would answer "cancelled" only after its minute.
    assert r.json()["status"] == "cancelled" and trio.current_time() - started < 60


async def test_another_tenants_job_and_bad_timeouts_are_refused(http, server) -> None:
    job = await enqueue(http, server)
    r = await wait(http, server, job["id"], who="globex", timeout_secs=1)
    assert r.status_code == 404
    r = await wait(http, server, "00000000-0000-0000-0000-000000000000", timeout_secs=1)
    assert r.status_code == 404
    for bad in ("61", "-1", "soon"):
        r = await wait(http, server, job["id"], timeout_secs=bad)
        assert r.status_code == 422 and "timeout_secs" in r.json()["error"]["message"], r.text
    r = await http.get(f"/api/v1/jobs/{job['id']}/wait", headers=server.headers("worker"))
    assert r.status_code == 403


async def test_waits_past_a_tenants_cap_are_429(http, server, monkeypatch) -> None:
    monkeypatch.setattr(server.engine.waits, "per_tenant", 3)
    job = await enqueue(http, server)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(wait, http, server, job["id"])
        await parked(server.engine, 3)
        r = await wait(http, server, job["id"], timeout_secs=5)
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_waits"
        assert r.headers["retry-after"] == "1"
        # Another tenant is not held back by this one's waits.
        other = await http.post("/api/v1/jobs", json={"kind": "k"}, headers=server.headers("globex"))
        r = await wait(http, server, other.json()["id"], who="globex", timeout_secs=0)
        assert r.status_code == 200
        await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
    assert len(server.engine.waits) == 0


async def test_a_client_that_goes_away_ends_its_wait(http, server) -> None:
    job = await enqueue(http, server)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, http, server, job["id"])
        await parked(server.engine)
        nursery.cancel_scope.cancel()  # the client closes its connection
    # Bounded by the work: the server notices the closed connection (the
    # cap only turns a hang into a failure).
    with trio.fail_after(60):
        while len(server.engine.waits):
            await trio.sleep(0.01)


async def test_shutdown_ends_every_wait(storage: Store, nursery: trio.Nursery) -> None:
    answers: list[httpx.Response] = []
    async for server in serve_store(storage, nursery):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            job = await enqueue(http, server)

            async def waiting() -> None:
                answers.append(await wait(http, server, job["id"], timeout_secs=60))

            async with trio.open_nursery() as inner:
                inner.start_soon(waiting)
                await parked(server.engine)
                server.engine.begin_shutdown()
    (r,) = answers
    assert r.status_code == 200 and r.json()["status"] == "pending"


# -- across two servers on one PostgreSQL ------------------------------------------


@pytest.fixture
async def two_servers(nursery: trio.Nursery) -> AsyncIterator[tuple[RunningServer, RunningServer]]:
    from qftrio.server.store.postgres import open_postgres_store

    from .pg import open_test_postgres_store, pg_url

    async with open_test_postgres_store() as one, open_postgres_store(pg_url() or "", migrate=False, timeout=None) as two:
        async for a in serve_store(one, nursery):
            async for b in serve_store(two, nursery):
                yield a, b


@pytest.mark.postgres
async def test_a_job_ended_through_one_server_wakes_a_wait_parked_on_another(two_servers) -> None:
    a, b = two_servers
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as on_a, httpx.AsyncClient(base_url=b.url, timeout=90) as on_b:
        job = await enqueue(on_a, a)
        (leased,) = await lease(on_a, a, lease_secs=300)
        answer: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def waiting() -> None:
                answer.append(await wait(on_b, b, job["id"], timeout_secs=60))

            # Only the notification can wake it: no safety poll within the wait.
            b.engine.safety_poll_secs = 3600
            nursery.start_soon(waiting)
            await parked(b.engine)
            await report(on_a, a, job["id"], "complete", lease_token=leased["lease_token"])
        (r,) = answer
        assert r.json()["status"] == "completed"
