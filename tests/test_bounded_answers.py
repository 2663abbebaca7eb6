"""Answers that list are bounded: a page of jobs or workflows stops before
the server's byte budget (and loads only what fits), and the queues list is
paged, so that no request pins memory or time that grows with what a tenant
keeps. On both stores, over real HTTP, and against a real server process."""

from __future__ import annotations

import json

import functools
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio.server.engine import Engine
from qftrio.server.serve import run_server
from qftrio.server.store.base import NewJob, Store

from .conftest import server_config
from .processes import free_port, spawn, stop, wait_healthy

T0 = 1_800_000_000.0
ACME = {"Authorization": "Bearer acme-secret"}


async def start(storage: Store, nursery: trio.Nursery, **overrides: Any) -> str:
    """A real server on *storage* with *overrides* of the test settings; its URL."""
    stop_event = trio.Event()
    run = functools.partial(run_server, Engine(storage), server_config(**overrides), shutdown_trigger=stop_event.wait)
    return (await nursery.start(run))[0]


async def insert(storage: Store, n: int, *, payload_bytes: int, tenant: str = "acme", queue: str = "q") -> list[str]:
    """*n* jobs, one created a second after the other, each with a payload of
    about *payload_bytes*; their ids, oldest first."""
    ids = []
    for i in range(n):
        new = NewJob(tenant=tenant, queue=queue, kind="k", payload={"i": i, "blob": "x" * payload_bytes}, scheduled_at=T0)
        (inserted,) = await storage.jobs_insert([new], now=T0 + i)
        ids.append(inserted.id)
    return ids


async def pages(http: httpx.AsyncClient, path: str, key: str, **params: Any) -> list[httpx.Response]:
    """Every page of a listing, following ``next_cursor``."""
    answers = []
    cursor = None
    while True:
        r = await http.get(path, params={**params, **({"cursor": cursor} if cursor else {})}, headers=ACME)
        assert r.status_code == 200, r.text
        answers.append(r)
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return answers


# -- jobs and workflows: pages bounded in bytes ------------------------------------------


async def test_a_page_of_jobs_stops_before_the_byte_budget_and_loads_only_what_fits(storage) -> None:
    ids = await insert(storage, 10, payload_bytes=10_000)
    page = await storage.jobs_page(tenant="acme", limit=10, max_bytes=35_000)
    assert [j.id for j in page.items] == ids[::-1][:3]  # about 11 kB each
    assert page.next == (page.items[-1].created_at.timestamp(), page.items[-1].id)
    seen = [j.id for j in page.items]
    while page.next is not None:
        page = await storage.jobs_page(tenant="acme", limit=10, before=page.next, max_bytes=35_000)
        assert 1 <= len(page.items) <= 3
        seen += [j.id for j in page.items]
    assert seen == ids[::-1]
    # without a budget, or with room to spare, the count alone decides
    assert len((await storage.jobs_page(tenant="acme", limit=10)).items) == 10
    whole = await storage.jobs_page(tenant="acme", limit=4, max_bytes=10_000_000)
    assert len(whole.items) == 4 and whole.next == (whole.items[-1].created_at.timestamp(), whole.items[-1].id)
    last = await storage.jobs_page(tenant="acme", limit=10, max_bytes=10_000_000)
    assert len(last.items) == 10 and last.next is None


async def test_a_job_bigger_than_the_budget_comes_alone(storage) -> None:
    ids = await insert(storage, 3, payload_bytes=50_000)
    seen = []
    page = await storage.jobs_page(tenant="acme", limit=50, max_bytes=2_000)
    while True:
        assert len(page.items) == 1
        seen.append(page.items[0].id)
        if page.next is None:
            break
        page = await storage.jobs_page(tenant="acme", limit=50, before=page.next, max_bytes=2_000)
    assert seen == ids[::-1]


async def test_pages_of_jobs_stay_under_the_budget_over_http(storage, nursery) -> None:
    budget = 100_000
    async with httpx.AsyncClient(base_url=await start(storage, nursery, max_answer_bytes=budget), timeout=30) as http:
        created = set()
        for i in range(40):  # every long field of a job, from a payload to its errors
            body = {"kind": "k", "payload": {"i": i, "blob": "é\n" * 3_000}}
            r = await http.post("/api/v1/jobs", json=body, headers=ACME)
            assert r.status_code == 201
            created.add(r.json()["id"])
        worker = {"Authorization": "Bearer worker-secret"}
        r = await http.post("/api/v1/queues/default/lease", json={"max_jobs": 40, "worker_id": "w" * 200}, headers=worker)
        leases = r.json()["jobs"]
        for n, lease in enumerate(leases):
            job_id, token = lease["job"]["id"], lease["lease_token"]
            if n % 2:
                report = {"lease_token": token, "result": {"out": "\x01\"" * 2_000}}
                assert (await http.post(f"/api/v1/jobs/{job_id}/complete", json=report, headers=worker)).status_code == 204
            else:
                report = {"lease_token": token, "error": "\x02\\" * 3_000, "retryable": False}
                assert (await http.post(f"/api/v1/jobs/{job_id}/fail", json=report, headers=worker)).status_code == 204
        answers = await pages(http, "/api/v1/jobs", "jobs", limit=1000)
    assert all(len(r.content) <= budget for r in answers), [len(r.content) for r in answers]
    listed = [job["id"] for r in answers for job in r.json()["jobs"]]
    assert len(listed) == len(set(listed)) and set(listed) == created
    # and no page leaves much of the budget unused: the next job would not
    # have fitted (the store's estimate of a job's bytes is on the safe side,
    # up to about twice its answer for the escaped texts)
    assert len(answers) > 2
    for r, after in zip(answers, answers[1:]):
        following = len(json.dumps(after.json()["jobs"][0]).encode())
        assert len(r.content) + 2 * following > budget, (len(r.content), following)


async def test_pages_of_workflows_stop_before_the_budget(storage, nursery) -> None:
    budget = 60_000
    async with httpx.AsyncClient(base_url=await start(storage, nursery, max_answer_bytes=budget), timeout=30) as http:
        created = set()
        for i in range(12):
            steps = [{"name": f"s{n}", "kind": "k", "payload": {"blob": "y" * 5_000}} for n in range(2)]
            body = {"name": f"w{i}", "context": {"c": "z" * 10_000}, "steps": steps}
            r = await http.post("/api/v1/workflows", json=body, headers=ACME)
            assert r.status_code == 201, r.text
            created.add(r.json()["id"])
        answers = await pages(http, "/api/v1/workflows", "workflows", limit=100)
    assert all(len(r.content) <= budget for r in answers), [len(r.content) for r in answers]
    listed = [w["id"] for r in answers for w in r.json()["workflows"]]
    assert len(listed) == len(set(listed)) and set(listed) == created
    assert len(answers) >= 4


# -- a real server process: 400 jobs of 1 MB, read four times at once ------------------------


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_four_readers_of_400_jobs_of_1_mb_pin_bounded_memory(backend: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    acme, globex = "acme-token-0123456789", "globex-token-0123456789"
    args = ["serve", "--bind", f"127.0.0.1:{port}", "--worker-token", "worker-token-0123456789",
            "--tenant", f"acme={acme}", "--tenant", f"globex={globex}", "--max-body-bytes", str(2 << 20)]  # fmt: skip
    if backend == "postgres":
        database_url = os.environ.get("QFTRIO_TEST_DATABASE_URL")
        if not database_url:
            pytest.skip("QFTRIO_TEST_DATABASE_URL is not set")
        from .pg import reset_database

        await reset_database(database_url)
        args += ["--database-url", database_url]
    else:
        args += ["--db", str(tmp_path / "big.db")]
    proc = spawn(args, log=tmp_path / "server.log")
    try:
        await wait_healthy(url)
        a, b = {"Authorization": f"Bearer {acme}"}, {"Authorization": f"Bearer {globex}"}
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            created: set[str] = set()

            async def enqueue(first: int) -> None:
                for i in range(first, 400, 4):
                    body = {"kind": "k", "payload": {"i": i, "blob": "x" * (1 << 20)}}
                    r = await http.post("/api/v1/jobs", json=body, headers=a)
                    assert r.status_code == 201, r.text
                    created.add(r.json()["id"])

            async with trio.open_nursery() as enqueuers:
                for first in range(4):
                    enqueuers.start_soon(enqueue, first)
            before = peak_rss_bytes(proc.pid)
            read: list[list[str]] = []
            sizes: list[int] = []
            other_answered: list[int] = []

            async def reader() -> None:
                ids: list[str] = []
                cursor = None
                while True:
                    params = {"limit": 400, **({"cursor": cursor} if cursor else {})}
                    r = await http.get("/api/v1/jobs", params=params, headers=a)
                    assert r.status_code == 200, r.text
                    sizes.append(len(r.content))
                    page = r.json()
                    ids += [job["id"] for job in page["jobs"]]
                    cursor = page["next_cursor"]
                    if cursor is None:
                        break
                read.append(ids)

            async def other_tenant() -> None:
                # while the four read, another tenant's enqueue is answered
                while len(read) < 4:
                    r = await http.post("/api/v1/jobs", json={"kind": "k"}, headers=b)
                    assert r.status_code == 201
                    other_answered.append(r.status_code)
                    await trio.sleep(0.05)

            async with trio.open_nursery() as readers:
                readers.start_soon(other_tenant)
                for _ in range(4):
                    readers.start_soon(reader)
            peak = peak_rss_bytes(proc.pid)
    finally:
        stop(proc)
    assert len(created) == 400
    for ids in read:
        assert len(ids) == 400 and set(ids) == created  # every job once
    assert max(sizes) <= 8 << 20, max(sizes)
    assert other_answered
    assert peak < 1_500_000_000, (before, peak)


# -- the queues list: paged by name --------------------------------------------------------


async def many_queues(http: httpx.AsyncClient, n: int) -> list[str]:
    """*n* queues with a job each (and as many kind names); their names."""
    names = [f"q{i:05d}" for i in range(n)]
    for first in range(0, n, 1000):
        jobs = [{"kind": f"k{name}", "config": {"queue": name}} for name in names[first : first + 1000]]
        r = await http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=ACME)
        assert r.status_code == 201, r.text
    return names


@pytest.mark.soak
async def test_20000_queues_are_read_a_page_at_a_time(storage, nursery) -> None:
    async with httpx.AsyncClient(base_url=await start(storage, nursery), timeout=60) as http:
        names = await many_queues(http, 20_000)
        # a paused queue with no job is listed too, in its place
        r = await http.post("/api/v1/queues/q10000-paused/pause", headers=ACME)
        assert r.status_code == 200
        names = sorted([*names, "q10000-paused"])
        first = await http.get("/api/v1/queues", headers=ACME)  # as clients before pages asked
        assert first.status_code == 200
        page = first.json()
        assert [q["queue"] for q in page["queues"]] == names[:100]  # the default page
        assert page["next_cursor"] and len(first.content) < 50_000
        answers = await pages(http, "/api/v1/queues", "queues", limit=1000)
        assert all(len(r.content) < 500_000 for r in answers)
        listed = [q["queue"] for r in answers for q in r.json()["queues"]]
        assert listed == names  # every queue once, by name
        paused = [q for r in answers for q in r.json()["queues"] if q["paused"]]
        assert [q["queue"] for q in paused] == ["q10000-paused"] and paused[0]["counts"]["pending"] == 0
        assert answers[0].json()["queues"][0]["counts"]["pending"] == 1
        for cursor in ("!!", "bm90IGEgbmFtZSE", "WzEsICJcdWQ4MDAiXQ"):
            r = await http.get("/api/v1/queues", params={"cursor": cursor}, headers=ACME)
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_cursor", r.text
        for limit in (0, 1001):
            r = await http.get("/api/v1/queues", params={"limit": limit}, headers=ACME)
            assert r.status_code == 422 and "limit" in r.json()["error"]["message"], r.text
        # another tenant sees none of them
        r = await http.get("/api/v1/queues", headers={"Authorization": "Bearer globex-secret"})
        assert r.json() == {"queues": [], "next_cursor": None}


async def test_the_clients_the_command_line_and_the_dashboard_follow_the_queue_pages(
    storage, nursery, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import re

    import qftrio
    from qftrio.cli import main

    url = await start(storage, nursery)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        names = await many_queues(http, 2_500)
        async with qftrio.Client(url, "acme-secret") as client:
            assert [s.queue for s in await client.queues()] == names[:100]
            listed, cursor = await client.queues_page(limit=1000)
            while cursor is not None:
                page, cursor = await client.queues_page(limit=1000, cursor=cursor)
                listed += page
            assert [s.queue for s in listed] == names
        # qftrio queues lists every queue, a page at a time
        code = await trio.to_thread.run_sync(lambda: main(["queues", "--url", url, "--token", "acme-secret"]))
        assert code == 0
        assert [q["queue"] for q in json.loads(capsys.readouterr().out)["queues"]] == names
        # the dashboard shows a page, with a link to the next
        assert (await http.post("/dashboard/signin", data={"token": "acme-secret"})).status_code == 303
        seen: list[str] = []
        path = "/dashboard/"
        while True:
            r = await http.get(path)
            assert r.status_code == 200
            seen += re.findall(r'<tr data-queue="([^"]+)"', r.text)
            found = re.search(r'<a href="([^"]+)">Next queues »</a>', r.text)
            if found is None:
                break
            path = "/dashboard/" + found[1].replace("&amp;", "&")
            assert "those of the queues on this page" in r.text
        assert seen == names
        live = await http.get("/dashboard/queues.json", params={"cursor": re.search(r"cursor=([^\"&]+)", path)[1]})
        assert [q["queue"] for q in live.json()["queues"]] == names[2_400:]


async def add_queues(storage: Store, first: int, last: int) -> None:
    """Queues ``q{first:05d}`` up to ``q{last - 1:05d}``, a job each."""
    for start_at in range(first, last, 1000):
        jobs = [
            NewJob(tenant="acme", queue=f"q{i:05d}", kind="k", payload={}, scheduled_at=T0)
            for i in range(start_at, min(start_at + 1000, last))
        ]
        await storage.jobs_insert(jobs, now=T0)


async def page_work(storage: Store, after: str, limit: int) -> int:
    """What the store does for one page of queues: SQLite's virtual machine
    steps; on PostgreSQL, the rows every node of the plan handles."""
    if hasattr(storage, "_conn"):
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        storage._conn.set_progress_handler(count, 100)
        try:
            await storage.queues_page(tenant="acme", now=T0, limit=limit, after=after)
        finally:
            storage._conn.set_progress_handler(None, 0)
        return steps[0]
    import asyncpg

    from qftrio.server.store import sql

    from .pg import on_asyncio, pg_url

    async def explain() -> Any:
        conn = await asyncpg.connect(pg_url())
        try:
            statement = "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.load("postgres")["queues_page"]
            return await conn.fetchval(statement, T0, "acme", after, limit)
        finally:
            await conn.close()

    import json

    def rows(node: dict[str, Any]) -> int:
        own = node["Actual Rows"] * node["Actual Loops"]
        return own + sum(rows(child) for child in node.get("Plans", ()))

    return rows(json.loads(await on_asyncio(explain))[0]["Plan"])


async def test_a_page_of_queues_costs_the_same_with_20000_names_as_with_1000(storage) -> None:
    await add_queues(storage, 0, 1_000)
    small = await page_work(storage, "q00500", 100)
    await add_queues(storage, 1_000, 20_000)
    large = await page_work(storage, "q00500", 100)
    assert [s.queue for s in await storage.queues_page(tenant="acme", now=T0, limit=100, after="q00500")] == [
        f"q{i:05d}" for i in range(501, 601)
    ]
    assert large < small * 1.5, (small, large)
