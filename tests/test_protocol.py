"""The worker protocol (docs/protocol.md) over real HTTP, on every backend."""

from __future__ import annotations

import uuid

import httpx
import pytest
import trio

from .conftest import RunningServer


async def enqueue(http: httpx.AsyncClient, server: RunningServer, kind: str = "resize", **config) -> dict:
    body = {"kind": kind, "payload": {"n": 1}, "config": {"queue": "images", **config}}
    r = await http.post("/api/v1/jobs", json=body, headers=server.headers())
    assert r.status_code == 201, r.text
    return r.json()


async def lease(http: httpx.AsyncClient, server: RunningServer, queue: str = "images", **body) -> list[dict]:
    r = await http.post(f"/api/v1/queues/{queue}/lease", json=body, headers=server.headers("worker"))
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


async def report(http, server, job_id, action, **body) -> httpx.Response:
    return await http.post(f"/api/v1/jobs/{job_id}/{action}", json=body, headers=server.headers("worker"))


async def test_lease_complete_round_trip(http, server) -> None:
    job = await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=30, worker_id="w-1")
    assert leased["job"]["id"] == job["id"]
    assert leased["job"]["status"] == "running"
    assert leased["job"]["attempt"] == 1
    assert leased["job"]["worker_id"] == "w-1"
    assert leased["job"]["locked_until"] is not None
    token = leased["lease_token"]
    uuid.UUID(token)
    r = await report(http, server, job["id"], "complete", lease_token=token, result={"ok": True})
    assert r.status_code == 204 and r.content == b""
    got = (await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).json()
    assert got["status"] == "completed" and got["result"] == {"ok": True} and got["locked_until"] is None
    replay = await report(http, server, job["id"], "complete", lease_token=token, result={"ok": False})
    assert replay.status_code == 204
    got_again = (await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).json()
    assert got_again == got


async def test_empty_lease_and_defaults(http, server) -> None:
    assert await lease(http, server) == []
    r = await http.post("/api/v1/queues/images/lease", headers=server.headers("worker"))
    assert r.status_code == 200 and r.json() == {"jobs": []}


async def test_lease_batch_in_priority_order(http, server) -> None:
    low = await enqueue(http, server, priority=0)
    high = await enqueue(http, server, priority=10)
    mid = await enqueue(http, server, priority=5)
    leased = await lease(http, server, max_jobs=10)
    assert [item["job"]["id"] for item in leased] == [high["id"], mid["id"], low["id"]]
    assert len({item["lease_token"] for item in leased}) == 3


async def test_delayed_job_is_not_leased_early(http, server) -> None:
    await enqueue(http, server, delay_secs=60)
    assert await lease(http, server) == []
    server.clock.advance(61)
    assert len(await lease(http, server)) == 1


async def test_long_poll_wakes_on_enqueue(http, server) -> None:
    woke: list[float] = []
    got: list[list[dict]] = []

    async def waiter() -> None:
        got.append(await lease(http, server, wait_secs=20))
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.3)
        await enqueue(http, server)
        enqueued = trio.current_time()
    assert len(got[0]) == 1
    assert woke[0] - enqueued < 0.5


async def test_parked_long_polls_share_an_enqueued_batch(http, server) -> None:
    got: list[list[dict]] = []

    async def waiter(max_jobs: int) -> None:
        got.append(await lease(http, server, wait_secs=2, max_jobs=max_jobs, worker_id=f"w-{max_jobs}"))

    async with trio.open_nursery() as nursery:
        for max_jobs in (2, 1, 1):
            nursery.start_soon(waiter, max_jobs)
            await trio.sleep(0.1)  # parked oldest first
        body = {"jobs": [{"kind": "resize", "config": {"queue": "images"}} for _ in range(4)]}
        enqueued_at = trio.current_time()
        r = await http.post("/api/v1/jobs/batch", json=body, headers=server.headers())
        assert r.status_code == 201
        enqueued = [j["id"] for j in r.json()["jobs"]]
        with trio.fail_after(5):
            while len(got) < 3:
                await trio.sleep(0.01)
        # Every poll holds jobs well before its wait runs out.
        assert trio.current_time() - enqueued_at < 1.5
        assert sorted(len(jobs) for jobs in got) == [1, 1, 2]
    leased = [item for jobs in got for item in jobs]
    assert sorted(item["job"]["id"] for item in leased) == sorted(enqueued)
    for item in leased:
        assert item["job"]["status"] == "running" and item["job"]["attempt"] == 1
        r = await report(http, server, item["job"]["id"], "complete", lease_token=item["lease_token"])
        assert r.status_code == 204
    assert await lease(http, server) == []


async def test_parked_long_polls_leave_the_rest_pending(http, server) -> None:
    got: list[list[dict]] = []

    async def waiter() -> None:
        got.append(await lease(http, server, wait_secs=2, max_jobs=2))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.1)
        body = {"jobs": [{"kind": "resize", "config": {"queue": "images"}} for _ in range(5)]}
        r = await http.post("/api/v1/jobs/batch", json=body, headers=server.headers())
        assert r.status_code == 201
    assert len(got[0]) == 2
    assert len(await lease(http, server, max_jobs=10)) == 3


async def test_concurrent_leases_get_distinct_jobs(http, server) -> None:
    enqueued = {(await enqueue(http, server))["id"] for _ in range(4)}
    got: list[list[dict]] = []

    async def one() -> None:
        got.append(await lease(http, server, max_jobs=1))

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(one)
    leased = [item["job"]["id"] for jobs in got for item in jobs]
    assert sorted(len(jobs) for jobs in got) == [0, 0, 1, 1, 1, 1]
    assert set(leased) == enqueued
    results = []
    async with trio.open_nursery() as nursery:
        for jobs in got:
            for item in jobs:

                async def report_one(item: dict = item) -> None:
                    r = await report(http, server, item["job"]["id"], "complete", lease_token=item["lease_token"])
                    results.append(r.status_code)

                nursery.start_soon(report_one)
    assert results == [204] * 4


async def test_long_poll_times_out_empty(http, server) -> None:
    start = trio.current_time()
    assert await lease(http, server, wait_secs=0.5) == []
    assert 0.4 < trio.current_time() - start < 3


async def test_heartbeat_extends_then_reports_status(http, server) -> None:
    job = await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=10)
    token = leased["lease_token"]
    r = await report(http, server, job["id"], "heartbeat", lease_token=token, extend_secs=120)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "running" and body["locked_until"] > leased["job"]["locked_until"]
    r = await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = await report(http, server, job["id"], "heartbeat", lease_token=token, extend_secs=120)
    assert r.status_code == 200 and r.json() == {"status": "cancelled"}
    r = await report(http, server, job["id"], "complete", lease_token=token)
    assert r.status_code == 409 and r.json()["error"]["code"] == "lease_lost"
    r = await report(http, server, job["id"], "fail", lease_token=token, error="x")
    assert r.status_code == 409


async def test_heartbeat_409_and_404(http, server) -> None:
    job = await enqueue(http, server)
    await lease(http, server)
    r = await report(http, server, job["id"], "heartbeat", lease_token=str(uuid.uuid4()), extend_secs=10)
    assert r.status_code == 409
    r = await report(http, server, str(uuid.uuid4()), "heartbeat", lease_token=str(uuid.uuid4()), extend_secs=10)
    assert r.status_code == 404
    r = await report(http, server, "not-an-id", "complete", lease_token="x")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


async def test_expired_lease_is_reclaimed_with_a_fresh_token(http, server) -> None:
    job = await enqueue(http, server)
    (first,) = await lease(http, server, lease_secs=5)
    server.clock.advance(6)
    # The claim takes the expired lease back itself, unless the janitor (its
    # rounds are 50 ms of real time apart here) got there first and put the
    # job back to pending with a retry delay: then it is claimed once that
    # delay has passed. Either way, a fresh token and the old one refused.
    leased = await lease(http, server, lease_secs=5)
    if not leased:
        server.clock.advance(3600)
        leased = await lease(http, server, lease_secs=5)
    (second,) = leased
    assert second["job"]["id"] == job["id"] and second["job"]["attempt"] == 2
    assert second["lease_token"] != first["lease_token"]
    for action, body in [("heartbeat", {"extend_secs": 5}), ("complete", {}), ("fail", {"error": "late"})]:
        r = await report(http, server, job["id"], action, lease_token=first["lease_token"], **body)
        assert r.status_code == 409, action
    r = await report(http, server, job["id"], "complete", lease_token=second["lease_token"])
    assert r.status_code == 204


async def test_janitor_returns_expired_jobs_to_pending(http, server) -> None:
    job = await enqueue(http, server, max_attempts=3)
    await lease(http, server, lease_secs=2)
    server.clock.advance(3)
    with trio.fail_after(5):
        while True:
            got = (await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).json()
            if got["status"] == "pending":
                break
            await trio.sleep(0.05)
    assert got["errors"][-1]["error"] == "lease expired" and got["worker_id"] is None


async def test_fail_retries_with_backoff_then_dead_letters(http, server) -> None:
    job = await enqueue(http, server, max_attempts=2)
    (first,) = await lease(http, server)
    r = await report(http, server, job["id"], "fail", lease_token=first["lease_token"], error="boom")
    assert r.status_code == 204
    replay = await report(http, server, job["id"], "fail", lease_token=first["lease_token"], error="boom")
    assert replay.status_code == 204
    got = (await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).json()
    assert got["status"] == "pending" and got["attempt"] == 1 and got["error"] == "boom"
    assert got["scheduled_at"] > got["updated_at"] and len(got["errors"]) == 1
    r = await report(http, server, job["id"], "heartbeat", lease_token=first["lease_token"], extend_secs=5)
    assert r.json() == {"status": "pending"}
    assert await lease(http, server) == []
    server.clock.advance(3600)
    (second,) = await lease(http, server)
    assert second["job"]["attempt"] == 2
    r = await report(http, server, job["id"], "fail", lease_token=second["lease_token"], error="again")
    assert r.status_code == 204
    got = (await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).json()
    assert got["status"] == "failed" and [e["error"] for e in got["errors"]] == ["boom", "again"]


async def test_non_retryable_fail_dead_letters(http, server) -> None:
    job = await enqueue(http, server, max_attempts=5)
    (leased,) = await lease(http, server)
    r = await report(http, server, job["id"], "fail", lease_token=leased["lease_token"], error="bad", retryable=False)
    assert r.status_code == 204
    got = (await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).json()
    assert got["status"] == "failed" and got["attempt"] == 1


async def test_batch_report_routes(http, server) -> None:
    for _ in range(3):
        await enqueue(http, server)
    leased = await lease(http, server, max_jobs=3)
    items = [{"id": x["job"]["id"], "lease_token": x["lease_token"], "extend_secs": 30} for x in leased]
    items.append({"id": str(uuid.uuid4()), "lease_token": "t", "extend_secs": 30})
    r = await http.post("/api/v1/leases/heartbeat", json={"items": items}, headers=server.headers("worker"))
    results = r.json()["results"]
    assert [x["code"] for x in results] == [200, 200, 200, 404]
    assert all(x["status"] == "running" and x["locked_until"] for x in results[:3])
    done = [{"id": x["job"]["id"], "lease_token": x["lease_token"], "result": {"i": i}} for i, x in enumerate(leased[:2])]
    done.append({"id": leased[2]["job"]["id"], "lease_token": str(uuid.uuid4()), "result": {}})
    r = await http.post("/api/v1/leases/complete", json={"items": done}, headers=server.headers("worker"))
    assert [x["code"] for x in r.json()["results"]] == [204, 204, 409]
    fails = [{"id": leased[2]["job"]["id"], "lease_token": leased[2]["lease_token"], "error": "e", "retryable": False}]
    r = await http.post("/api/v1/leases/fail", json={"items": fails}, headers=server.headers("worker"))
    assert r.json()["results"] == [{"id": leased[2]["job"]["id"], "code": 204}]
    got = (await http.get(f"/api/v1/jobs/{leased[0]['job']['id']}", headers=server.headers())).json()
    assert got["result"] == {"i": 0}


@pytest.mark.parametrize("path", [b"/api/v1/queues/images/lease", b"/api/v1/workflows"])
async def test_a_refused_request_leaves_its_connection_usable(server, path: bytes) -> None:
    # The refusal is decided on the headers, before the body has arrived;
    # the body is read anyway, so the next request on the connection is
    # answered (on the fast path and through Quart).
    host, port = server.url.removeprefix("http://").split(":")
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
            await trio.sleep(0.2)
            await stream.send_all(b"{}GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"}"):
                chunk = await stream.receive_some()
                assert chunk, f"the server closed the connection after: {data!r}"
                data += chunk
    assert data.startswith(b"HTTP/1.1 401")
    assert b"HTTP/1.1 200" in data


async def test_worker_routes_need_the_worker_token(http, server) -> None:
    r = await http.post("/api/v1/queues/images/lease", json={}, headers=server.headers("acme"))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = await http.post("/api/v1/queues/images/lease", json={})
    assert r.status_code == 401
    r = await http.post("/api/v1/queues/images/lease", json={}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    r = await http.post("/api/v1/jobs/x/heartbeat", json={"lease_token": "t", "extend_secs": 5}, headers=server.headers("globex"))
    assert r.status_code == 403


async def test_protocol_bad_input(http, server) -> None:
    w = server.headers("worker")
    r = await http.post("/api/v1/queues/images/lease", json={"max_jobs": 0}, headers=w)
    assert r.status_code == 422 and "max_jobs" in r.json()["error"]["message"]
    r = await http.post("/api/v1/queues/images/lease", json={"lease_secs": 3601}, headers=w)
    assert r.status_code == 422 and "lease_secs" in r.json()["error"]["message"]
    r = await http.post("/api/v1/queues/images/lease", json={"wait_secs": 61}, headers=w)
    assert r.status_code == 422
    r = await http.post("/api/v1/queues/bad%20name/lease", json={}, headers=w)
    assert r.status_code == 422 and "queue" in r.json()["error"]["message"]
    r = await http.post("/api/v1/queues/images/lease", content=b"{not json", headers=w)
    assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json"
    r = await http.post("/api/v1/jobs/x/heartbeat", json={"lease_token": "t", "extend_secs": 0}, headers=w)
    assert r.status_code == 422 and "extend_secs" in r.json()["error"]["message"]
    r = await http.post("/api/v1/jobs/x/fail", json={"lease_token": "t"}, headers=w)
    assert r.status_code == 422 and "error" in r.json()["error"]["message"]
    r = await http.post("/api/v1/jobs/x/complete", json={"lease_token": "t", "result": [1]}, headers=w)
    assert r.status_code == 422 and "result" in r.json()["error"]["message"]


async def test_protocol_paths_queries_and_numbers_are_parsed_strictly(http, server) -> None:
    w = server.headers("worker")
    job = await enqueue(http, server)
    r = await http.post("/api/v1/queues/images%0A/lease", json={}, headers=w)
    assert r.status_code == 422 and "queue" in r.json()["error"]["message"]
    r = await http.post("/api/v1/queues/images/lease?max_jobs=5", json={}, headers=w)
    assert r.status_code == 422 and "max_jobs: unknown parameter" in r.json()["error"]["message"]
    for body, field in [({"max_jobs": "5"}, "max_jobs"), ({"max_jobs": True}, "max_jobs"), ({"wait_secs": False}, "wait_secs")]:
        r = await http.post("/api/v1/queues/images/lease", json=body, headers=w)
        assert r.status_code == 422 and field in r.json()["error"]["message"], body
    (leased,) = await lease(http, server, max_jobs=2.0)
    token = leased["lease_token"]
    r = await report(http, server, job["id"], "heartbeat", lease_token=token, extend_secs="30")
    assert r.status_code == 422 and "extend_secs" in r.json()["error"]["message"]
    r = await report(http, server, job["id"], "fail", lease_token=token, error="x", retryable=0)
    assert r.status_code == 422 and "retryable" in r.json()["error"]["message"]
    got = (await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).json()
    assert got["status"] == "running" and got["error"] is None
    r = await report(http, server, job["id"], "heartbeat", lease_token=token, extend_secs=30.0)
    assert r.status_code == 200 and r.json()["status"] == "running"


async def test_disconnected_long_poll_does_not_swallow_a_job(http, server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=0.3) as impatient:
        try:
            await impatient.post("/api/v1/queues/images/lease", json={"wait_secs": 30}, headers=server.headers("worker"))
        except httpx.ReadTimeout:
            pass
    await trio.sleep(0.1)
    job = await enqueue(http, server)
    (leased,) = await lease(http, server)
    assert leased["job"]["id"] == job["id"] and leased["job"]["attempt"] == 1


async def test_shutdown_releases_parked_long_polls(storage, nursery) -> None:
    from qftrio.server.engine import Engine
    from qftrio.server.serve import run_server

    from .conftest import server_config

    stop = trio.Event()
    engine = Engine(storage)
    (url,) = await nursery.start(lambda task_status: run_server(engine, server_config(), shutdown_trigger=stop.wait, task_status=task_status))
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def parked() -> None:
            answers.append(
                await client.post("/api/v1/queues/q/lease", json={"wait_secs": 30}, headers={"Authorization": "Bearer worker-secret"})
            )

        async with trio.open_nursery() as inner:
            inner.start_soon(parked)
            await trio.sleep(0.3)
            stopped_at = trio.current_time()
            stop.set()
        assert trio.current_time() - stopped_at < 2
    assert answers[0].status_code == 200 and answers[0].json() == {"jobs": []}
