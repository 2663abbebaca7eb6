"""A job's ``config.headers``: stored with it on every store, shown in the Job,
carried to the worker untouched in the lease answer, and checked at the edge
(docs/protocol.md, "Headers"). The store suite runs on both stores (the
``storage`` fixture), the rest over real HTTP (the ``server`` fixture)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

import qftrio
from qftrio.models import MAX_HEADERS_BYTES
from qftrio.server.store.base import ClaimRequest, Store

from .conftest import RunningServer
from .test_store import T0, claim_one, new

TRACE = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
}
ODD = {"X-Tenant-Region": "eu-west-1", "~weird!#$%&'*+.^_`|": "tab\tand üñí©ødé, quotes \" and \\"}


# -- both stores -------------------------------------------------------------------


async def test_headers_are_stored_and_claimed_as_given(storage: Store) -> None:
    inserted = await storage.jobs_insert([new(headers=TRACE), new(headers=ODD), new()], now=T0)
    assert [i.job.headers for i in inserted] == [TRACE, ODD, None]
    for i in inserted:
        assert await storage.job_get(i.job.id) == i.job
        assert i.to_wire() == i.job.to_wire()
    claimed = await storage.jobs_claim("q", limit=3, lease_secs=30, worker_id="w1", now=T0 + 1)
    assert [lease.job.headers for lease in claimed] == [TRACE, ODD, None]
    jobs = await storage.jobs_list(tenant="t1", limit=10)
    assert sorted((j.headers or {}).get("traceparent", "") for j in jobs) == ["", "", TRACE["traceparent"]]


async def test_headers_reach_a_parked_poll(storage: Store) -> None:
    # A job due now goes straight to a long-poll waiting on its queue: the
    # hand-off inserts it claimed, headers and all.
    poll = ClaimRequest(queue="q", limit=2, lease_secs=30, worker_id="w1")
    inserted, (leases,) = await storage.jobs_insert_claiming([new(headers=TRACE), new()], now=T0, claims=[poll])
    assert [lease.job.headers for lease in leases] == [TRACE, None]
    assert [(await storage.job_get(i.job.id)).headers for i in inserted] == [TRACE, None]


async def test_headers_outlive_every_change(storage: Store) -> None:
    await storage.jobs_insert([new(headers=ODD)], now=T0)
    lease = await claim_one(storage)
    cancelled = await storage.job_cancel(lease.job.id, tenant="t1", now=T0 + 2)
    assert cancelled is not None and cancelled.headers == ODD
    retried = await storage.job_retry(lease.job.id, tenant="t1", now=T0 + 3)
    assert retried is not None and retried.headers == ODD
    again = await claim_one(storage, now=T0 + 4)
    assert again.job.headers == ODD


# -- over HTTP ---------------------------------------------------------------------


async def enqueue(http: httpx.AsyncClient, server: RunningServer, **config: object) -> httpx.Response:
    body = {"kind": "resize", "payload": {}, "config": {"queue": "images", **config}}
    return await http.post("/api/v1/jobs", json=body, headers=server.headers())


async def lease(http: httpx.AsyncClient, server: RunningServer) -> list[dict]:
    r = await http.post("/api/v1/queues/images/lease", json={"max_jobs": 10}, headers=server.headers("worker"))
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


async def test_headers_over_http(http: httpx.AsyncClient, server: RunningServer) -> None:
    r = await enqueue(http, server, headers=ODD)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["headers"] == ODD
    assert (await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).json()["headers"] == ODD
    enqueued = [job]
    # None given, or none at all: null.
    for config in ({}, {"headers": {}}, {"headers": None}):
        enqueued.append((await enqueue(http, server, **config)).json())
        assert enqueued[-1]["headers"] is None
    # A repeated idempotency key answers the first job, its headers too.
    enqueued.append((await enqueue(http, server, idempotency_key="k", headers=TRACE)).json())
    repeat = await enqueue(http, server, idempotency_key="k", headers={"other": "1"})
    assert repeat.status_code == 200 and repeat.json()["headers"] == TRACE
    batch = await http.post(
        "/api/v1/jobs/batch",
        json={"jobs": [{"kind": "b", "config": {"queue": "images", "headers": TRACE}}, {"kind": "c", "config": {"queue": "images"}}]},
        headers=server.headers(),
    )
    assert batch.status_code == 201 and [j["headers"] for j in batch.json()["jobs"]] == [TRACE, None]
    enqueued += batch.json()["jobs"]
    # The worker gets each job's headers as enqueued.
    leased = {item["job"]["id"]: item["job"]["headers"] for item in await lease(http, server)}
    assert leased == {j["id"]: j["headers"] for j in enqueued}


@pytest.mark.parametrize(
    ("headers", "where", "says"),
    [
        ({"bad name": "x"}, "config.headers.bad name", "header name"),
        ({"": "x"}, "config.headers.", "header name"),
        ({"é": "x"}, "config.headers.é", "header name"),
        ({"n" * 257: "x"}, "config.headers.nnn", "1-256 characters"),
        ({"a": "line\nbreak"}, "config.headers.a", "control character"),
        ({"a": "nul\u0000"}, "config.headers.a", "control character"),
        ({"a": "del\u007f"}, "config.headers.a", "control character"),
        ({"a": 1}, "config.headers.a", "string"),
        ({"a": None}, "config.headers.a", "string"),
        (["traceparent"], "config.headers", "object"),
        ("traceparent=1", "config.headers", "object"),
        ({"a": "x" * MAX_HEADERS_BYTES}, "config.headers", f"over the {MAX_HEADERS_BYTES} allowed"),
        ({f"h{i}": "é" * 40 for i in range(100)}, "config.headers", "8290 bytes in all"),
    ],
)
async def test_bad_headers_are_a_422_naming_the_field(
    http: httpx.AsyncClient, server: RunningServer, headers: object, where: str, says: str
) -> None:
    r = await enqueue(http, server, headers=headers)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["message"].startswith(where) and says in error["message"], error
    # Nothing was enqueued.
    stats = (await http.get("/api/v1/queues/images/stats", headers=server.headers())).json()
    assert stats["counts"]["pending"] == 0


async def test_headers_at_the_cap_are_taken(http: httpx.AsyncClient, server: RunningServer) -> None:
    exactly = {"a": "é" * ((MAX_HEADERS_BYTES - 1) // 2)}  # 1 + 8190 bytes
    assert (await enqueue(http, server, headers=exactly)).status_code == 201
    (item,) = await lease(http, server)
    assert item["job"]["headers"] == exactly


# -- the Python client and the runtime ---------------------------------------------


@pytest.fixture
async def tenant(server: RunningServer) -> AsyncIterator[qftrio.Client]:
    async with qftrio.Client(server.url, server.tenants["acme"], timeout=5) as client:
        yield client


async def test_the_clients_send_headers_and_the_worker_gets_them(
    server: RunningServer, tenant: qftrio.Client
) -> None:
    job = await tenant.enqueue("resize", queue="images", headers=ODD)
    assert job.headers == ODD
    (flat, wire) = await tenant.enqueue_many(
        [
            {"kind": "resize", "queue": "images", "headers": TRACE},
            {"kind": "resize", "config": {"queue": "images", "headers": {"k": "v"}}},
        ]
    )
    assert (flat.headers, wire.headers) == (TRACE, {"k": "v"})

    def sync_enqueue() -> qftrio.Job:
        with qftrio.SyncClient(server.url, server.tenants["acme"], timeout=5) as client:
            return client.enqueue("resize", queue="images", headers={"from": "sync"})

    synced = await trio.to_thread.run_sync(sync_enqueue)
    assert synced.headers == {"from": "sync"}

    seen: dict[str, dict[str, str] | None] = {}
    all_seen = trio.Event()
    registry = qftrio.Registry()

    @registry.handler("resize")
    async def resize(job: qftrio.Job) -> None:
        seen[job.id] = job.headers
        if len(seen) == 4:
            all_seen.set()

    async with qftrio.Client(server.url, server.worker_token) as client:
        async with qftrio.open_worker(qftrio.HttpTransport(client), "images", registry, lanes=1, wait_secs=1):
            await all_seen.wait()
    assert seen == {job.id: ODD, flat.id: TRACE, wire.id: {"k": "v"}, synced.id: {"from": "sync"}}


async def test_the_client_refuses_bad_headers_before_sending(tenant: qftrio.Client) -> None:
    with pytest.raises(qftrio.InvalidInput, match=r"^config\.headers\.a: must hold no control character"):
        await tenant.enqueue("resize", headers={"a": "\r\n"})
    with pytest.raises(qftrio.InvalidInput, match=r"^config\.headers: names and values hold"):
        await tenant.enqueue("resize", headers={"a": "x" * (MAX_HEADERS_BYTES + 1)})
