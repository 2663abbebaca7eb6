"""Flow control at claim time over real HTTP, on both stores (PostgreSQL with
two servers wherever a control must hold across servers).

Fair tenants: one tenant's backlog, priorities or back-dated jobs never
starve another tenant's jobs on a queue they share; a single tenant sees
lease order. Concurrency keys: a hard cap on a key's running jobs. Unique
jobs: one job per key while one is in the given statuses. Rate limits: never
more claims than the limit in any window.
"""

from __future__ import annotations

import bisect
import json
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from qftrio.client import Client
from qftrio.models import parse_time
from qftrio.server import transitions
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import SqliteStore

from .conftest import RunningServer, serve_store
from .pg import pg_url
from .test_cli import run_process
from .test_protocol import lease, report


async def enqueue_batch(
    http: httpx.AsyncClient, server: RunningServer, who: str, configs: list[dict[str, Any]], kind: str = "k"
) -> list[str]:
    ids = []
    for start in range(0, len(configs), 1000):
        body = {"jobs": [{"kind": kind, "config": config} for config in configs[start : start + 1000]]}
        r = await http.post("/api/v1/jobs/batch", json=body, headers=server.headers(who))
        assert r.status_code == 201, r.text
        ids += [job["id"] for job in r.json()["jobs"]]
    return ids


async def test_a_noisy_tenant_does_not_starve_another(http: httpx.AsyncClient, server: RunningServer) -> None:
    b = await enqueue_batch(http, server, "globex", [{"queue": "shared"}] * 5)
    await enqueue_batch(http, server, "acme", [{"queue": "shared", "priority": 2147483647}] * 500)
    await enqueue_batch(http, server, "acme", [{"queue": "shared", "scheduled_at": "1970-01-01T00:00:00Z"}] * 500)
    first = await lease(http, server, "shared", max_jobs=10)
    second = await lease(http, server, "shared", max_jobs=10)
    handed = [item["job"]["id"] for item in first + second]
    assert len(handed) == 20
    assert set(b) <= set(handed)
    # the first lease already takes both tenants in turn
    assert [item["job"]["tenant"] for item in first] == ["acme", "globex"] * 5 or [
        item["job"]["tenant"] for item in first
    ] == ["globex", "acme"] * 5


async def test_leases_of_one_job_serve_the_tenants_in_turn(http: httpx.AsyncClient, server: RunningServer) -> None:
    await enqueue_batch(http, server, "acme", [{"queue": "one", "priority": 100}] * 10)
    await enqueue_batch(http, server, "globex", [{"queue": "one"}] * 10)
    tenants = [(await lease(http, server, "one", max_jobs=1))[0]["job"]["tenant"] for _ in range(6)]
    assert sorted(tenants) == ["acme"] * 3 + ["globex"] * 3, tenants


async def test_each_queue_serves_its_tenants_in_turn_whatever_else_is_claimed(
    http: httpx.AsyncClient, server: RunningServer
) -> None:
    for queue in ("x", "y"):
        await enqueue_batch(http, server, "acme", [{"queue": queue, "priority": 100}] * 10)
        await enqueue_batch(http, server, "globex", [{"queue": queue}] * 10)
    # leases alternate between the queues: each queue's own turn still alternates its tenants
    tenants = [(await lease(http, server, queue, max_jobs=1))[0]["job"]["tenant"] for _ in range(4) for queue in "xy"]
    assert sorted(tenants[0::2]) == sorted(tenants[1::2]) == ["acme", "acme", "globex", "globex"], tenants


async def test_a_short_share_is_filled_from_the_other_tenants(http: httpx.AsyncClient, server: RunningServer) -> None:
    await enqueue_batch(http, server, "globex", [{"queue": "fill"}] * 2)
    await enqueue_batch(http, server, "acme", [{"queue": "fill"}] * 30)
    got = await lease(http, server, "fill", max_jobs=10)
    assert sorted(item["job"]["tenant"] for item in got) == ["acme"] * 8 + ["globex"] * 2


async def test_a_single_tenant_sees_lease_order(http: httpx.AsyncClient, server: RunningServer) -> None:
    configs = [{"queue": "solo", "priority": p % 3, "delay_secs": 0} for p in range(30)]
    ids = await enqueue_batch(http, server, "acme", configs)
    got = []
    for _ in range(4):
        got += await lease(http, server, "solo", max_jobs=8)
    jobs = [item["job"] for item in got]
    assert len(jobs) == 30 and {j["id"] for j in jobs} == set(ids)
    order = sorted(jobs, key=lambda j: (-j["priority"], j["scheduled_at"], j["created_at"]))
    assert [j["id"] for j in jobs] == [j["id"] for j in order]


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (["a"], ["a1", "a2", "a3"]),
        (["b", "a"], ["b1", "a1", "b2", "a2", "a3"]),
    ],
)
def test_fair_order(served: list[str], expected: list[str]) -> None:
    candidates = [
        ("a3", "a", 0, 3.0, 3.0),
        ("a1", "a", 9, 9.0, 9.0),
        ("b2", "b", 0, 2.0, 2.0),
        ("a2", "a", 0, 1.0, 1.0),
        ("b1", "b", 5, 5.0, 5.0),
    ]
    candidates = [c for c in candidates if c[1] in served]
    assert [c[0] for c in transitions.fair_order(candidates, served)] == expected


def test_turns_rotate_and_shares_cover_the_lease() -> None:
    assert [transitions.turns(["b", "a", "c"], turn) for turn in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],
    ]  # fmt: skip
    assert transitions.share(10, 1) == 10
    assert transitions.share(10, 3) == 4
    assert transitions.share(10, 300) == 1


# -- concurrency keys and unique jobs, across servers ---------------------------


@pytest.fixture
async def servers(storage: Store, server: RunningServer, nursery: trio.Nursery) -> AsyncIterator[list[RunningServer]]:
    """``server``, and on PostgreSQL a second server on the same database."""
    if isinstance(storage, SqliteStore):
        yield [server]
        return
    from qftrio.server.store.postgres import open_postgres_store

    async with open_postgres_store(pg_url() or "", migrate=False, timeout=None) as store:
        async for second in serve_store(store, nursery):
            yield [server, second]


async def running_by_key(http: httpx.AsyncClient, server: RunningServer) -> Counter[str]:
    r = await http.get("/api/v1/jobs", params={"status": "running", "limit": 1000}, headers=server.headers())
    assert r.status_code == 200, r.text
    return Counter(job["concurrency"]["key"] for job in r.json()["jobs"])


async def test_a_concurrency_limit_holds_across_servers(servers: list[RunningServer]) -> None:
    configs = [{"queue": "sync", "concurrency": {"key": f"k{i % 20}", "limit": 2}} for i in range(2000)]
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    try:
        await enqueue_batch(clients[0], servers[0], "acme", configs)
        done = 0
        peak: Counter[str] = Counter()

        async def lessee(n: int) -> None:
            nonlocal done
            http, server = clients[n % len(servers)], servers[n % len(servers)]
            while done < 2000:
                got = await lease(http, server, "sync", max_jobs=10)
                running = await running_by_key(http, server)
                for key, count in running.items():
                    peak[key] = max(peak[key], count)
                assert max(running.values(), default=0) <= 2, running
                for item in got:
                    assert running[item["job"]["concurrency"]["key"]] >= 1
                    r = await report(http, server, item["job"]["id"], "complete", lease_token=item["lease_token"])
                    assert r.status_code == 204, r.text
                done += len(got)
                if not got:
                    await trio.sleep(0.001)

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(lessee, n)
        stats = (await clients[0].get("/api/v1/queues/sync/stats", headers=servers[0].headers())).json()
        assert stats["counts"]["completed"] == 2000 and stats["counts"]["pending"] == 0
        # the limit was reached, not only kept
        assert max(peak.values()) == 2
    finally:
        for c in clients:
            await c.aclose()


async def test_a_held_back_job_does_not_block_those_behind_it(http: httpx.AsyncClient, server: RunningServer) -> None:
    await enqueue_batch(http, server, "acme", [{"queue": "q", "priority": 9, "concurrency": {"key": "one"}}] * 5)
    await enqueue_batch(http, server, "acme", [{"queue": "q"}] * 3)
    got = await lease(http, server, "q", max_jobs=10)
    assert sorted(str(item["job"]["concurrency"]) for item in got) == [
        "None", "None", "None", "{'key': 'one', 'limit': 1}",
    ]  # fmt: skip
    assert await lease(http, server, "q", max_jobs=10) == []
    # an expired lease still holds its place, and is claimable again itself
    server.clock.advance(120)
    again = await lease(http, server, "q", max_jobs=10)
    assert len(again) == 4
    assert [item["job"]["concurrency"] is not None for item in again].count(True) == 1
    one = next(item for item in again if item["job"]["concurrency"])
    r = await report(http, server, one["job"]["id"], "complete", lease_token=one["lease_token"])
    assert r.status_code == 204
    (next_one,) = await lease(http, server, "q", max_jobs=10)
    assert next_one["job"]["concurrency"] == {"key": "one", "limit": 1}


async def test_unique_enqueues_make_one_job_across_servers(servers: list[RunningServer]) -> None:
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    answers: list[httpx.Response] = []
    body = {"kind": "sync", "config": {"unique": {"key": "customer-7"}}}
    try:

        async def enqueue_one(n: int) -> None:
            http, server = clients[n % len(servers)], servers[n % len(servers)]
            answers.append(await http.post("/api/v1/jobs", json=body, headers=server.headers()))

        async with trio.open_nursery() as nursery:
            for n in range(50):
                nursery.start_soon(enqueue_one, n)
        assert sorted(r.status_code for r in answers) == [200] * 49 + [201]
        assert len({r.json()["id"] for r in answers}) == 1
        assert answers[0].json()["unique"] == {"key": "customer-7", "statuses": ["pending", "running"], "period_secs": None}
    finally:
        for c in clients:
            await c.aclose()


async def test_unique_holds_in_its_statuses_and_period(http: httpx.AsyncClient, server: RunningServer) -> None:
    async def enqueue(unique: dict[str, Any]) -> httpx.Response:
        body = {"kind": "sync", "config": {"queue": "u", "unique": unique}}
        return await http.post("/api/v1/jobs", json=body, headers=server.headers())

    first = await enqueue({"key": "a"})
    assert first.status_code == 201
    assert (await enqueue({"key": "a"})).json()["id"] == first.json()["id"]
    (item,) = await lease(http, server, "u")
    await report(http, server, item["job"]["id"], "complete", lease_token=item["lease_token"])
    # completed: no longer pending or running, so a new one goes in
    second = await enqueue({"key": "a"})
    assert second.status_code == 201 and second.json()["id"] != first.json()["id"]
    # ... unless completed jobs count too, within the period
    third = await enqueue({"key": "a", "statuses": ["completed"], "period_secs": 60})
    assert third.status_code == 200 and third.json()["id"] == first.json()["id"]
    server.clock.advance(61)
    fourth = await enqueue({"key": "a", "statuses": ["completed"], "period_secs": 60})
    assert fourth.status_code == 201
    # a batch repeating a key enqueues it once
    r = await http.post(
        "/api/v1/jobs/batch",
        json={"jobs": [{"kind": "sync", "config": {"unique": {"key": "b"}}}] * 3},
        headers=server.headers(),
    )
    assert r.status_code == 201 and len({job["id"] for job in r.json()["jobs"]}) == 1


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"concurrency": {"key": "k", "limit": 0}}, "limit"),
        ({"concurrency": {"limit": 2}}, "key"),
        ({"unique": {"statuses": ["pending"]}}, "key"),
        ({"unique": {"key": "k", "statuses": ["waiting"]}}, "statuses"),
        ({"unique": {"key": "k", "period_secs": 0}}, "period_secs"),
    ],
)
async def test_bad_flow_control_is_refused_and_stores_nothing(
    http: httpx.AsyncClient, server: RunningServer, config: dict[str, Any], field: str
) -> None:
    r = await http.post("/api/v1/jobs", json={"kind": "k", "config": config}, headers=server.headers())
    assert r.status_code == 422, r.text
    assert field in r.json()["error"]["message"]
    assert (await http.get("/api/v1/jobs", headers=server.headers())).json()["jobs"] == []


# -- rate limits ------------------------------------------------------------------


async def test_a_rate_limit_holds_in_every_window_across_servers(servers: list[RunningServer]) -> None:
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    try:
        r = await clients[0].put("/api/v1/rate-limits/api", json={"limit": 50, "per_secs": 1}, headers=servers[0].headers())
        assert r.status_code == 201, r.text
        await enqueue_batch(clients[0], servers[0], "acme", [{"queue": "calls", "rate_limit": "api"}] * 200)
        claimed: list[float] = []

        async def lessee(n: int) -> None:
            http, server = clients[n % len(servers)], servers[n % len(servers)]
            while len(claimed) < 200:
                got = await lease(http, server, "calls", max_jobs=10, lease_secs=600)
                for item in got:
                    claimed.append(parse_time(item["job"]["locked_until"]) - 600)  # type: ignore[operator]
                    await report(http, server, item["job"]["id"], "complete", lease_token=item["lease_token"])
                if not got:
                    await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(lessee, n)
        claimed.sort()
        assert len(claimed) == 200
        # a window (t - 1, t]: times show to the microsecond
        busiest = max(bisect.bisect_left(claimed, t + 1 - 2e-6) - i for i, t in enumerate(claimed))
        assert busiest == 50
    finally:
        for c in clients:
            await c.aclose()


async def test_rate_limits_are_declared_read_and_deleted(http: httpx.AsyncClient, server: RunningServer) -> None:
    path = "/api/v1/rate-limits/api"
    put = await http.put(path, json={"limit": 2, "per_secs": 60}, headers=server.headers())
    assert put.status_code == 201
    assert put.json() == {"name": "api", "limit": 2, "per_secs": 60.0, "next_available_at": None}
    assert (await http.put(path, json={"limit": 1, "per_secs": 60}, headers=server.headers())).status_code == 200
    # another tenant has none
    assert (await http.get(path, headers=server.headers("globex"))).status_code == 404
    await enqueue_batch(http, server, "acme", [{"queue": "r", "rate_limit": "api"}] * 2 + [{"queue": "r"}])
    got = await lease(http, server, "r", max_jobs=10)
    assert sorted(str(item["job"]["rate_limit"]) for item in got) == ["None", "api"]
    shown = (await http.get(path, headers=server.headers())).json()
    assert parse_time(shown["next_available_at"]) == pytest.approx(
        parse_time(got[0]["job"]["locked_until"]) - 60 + 60, abs=1e-3  # type: ignore[operator]
    )
    assert await lease(http, server, "r") == []
    listed = (await http.get("/api/v1/rate-limits", headers=server.headers())).json()
    assert [r["name"] for r in listed["rate_limits"]] == ["api"]
    assert (await http.delete(path, headers=server.headers())).status_code == 204
    assert (await http.delete(path, headers=server.headers())).status_code == 404
    # no longer declared: it holds nothing back
    assert len(await lease(http, server, "r")) == 1


async def test_a_tenant_declares_a_bounded_number_of_rate_limits(
    http: httpx.AsyncClient, server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server.engine, "MAX_RATE_LIMITS", 2)
    body = {"limit": 5, "per_secs": 1}
    for name in ("a", "b"):
        assert (await http.put(f"/api/v1/rate-limits/{name}", json=body, headers=server.headers())).status_code == 201
    refused = await http.put("/api/v1/rate-limits/c", json=body, headers=server.headers())
    assert refused.status_code == 409 and "delete one first" in refused.json()["error"]["message"]
    # changing one that exists is fine, and another tenant has its own count
    assert (await http.put("/api/v1/rate-limits/a", json=body, headers=server.headers())).status_code == 200
    assert (await http.put("/api/v1/rate-limits/c", json=body, headers=server.headers("globex"))).status_code == 201
    listed = (await http.get("/api/v1/rate-limits", headers=server.headers())).json()
    assert [r["name"] for r in listed["rate_limits"]] == ["a", "b"]


@pytest.mark.parametrize(
    ("body", "field"), [({"limit": 0, "per_secs": 1}, "limit"), ({"limit": 5, "per_secs": 0}, "per_secs"), ({"limit": 5}, "per_secs")]
)
async def test_a_bad_rate_limit_is_refused(http: httpx.AsyncClient, server: RunningServer, body: dict[str, Any], field: str) -> None:
    r = await http.put("/api/v1/rate-limits/api", json=body, headers=server.headers())
    assert r.status_code == 422 and field in r.json()["error"]["message"], r.text
    assert (await http.get("/api/v1/rate-limits", headers=server.headers())).json() == {"rate_limits": []}


async def test_an_unknown_rate_limit_is_refused_and_stores_nothing(http: httpx.AsyncClient, server: RunningServer) -> None:
    body = {"jobs": [{"kind": "k"}, {"kind": "k", "config": {"rate_limit": "nope"}}]}
    r = await http.post("/api/v1/jobs/batch", json=body, headers=server.headers())
    assert r.status_code == 422 and "config.rate_limit" in r.json()["error"]["message"], r.text
    assert (await http.get("/api/v1/jobs", headers=server.headers())).json()["jobs"] == []


async def test_a_schedules_jobs_carry_its_flow_control(http: httpx.AsyncClient, server: RunningServer) -> None:
    h = server.headers()
    config = {"queue": "cron", "concurrency": {"key": "k", "limit": 2}, "rate_limit": "api", "unique": {"key": "u"}}
    body = {"cron": "0 * * * *", "job": {"kind": "report", "config": config}}
    r = await http.put("/api/v1/schedules/hourly", json=body, headers=h)
    assert r.status_code == 422 and "job.config.rate_limit" in r.json()["error"]["message"], r.text
    assert (await http.get("/api/v1/schedules", headers=h)).json()["schedules"] == []

    assert (await http.put("/api/v1/rate-limits/api", json={"limit": 5, "per_secs": 60}, headers=h)).status_code == 201
    assert (await http.put("/api/v1/schedules/hourly", json=body, headers=h)).status_code == 201
    first = (await http.post("/api/v1/schedules/hourly/trigger", headers=h)).json()["job"]
    assert (first["concurrency"], first["rate_limit"], first["unique"]) == (
        {"key": "k", "limit": 2}, "api", {"key": "u", "statuses": ["pending", "running"], "period_secs": None}
    )
    # while the first is pending, a tick answers it rather than a second job
    again = (await http.post("/api/v1/schedules/hourly/trigger", headers=h)).json()
    assert again["job"]["id"] == first["id"] and again["schedule"]["last_job_id"] == first["id"]
    assert len((await http.get("/api/v1/jobs", headers=h)).json()["jobs"]) == 1


async def test_rate_limits_from_the_command_line_and_the_client(server: RunningServer) -> None:
    def qftrio(*argv: str) -> subprocess.CompletedProcess[str]:
        return run_process(*argv, "--url", server.url, "--token", server.tenants["acme"])

    out = await trio.to_thread.run_sync(qftrio, "rate-limits", "set", "api", "--limit", "10", "--per-secs", "1")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"name": "api", "limit": 10, "per_secs": 1.0, "next_available_at": None}
    out = await trio.to_thread.run_sync(qftrio, "rate-limits", "list")
    assert [r["name"] for r in json.loads(out.stdout)["rate_limits"]] == ["api"]
    bad = await trio.to_thread.run_sync(qftrio, "rate-limits", "set", "api", "--limit", "0", "--per-secs", "1")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    async with Client(server.url, server.tenants["acme"]) as client:
        assert (await client.rate_limit_get("api")).limit == 10
        job = await client.enqueue("call", rate_limit="api", concurrency={"key": "c"})
        assert job.rate_limit == "api" and job.concurrency == {"key": "c", "limit": 1}
    out = await trio.to_thread.run_sync(qftrio, "rate-limits", "delete", "api")
    assert out.returncode == 0 and json.loads(out.stdout) == {"deleted": "api"}
    gone = await trio.to_thread.run_sync(qftrio, "rate-limits", "delete", "api")
    assert gone.returncode != 0 and "not found" in gone.stderr
