"""Operations over real HTTP, on every backend: pause and resume, bulk
actions by filter, the live workers, and the metrics an operator alerts on.

After every action the counts ``GET /api/v1/queues`` answers are held to a
full listing of the tenant's jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from qftrio.models import Status
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import SqliteStore

from .conftest import RunningServer, serve_store
from .pg import pg_url
from .test_operations_store import sample
from .test_protocol import lease, report


NONE = {status.value: 0 for status in Status}


async def enqueue(http: httpx.AsyncClient, server: RunningServer, who: str, queue: str, kind: str, n: int = 1) -> list[str]:
    body = {"jobs": [{"kind": kind, "config": {"queue": queue}} for _ in range(n)]}
    r = await http.post("/api/v1/jobs/batch", json=body, headers=server.headers(who))
    assert r.status_code == 201, r.text
    return [job["id"] for job in r.json()["jobs"]]


async def jobs_of(http: httpx.AsyncClient, server: RunningServer, who: str) -> dict[str, dict[str, Any]]:
    """Every job of the tenant, by id, from the paged listing."""
    found: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = (await http.get("/api/v1/jobs", params=params, headers=server.headers(who))).json()
        found.update((job["id"], job) for job in page["jobs"])
        cursor = page["next_cursor"]
        if cursor is None:
            return found


async def check_counts(http: httpx.AsyncClient, server: RunningServer, who: str) -> dict[str, dict[str, int]]:
    """The tenant's queue counts from ``GET /api/v1/queues``, once shown
    equal to a count of every job of the listing."""
    listed: dict[str, Counter[str]] = {}
    for job in (await jobs_of(http, server, who)).values():
        listed.setdefault(job["queue"], Counter())[job["status"]] += 1
    stats = {
        q["queue"]: {status: n for status, n in q["counts"].items() if status in NONE}
        for q in (await http.get("/api/v1/queues", headers=server.headers(who))).json()["queues"]
    }
    nonzero = {queue: counts for queue, counts in stats.items() if any(counts.values())}
    assert nonzero == {queue: {**NONE, **counted} for queue, counted in listed.items()}
    return stats


async def bulk(http: httpx.AsyncClient, server: RunningServer, action: str, who: str = "acme", **body: Any) -> int:
    r = await http.post(f"/api/v1/jobs/bulk/{action}", json=body, headers=server.headers(who))
    assert r.status_code == 200, r.text
    return r.json()["count"]


async def test_a_paused_queue_hands_out_nothing_until_resumed(http, server) -> None:
    acme = server.headers()
    early, *waiting = await enqueue(http, server, "acme", "images", "resize", 3)
    (running,) = await lease(http, server, worker_id="w-early")
    assert running["job"]["id"] == early
    (theirs,) = await enqueue(http, server, "globex", "images", "resize")

    r = await http.post("/api/v1/queues/images/pause", headers=acme)
    assert r.status_code == 200 and r.json()["paused"] is True
    assert r.json()["counts"]["pending"] == 2 and r.json()["counts"]["running"] == 1
    assert (await http.post("/api/v1/queues/images/pause", json={}, headers=acme)).json()["paused"] is True  # idempotent
    # a pause is the tenant's own: another tenant's jobs of the queue still go out
    assert [item["job"]["id"] for item in await lease(http, server, max_jobs=10)] == [theirs]
    assert await lease(http, server, max_jobs=10) == []
    assert (await http.get("/api/v1/queues/images/stats", headers=acme)).json()["paused"] is True
    assert [q["paused"] for q in (await http.get("/api/v1/queues", headers=acme)).json()["queues"]] == [True]
    assert (await http.get("/api/v1/queues/images/stats", headers=server.headers("globex"))).json()["paused"] is False
    # the running job goes on and reports
    token = running["lease_token"]
    r = await report(http, server, early, "heartbeat", lease_token=token, extend_secs=30)
    assert r.status_code == 200 and r.json()["status"] == "running"
    assert (await report(http, server, early, "complete", lease_token=token)).status_code == 204

    got: list[dict] = []

    async def poll() -> None:
        got.extend(await lease(http, server, max_jobs=10, wait_secs=20))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        with trio.fail_after(5):
            while not server.engine.waker._parked.get("images"):
                await trio.sleep(0.01)
            r = await http.post("/api/v1/queues/images/resume", headers=acme)
            assert r.status_code == 200 and r.json()["paused"] is False
            started = trio.current_time()
    # the parked poll looked again at once, not at its safety poll
    assert trio.current_time() - started < 0.9
    assert sorted(item["job"]["id"] for item in got) == sorted(waiting)
    assert (await http.post("/api/v1/queues/images/resume", headers=acme)).json()["paused"] is False


async def test_pause_resume_and_bulk_refuse_bad_input_by_name(http, server) -> None:
    acme = server.headers()
    await enqueue(http, server, "acme", "images", "resize")
    cases = [
        ("/api/v1/queues/bad%20name/pause", {}, "queue"),
        ("/api/v1/queues/images/resume", {"paused": True}, "paused"),
        ("/api/v1/jobs/bulk/retry", {"status": "pending"}, "status"),
        ("/api/v1/jobs/bulk/cancel", {"status": "completed"}, "status"),
        ("/api/v1/jobs/bulk/delete", {"status": "running"}, "status"),
        ("/api/v1/jobs/bulk/cancel", {"status": "sleeping"}, "status"),
        ("/api/v1/jobs/bulk/cancel", {"queue": "a b"}, "queue"),
        ("/api/v1/jobs/bulk/cancel", {"kind": ""}, "kind"),
        ("/api/v1/jobs/bulk/cancel", {"limit": 0}, "limit"),
        ("/api/v1/jobs/bulk/cancel", {"limit": 1_000_001}, "limit"),
        ("/api/v1/jobs/bulk/cancel", {"limit": "5"}, "limit"),
        ("/api/v1/jobs/bulk/cancel", {"created_after": "yesterday"}, "created_after"),
        ("/api/v1/jobs/bulk/cancel", {"created_before": 1800000000}, "created_before"),
        ("/api/v1/jobs/bulk/cancel", {"tenant": "globex", "queue": "images"}, "tenant"),
        ("/api/v1/jobs/bulk/cancel", {}, "all"),
        ("/api/v1/jobs/bulk/retry", {"limit": 5, "queue": None}, "all"),
        ("/api/v1/jobs/bulk/delete", {"all": False}, "all"),
        ("/api/v1/jobs/bulk/cancel", {"all": "yes"}, "all"),
    ]
    for path, body, field in cases:
        r = await http.post(path, json=body, headers=acme)
        assert r.status_code == 422, (path, body, r.text)
        assert r.json()["error"]["message"].startswith(field), (path, body, r.text)
    assert (await http.post("/api/v1/jobs/bulk/cancel", content=b"{", headers=acme)).status_code == 400
    assert (await http.post("/api/v1/jobs/bulk/purge", json={}, headers=acme)).status_code == 404
    assert (await http.post("/api/v1/jobs/bulk/cancel", json={}, headers=server.headers("worker"))).status_code == 403
    assert (await http.post("/api/v1/queues/images/pause")).status_code == 401
    stats = await check_counts(http, server, "acme")
    assert stats["images"]["pending"] == 1 and stats["images"]["cancelled"] == 0
    assert (await http.get("/api/v1/queues/images/stats", headers=acme)).json()["paused"] is False


async def test_bulk_actions_touch_exactly_the_matching_jobs_of_the_tenant(http, server) -> None:
    ax = await enqueue(http, server, "acme", "a", "x", 3)
    ay = await enqueue(http, server, "acme", "a", "y", 2)
    bx = await enqueue(http, server, "acme", "b", "x", 2)
    gx = await enqueue(http, server, "globex", "a", "x", 2)
    for item in await lease(http, server, "a", max_jobs=100, worker_id="w-a"):
        r = await report(http, server, item["job"]["id"], "fail", lease_token=item["lease_token"], error="e", retryable=False)
        assert r.status_code == 204
    await check_counts(http, server, "acme")

    def statuses(jobs: dict[str, dict[str, Any]], ids: list[str]) -> list[str]:
        return [jobs[i]["status"] for i in ids]

    assert await bulk(http, server, "retry", queue="a", kind="x") == 3
    jobs = await jobs_of(http, server, "acme")
    assert statuses(jobs, ax) == ["pending"] * 3 and statuses(jobs, ay) == ["failed"] * 2
    for job_id in ax:  # as job_retry: a fresh budget, the history and where it last ran kept
        job = jobs[job_id]
        assert (job["attempt"], len(job["errors"]), job["worker_id"] is not None) == (0, 1, True), job
    assert (await check_counts(http, server, "acme"))["a"] == {**NONE, "pending": 3, "failed": 2}

    assert await bulk(http, server, "cancel", status="pending", limit=4) == 4
    assert await bulk(http, server, "cancel", status="pending") == 1
    jobs = await jobs_of(http, server, "acme")
    assert statuses(jobs, ax + bx) == ["cancelled"] * 5
    await check_counts(http, server, "acme")

    # a time range, its bounds the times jobs show: [after, before)
    first, last = jobs[ax[0]]["created_at"], jobs[bx[0]]["created_at"]
    assert await bulk(http, server, "delete", created_before=first) == 0
    assert await bulk(http, server, "delete", created_after=last, created_before=last) == 0
    assert await bulk(http, server, "delete", status="failed", created_after=jobs[ay[0]]["created_at"]) == 2
    for job_id in ay:
        assert (await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())).status_code == 404
    assert await bulk(http, server, "retry", kind="x", status="cancelled", limit=2) == 2
    assert await bulk(http, server, "delete", kind="y") == 0
    stats = await check_counts(http, server, "acme")
    assert sum(stats["a"].values()) + sum(stats["b"].values()) == 5

    # the other tenant's jobs: untouched by all of it, and theirs to act on
    theirs = await jobs_of(http, server, "globex")
    assert statuses(theirs, gx) == ["failed", "failed"]
    assert (await check_counts(http, server, "globex"))["a"]["failed"] == 2
    assert await bulk(http, server, "delete", who="globex", all=True) == 2
    assert await jobs_of(http, server, "globex") == {}
    assert len(await jobs_of(http, server, "acme")) == 5


async def test_workers_are_the_holders_of_running_jobs_and_those_seen_idle(http, server) -> None:
    await enqueue(http, server, "acme", "a", "x", 3)
    await enqueue(http, server, "acme", "b", "x", 1)
    await enqueue(http, server, "globex", "c", "x", 1)
    await lease(http, server, "a", max_jobs=2, worker_id="w-1")
    (single,) = await lease(http, server, "a", worker_id="w-2")
    await lease(http, server, "b", worker_id="w-1")
    await lease(http, server, "c", worker_id="w-3")
    r = await http.get("/api/v1/workers", headers=server.headers())
    assert r.status_code == 200
    workers = r.json()["workers"]
    assert [(w["worker_id"], w["jobs"], w["queues"]) for w in workers] == [("w-1", 3, ["a", "b"]), ("w-2", 1, ["a"])]
    assert all(w["last_seen_at"].endswith("Z") for w in workers)
    (theirs,) = (await http.get("/api/v1/workers", headers=server.headers("globex"))).json()["workers"]
    assert theirs["worker_id"] == "w-3"
    assert (await report(http, server, single["job"]["id"], "complete", lease_token=single["lease_token"])).status_code == 204
    # w-2 holds nothing now, and is listed as seen on queue a
    after = (await http.get("/api/v1/workers", headers=server.headers())).json()["workers"]
    assert [(w["worker_id"], w["jobs"], w["job_ids"], w["queues"]) for w in after][1] == ("w-2", 0, [], ["a"])
    assert (await http.get("/api/v1/workers?limit=1", headers=server.headers())).status_code == 422


async def metrics(http: httpx.AsyncClient) -> str:
    r = await http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return r.text


async def test_metrics_move_as_the_jobs_do(http, server) -> None:
    await enqueue(http, server, "acme", "q", "x", 2)
    await enqueue(http, server, "acme", "q", "y", 1)
    text = await metrics(http)
    assert sample(text, "qftrio_jobs_enqueued_total", queue="q", kind="x") == 2
    assert sample(text, "qftrio_queue_jobs", tenant="acme", queue="q", status="pending") == 3
    server.clock.advance(30)
    assert sample(await metrics(http), "qftrio_queue_oldest_ready_age_seconds", tenant="acme", queue="q") >= 30

    leased = await lease(http, server, "q", max_jobs=3)
    by_kind = {item["job"]["kind"]: item for item in leased}
    ok, bad = by_kind["y"], next(item for item in leased if item["job"]["kind"] == "x")
    assert (await report(http, server, ok["job"]["id"], "complete", lease_token=ok["lease_token"])).status_code == 204
    r = await report(http, server, bad["job"]["id"], "fail", lease_token=bad["lease_token"], error="e", retryable=False)
    assert r.status_code == 204
    assert (await report(http, server, ok["job"]["id"], "complete", lease_token="stale")).status_code == 409
    text = await metrics(http)
    assert sample(text, "qftrio_jobs_leased_total", queue="q") == 3
    assert sample(text, "qftrio_jobs_completed_total", queue="q", kind="y") == 1
    assert sample(text, "qftrio_jobs_dead_lettered_total", queue="q", kind="x") == 1
    assert sample(text, "qftrio_stale_token_rejections_total", queue="q", kind="y") == 1
    assert sample(text, "qftrio_job_run_seconds_count", queue="q") == 2
    assert sample(text, "qftrio_lease_wait_seconds_sum", queue="q") >= 3 * 30
    for status, n in (("pending", 0), ("running", 1), ("completed", 1), ("failed", 1)):
        assert sample(text, "qftrio_queue_jobs", tenant="acme", queue="q", status=status) == n, status
    assert sample(text, "qftrio_queue_oldest_ready_age_seconds", tenant="acme", queue="q") == 0

    await http.post("/api/v1/queues/q/pause", headers=server.headers())
    assert await bulk(http, server, "retry", queue="q") == 1
    text = await metrics(http)
    assert sample(text, "qftrio_queue_paused", tenant="acme", queue="q") == 1
    assert sample(text, "qftrio_queue_jobs", tenant="acme", queue="q", status="pending") == 1
    assert sample(text, "qftrio_queue_jobs", tenant="acme", queue="q", status="failed") == 0


@pytest.fixture
async def second_server(storage: Store, nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    """Another server on the same PostgreSQL database as ``server``."""
    if isinstance(storage, SqliteStore):
        pytest.skip("one server per SQLite file")
    from qftrio.server.store.postgres import open_postgres_store

    async with open_postgres_store(pg_url() or "", migrate=False, timeout=None) as store:
        async for running in serve_store(store, nursery):
            yield running


async def test_a_pause_holds_on_every_server(http, server, second_server) -> None:
    async with httpx.AsyncClient(base_url=second_server.url, timeout=10) as other:
        await enqueue(http, server, "acme", "images", "resize", 3)
        r = await other.post("/api/v1/queues/images/pause", headers=second_server.headers())
        assert r.status_code == 200 and r.json()["paused"] is True
        assert await lease(http, server, max_jobs=10) == []
        assert await lease(other, second_server, max_jobs=10) == []
        assert (await http.get("/api/v1/queues/images/stats", headers=server.headers())).json()["paused"] is True
        for client in (http, other):
            text = await metrics(client)
            assert sample(text, "qftrio_queue_paused", tenant="acme", queue="images") == 1
            assert sample(text, "qftrio_queue_jobs", tenant="acme", queue="images", status="pending") == 3

        assert (await http.post("/api/v1/queues/images/resume", headers=server.headers())).json()["paused"] is False
        assert len(await lease(other, second_server, max_jobs=2)) == 2
        assert len(await lease(http, server, max_jobs=2)) == 1
        # each server counts what it did; the gauges are the database's
        mine, theirs = await metrics(http), await metrics(other)
        assert sample(mine, "qftrio_jobs_leased_total", queue="images") == 1
        assert sample(theirs, "qftrio_jobs_leased_total", queue="images") == 2
        for text in (mine, theirs):
            assert sample(text, "qftrio_queue_jobs", tenant="acme", queue="images", status="running") == 3
            assert sample(text, "qftrio_queue_paused", tenant="acme", queue="images") == 0
