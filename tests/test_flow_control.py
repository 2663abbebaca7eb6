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
import logging
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from qftrio.client import Client
from qftrio.models import CompleteItem, EnqueueRequest, JobConfig, parse_time
from qftrio.server import transitions
from qftrio.server.engine import Engine, Parked
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import SqliteStore

from .conftest import EPOCH, RunningServer, serve_store
from .pg import pg_url
from .test_cli import run_process
from .test_operations_store import inline_store, sample  # noqa: F401 (a fixture)
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


@pytest.mark.soak
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


# -- what flow control holds back, seen -------------------------------------------


async def test_stats_the_dashboard_and_metrics_show_the_jobs_each_limit_holds_back(
    http: httpx.AsyncClient, server: RunningServer
) -> None:
    h = server.headers()
    assert (await http.put("/api/v1/rate-limits/api", json={"limit": 2, "per_secs": 60}, headers=h)).status_code == 201
    await enqueue_batch(http, server, "acme", [{"queue": "h", "rate_limit": "api"}] * 5)
    await enqueue_batch(http, server, "acme", [{"queue": "h", "concurrency": {"key": "one"}}] * 3 + [{"queue": "h"}])
    # a job scheduled ahead is not held back: its time has not come
    await enqueue_batch(http, server, "acme", [{"queue": "h", "concurrency": {"key": "one"}, "delay_secs": 3600}])
    # another tenant's key of the same name is its own
    await enqueue_batch(http, server, "globex", [{"queue": "h", "concurrency": {"key": "one"}}] * 2)

    async def held(tenant: str = "acme") -> dict[str, Any]:
        r = await http.get("/api/v1/queues/h/stats", headers=server.headers(tenant))
        assert r.status_code == 200, r.text
        return r.json()

    assert (await held())["held_back"] == {"concurrency": 0, "rate_limit": 0}
    got = await lease(http, server, "h", max_jobs=20, lease_secs=600)
    # acme: 2 of the rate limit, 1 of the key, the free one; globex: 1 of its key
    assert len(got) == 5
    claimed_at = parse_time(got[0]["job"]["locked_until"]) - 600  # type: ignore[operator]
    stats = await held()
    assert stats["held_back"] == {"concurrency": 2, "rate_limit": 3}
    assert stats["counts"]["pending"] == 6 and stats["counts"]["scheduled"] == 1
    # the rate limit's next unit, before any lease runs out
    assert parse_time(stats["next_available_at"]) == pytest.approx(claimed_at + 60, abs=1e-3)
    assert (await held("globex"))["held_back"] == {"concurrency": 1, "rate_limit": 0}
    (listed,) = (await http.get("/api/v1/queues", headers=h)).json()["queues"]
    assert listed["held_back"] == stats["held_back"]

    text = (await http.get("/metrics")).text
    assert sample(text, "qftrio_queue_held_back_jobs", tenant="acme", queue="h", limit="concurrency") == 2
    assert sample(text, "qftrio_queue_held_back_jobs", tenant="acme", queue="h", limit="rate_limit") == 3
    assert sample(text, "qftrio_queue_held_back_jobs", tenant="globex", queue="h", limit="concurrency") == 1

    async with httpx.AsyncClient(base_url=server.url, timeout=10) as browser:
        assert (await browser.post("/dashboard/signin", data={"token": server.tenants["acme"]})).status_code == 303
        page = (await browser.get("/dashboard/queues/h")).text
        live = (await browser.get("/dashboard/queues.json", params={"queue": "h"})).json()["queues"][0]
    assert '<td class="num" data-field="held_concurrency">2</td>' in page
    assert '<td class="num" data-field="held_rate_limit">3</td>' in page
    assert (live["held_concurrency"], live["held_rate_limit"]) == ("2", "3")

    # the key's place freed: its jobs are ready, no longer held back
    one = next(item for item in got if item["job"]["concurrency"] and item["job"]["tenant"] == "acme")
    assert (await report(http, server, one["job"]["id"], "complete", lease_token=one["lease_token"])).status_code == 204
    assert (await held())["held_back"] == {"concurrency": 0, "rate_limit": 3}
    # the window passed: units again
    server.clock.advance(61)
    assert (await held())["held_back"] == {"concurrency": 0, "rate_limit": 0}


# -- a freed place wakes the long polls waiting for it ------------------------------


async def parked(engine: Engine, queue: str) -> None:
    """Until a long poll of *queue* is parked on *engine*."""
    with trio.fail_after(10):
        while queue not in engine.waker._parked:
            await trio.sleep(0.01)


async def test_a_freed_concurrency_place_wakes_a_poll_on_another_server(servers: list[RunningServer]) -> None:
    a, b = servers[0], servers[-1]
    # only a wake-up can end the poll early: no safety poll, no lease running out
    b.engine.safety_poll_secs = 120
    clients = [httpx.AsyncClient(base_url=s.url, timeout=60) for s in (a, b)]
    try:
        await enqueue_batch(clients[0], a, "acme", [{"queue": "w", "concurrency": {"key": "one"}}] * 2)
        (first,) = await lease(clients[0], a, "w", max_jobs=5, lease_secs=600)
        got: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                got.extend(await lease(clients[1], b, "w", max_jobs=5, lease_secs=600, wait_secs=30))

            nursery.start_soon(poll)
            await parked(b.engine, "w")
            started = trio.current_time()
            r = await report(clients[0], a, first["job"]["id"], "complete", lease_token=first["lease_token"])
            assert r.status_code == 204
        assert [item["job"]["concurrency"] for item in got] == [{"key": "one", "limit": 1}]
        assert got[0]["job"]["id"] != first["job"]["id"]
        assert trio.current_time() - started < 15  # woken, not at its wait's end
    finally:
        for c in clients:
            await c.aclose()


@pytest.mark.parametrize("poll_on", ["the same server", "another server"])
async def test_a_freed_place_of_a_key_shared_by_queues_wakes_the_other_queue(
    servers: list[RunningServer], poll_on: str
) -> None:
    # on the embedded store both are the one server
    a, b = servers[0], servers[0] if poll_on == "the same server" else servers[-1]
    b.engine.safety_poll_secs = 120
    clients = [httpx.AsyncClient(base_url=s.url, timeout=60) for s in (a, b)]
    try:
        await enqueue_batch(clients[0], a, "acme", [{"queue": "x", "concurrency": {"key": "shared"}}])
        await enqueue_batch(clients[0], a, "acme", [{"queue": "y", "concurrency": {"key": "shared"}}])
        (first,) = await lease(clients[0], a, "x", lease_secs=600)
        got: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                got.extend(await lease(clients[1], b, "y", lease_secs=600, wait_secs=30))

            nursery.start_soon(poll)
            await parked(b.engine, "y")
            started = trio.current_time()
            await report(clients[0], a, first["job"]["id"], "complete", lease_token=first["lease_token"])
        assert [item["job"]["queue"] for item in got] == ["y"]
        assert trio.current_time() - started < 15
    finally:
        for c in clients:
            await c.aclose()


async def waiting_poll(engine: Engine, queue: str) -> Parked:
    """A long poll of *queue* parked on *engine* whose claim found nothing,
    waiting to be woken."""
    with trio.fail_after(10):
        while True:
            for poll in engine.waker._parked.get(queue, ()):
                if poll.waiting and not poll.event.is_set():
                    return poll
            await trio.sleep(0.01)


@pytest.fixture
async def quiet_janitor(storage: Store, nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    """A server whose janitor runs once, at its start: the test runs its
    round (``Engine.reap_expired``) when it wants."""
    async for running in serve_store(storage, nursery, janitor_interval_secs=3600):
        yield running


@pytest.mark.parametrize("freed_by", ["a cancel", "a bulk cancel", "the janitor"])
async def test_a_place_freed_by_a_cancel_or_the_janitor_wakes_the_polls_of_other_queues(
    quiet_janitor: RunningServer, freed_by: str
) -> None:
    server = quiet_janitor
    # only a wake-up can end the poll early: no safety poll, no wait's end
    server.engine.safety_poll_secs = 120
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        await enqueue_batch(http, server, "acme", [{"queue": "x", "concurrency": {"key": "shared"}}])
        await enqueue_batch(http, server, "acme", [{"queue": "y", "concurrency": {"key": "shared"}}])
        (first,) = await lease(http, server, "x", lease_secs=600)
        got: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                got.extend(await lease(http, server, "y", lease_secs=600, wait_secs=60))

            nursery.start_soon(poll)
            waiting = await waiting_poll(server.engine, "y")
            started = trio.current_time()
            if freed_by == "a cancel":
                r = await http.post(f"/api/v1/jobs/{first['job']['id']}/cancel", headers=server.headers())
                assert r.status_code == 200, r.text
            elif freed_by == "a bulk cancel":
                r = await http.post("/api/v1/jobs/bulk/cancel", json={"queue": "x"}, headers=server.headers())
                assert r.status_code == 200 and r.json()["count"] == 1, r.text
            else:
                server.clock.advance(601)  # the lease ran out
                assert await server.engine.reap_expired() == 1
            # woken by the change itself, before its answer
            assert waiting.event.is_set()
        assert [item["job"]["queue"] for item in got] == ["y"]
        assert trio.current_time() - started < 30  # not at its wait's end


async def test_a_poll_held_back_by_a_rate_limit_claims_when_a_unit_frees(servers: list[RunningServer]) -> None:
    a, b = servers[0], servers[-1]
    b.engine.safety_poll_secs = 120
    clients = [httpx.AsyncClient(base_url=s.url, timeout=60) for s in (a, b)]
    try:
        h = a.headers()
        assert (await clients[0].put("/api/v1/rate-limits/api", json={"limit": 1, "per_secs": 2}, headers=h)).status_code == 201
        await enqueue_batch(clients[0], a, "acme", [{"queue": "r", "rate_limit": "api"}] * 2)
        (first,) = await lease(clients[0], a, "r", max_jobs=5, lease_secs=600)
        claimed_at = parse_time(first["job"]["locked_until"]) - 600  # type: ignore[operator]
        got = await lease(clients[1], b, "r", max_jobs=5, lease_secs=600, wait_secs=30)
        assert len(got) == 1
        # claimed once the window let it, not at the wait's end
        second = parse_time(got[0]["job"]["locked_until"]) - 600  # type: ignore[operator]
        assert claimed_at + 2 <= second < claimed_at + 15
    finally:
        for c in clients:
            await c.aclose()


async def test_on_the_embedded_store_a_poll_waits_exactly_for_its_limits(
    inline_store: SqliteStore, autojump_clock: trio.abc.Clock
) -> None:
    engine = Engine(inline_store, clock=lambda: EPOCH + trio.current_time(), safety_poll_secs=100)
    await engine.rate_limit_set("t", "api", 1, 30)
    key = JobConfig(queue="q", concurrency={"key": "one"})
    rated = JobConfig(queue="q", rate_limit="api")
    await engine.enqueue("t", [EnqueueRequest(kind="k", payload={}, config=c) for c in (key, key, rated, rated)])
    first = await engine.lease("q", max_jobs=10, lease_secs=600)
    assert len(first) == 2
    started = trio.current_time()
    # the rate limit's next unit frees 30 s after its claim: the poll claims then
    (again,) = await engine.lease("q", max_jobs=10, lease_secs=600, wait_secs=60)
    assert again.job.rate_limit == "api" and trio.current_time() - started == pytest.approx(30, abs=0.01)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def poll() -> None:
            got.extend(await engine.lease("q", max_jobs=10, lease_secs=600, wait_secs=60))

        nursery.start_soon(poll)
        await trio.sleep(10)
        assert got == []
        held = next(lease for lease in first if lease.job.concurrency)
        await engine.complete([CompleteItem(held.job.id, held.lease_token, {})])
        completed = trio.current_time()
    assert [lease.job.concurrency for lease in got] == [{"key": "one", "limit": 1}]
    assert trio.current_time() - completed < 0.01


# -- batch reports over shared keys ------------------------------------------------


async def test_concurrent_batch_enqueues_of_new_keys_never_deadlock(
    servers: list[RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    # Two batches bringing the same keys, new to the store, in opposite
    # orders, enqueued at once on two servers, round after round: the keys'
    # rows are made in one order, so neither batch waits on the other in a
    # cycle (which PostgreSQL would break by failing one, and the store would
    # log and run again a second later).
    caplog.set_level(logging.INFO, logger="qftrio.store.postgres")
    clients = [httpx.AsyncClient(base_url=s.url, timeout=60) for s in servers]
    try:
        for round_ in range(20):
            keys = [f"new{round_}-{i:02d}" for i in range(40)]
            orders = [keys, keys[::-1]]

            async def enqueue(n: int) -> None:
                configs = [{"queue": "e", "concurrency": {"key": k, "limit": 1}} for k in orders[n]]
                await enqueue_batch(clients[n % len(clients)], servers[n % len(servers)], "acme", configs)

            async with trio.open_nursery() as nursery:
                for n in range(2):
                    nursery.start_soon(enqueue, n)
        assert not [r for r in caplog.records if "transaction conflict" in r.getMessage()]
        stats = (await clients[0].get("/api/v1/queues/e/stats", headers=servers[0].headers())).json()
        assert stats["counts"]["pending"] == 20 * 80
        # each key of limit 1 has one place: a lease takes one job of each
        leased = await lease(clients[0], servers[0], "e", max_jobs=100)
        assert len({item["job"]["concurrency"]["key"] for item in leased}) == len(leased) == 100
    finally:
        for c in clients:
            await c.aclose()


async def test_concurrent_batch_reports_over_shared_keys_never_deadlock(
    servers: list[RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    # Two batches whose rows (in the table's order) take the same keys in
    # opposite orders, reported at once on two servers, round after round:
    # each batch takes the keys' running counts in one order, so neither
    # waits on the other in a cycle (which PostgreSQL would break by failing
    # one, and the store would log and run again).
    caplog.set_level(logging.INFO, logger="qftrio.store.postgres")
    keys = [f"k{i:02d}" for i in range(40)]
    clients = [httpx.AsyncClient(base_url=s.url, timeout=60) for s in servers]
    try:
        for round_ in range(30):
            configs = [{"queue": "d", "concurrency": {"key": k, "limit": 100}} for k in keys + keys[::-1]]
            ids = await enqueue_batch(clients[0], servers[0], "acme", configs)
            leased = {item["job"]["id"]: item["lease_token"] for item in await lease(clients[0], servers[0], "d", max_jobs=100)}
            assert len(leased) == 2 * len(keys)
            halves = [ids[: len(keys)], ids[len(keys) :]]
            answers: list[dict[str, Any]] = []

            async def report_half(n: int) -> None:
                http, server = clients[n % len(clients)], servers[n % len(servers)]
                # completes, and fails (a plan of its own) every other round
                action, outcome = ("complete", {"result": {}}) if round_ % 2 == 0 else ("fail", {"error": "x", "retryable": False})
                body = {"items": [{"id": i, "lease_token": leased[i], **outcome} for i in halves[n]]}
                r = await http.post(f"/api/v1/leases/{action}", json=body, headers=server.headers("worker"))
                assert r.status_code == 200, r.text
                answers.extend(r.json()["results"])

            async with trio.open_nursery() as nursery:
                for n in range(2):
                    nursery.start_soon(report_half, n)
            assert [a["code"] for a in answers] == [204] * len(ids)
        assert not [r for r in caplog.records if "transaction conflict" in r.getMessage()]
        stats = (await clients[0].get("/api/v1/queues/d/stats", headers=servers[0].headers())).json()
        assert stats["counts"]["running"] == 0 and stats["counts"]["pending"] == 0
        # every key's place is free again
        configs = [{"queue": "d2", "concurrency": {"key": k, "limit": 100}} for k in keys] * 2
        await enqueue_batch(clients[0], servers[0], "acme", configs)
        assert len(await lease(clients[0], servers[0], "d2", max_jobs=100)) == 2 * len(keys)
    finally:
        for c in clients:
            await c.aclose()
