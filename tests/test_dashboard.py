"""The web dashboard: its pages in a real browser (chromium through
Playwright), and its security over real HTTP."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio.models import CompleteItem, EnqueueRequest, FailItem, JobConfig, QueueStats, Status, WorkflowCreateRequest
from qftrio.server.dashboard import Throughput, csrf_token, timeline
from qftrio.server.engine import Engine
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import open_sqlite_store

from .browser import in_browser, needs_chromium, sign_in
from .conftest import RunningServer

ACME = "acme-secret"


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Store]:
    """The embedded store only, under the suite's real server: the dashboard
    adds no query of its own, and the stores' conformance suite covers both
    backends."""
    async with open_sqlite_store(tmp_path / "qftrio.db") as store:
        yield store


async def enqueue(
    engine: Engine, n: int, *, queue: str = "q", payload: dict[str, Any] | None = None, **spec: Any
) -> list[str]:
    inserted = await engine.enqueue("acme", [EnqueueRequest(kind="k", payload=payload or {}, config=JobConfig(queue=queue, **spec))] * n)
    return [i.job.id for i in inserted]


async def complete_all(engine: Engine, queue: str) -> None:
    leases = await engine.lease(queue, max_jobs=100, worker_id="w1")
    await engine.complete([CompleteItem(lease.job.id, lease.lease_token, {"ok": True}) for lease in leases])


async def dead_letters(engine: Engine, n: int, queue: str = "q") -> list[str]:
    ids = await enqueue(engine, n, queue=queue, max_attempts=1)
    leases = await engine.lease(queue, max_jobs=n, worker_id="w1")
    await engine.fail([FailItem(lease.job.id, lease.lease_token, "boom", False) for lease in leases])
    return ids


@contextlib.asynccontextmanager
async def signed_in(server: RunningServer, token: str = ACME) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        answer = await client.post("/dashboard/signin", data={"token": token})
        assert answer.status_code == 303
        yield client


# -- in the browser ---------------------------------------------------------


@needs_chromium
async def test_counts_go_live_as_a_worker_completes_jobs_then_sign_out(server: RunningServer) -> None:
    await enqueue(server.engine, 3)

    def scenario(page: Any) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        row = page.locator('tr[data-queue="q"]')
        expect(row.locator('[data-field="pending"]')).to_have_text("3")
        expect(row.locator('[data-field="completed"]')).to_have_text("0")
        trio.from_thread.run(complete_all, server.engine, "q")
        # No reload: the page's refresh brings the new counts.
        expect(row.locator('[data-field="completed"]')).to_have_text("3")
        expect(row.locator('[data-field="pending"]')).to_have_text("0")
        expect(page.locator("#throughput")).to_be_visible()

        page.click('tr[data-queue="q"] [data-field="completed"] a')
        page.locator("table.jobs a.mono").first.click()
        expect(page.locator("h1 .status")).to_have_text("completed")
        expect(page.locator("#result")).to_contain_text('"ok": true')
        expect(page.locator("#worker")).to_have_text("w1")
        expect(page.locator("ol.timeline")).to_contain_text("completed on attempt 1")

        page.click("header form.signout button")
        expect(page).to_have_url(re.compile(r"/dashboard/signin$"))
        page.goto(f"{server.url}/dashboard/jobs")
        expect(page).to_have_url(re.compile(r"/dashboard/signin\?next=%2Fdashboard%2Fjobs$"))

    await in_browser(scenario)


@needs_chromium
async def test_retry_a_dead_letter_then_all_and_cancel_a_job_with_javascript_off(server: RunningServer) -> None:
    first, *rest = await dead_letters(server.engine, 3)
    (pending,) = await enqueue(server.engine, 1, queue="other")

    def scenario(page: Any) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        page.click("header nav >> text=Dead letters")
        expect(page.locator("table.jobs tbody tr")).to_have_count(3)
        page.locator(f'tr:has(a:text-is("{first}")) button:text-is("Retry")').click()
        expect(page.locator("h1 .status")).to_have_text("pending")

        page.click("header nav >> text=Dead letters")
        expect(page.locator("table.jobs tbody tr")).to_have_count(2)
        page.click('button:text-is("Retry all")')
        expect(page.locator(".notice")).to_have_text("2 jobs retried")
        expect(page.locator("td.empty")).to_have_text("No jobs match.")

        page.goto(f"{server.url}/dashboard/jobs/{pending}")
        page.click('button:text-is("Cancel")')
        expect(page.locator("h1 .status")).to_have_text("cancelled")

    await in_browser(scenario, javascript=False)
    jobs = [await server.engine.job_get("acme", job_id) for job_id in (first, *rest, pending)]
    assert [job.status for job in jobs] == [Status.PENDING] * 3 + [Status.CANCELLED]


@needs_chromium
async def test_pausing_a_queue_stops_its_leases(server: RunningServer) -> None:
    await enqueue(server.engine, 2)

    async def lease_one() -> int:
        return len(await server.engine.lease("q", max_jobs=1))

    def scenario(page: Any) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        page.click('tr[data-queue="q"] a:text-is("q")')
        assert trio.from_thread.run(lease_one) == 1
        page.click('button:text-is("Pause queue")')
        expect(page.locator("#state")).to_have_text("paused")
        assert trio.from_thread.run(lease_one) == 0
        page.click('button:text-is("Resume queue")')
        expect(page.locator("#state")).to_have_text("active")
        assert trio.from_thread.run(lease_one) == 1

    await in_browser(scenario)


@needs_chromium
async def test_a_script_in_a_payload_shows_as_text_and_a_cross_site_post_is_refused(server: RunningServer) -> None:
    markup = "<script>window.pwned = 1</script><img src=x onerror=window.pwned=2>"
    (job_id,) = await enqueue(server.engine, 1, payload={"note": markup})

    def scenario(page: Any) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        page.goto(f"{server.url}/dashboard/jobs/{job_id}")
        expect(page.locator("#payload")).to_contain_text(markup)
        expect(page.locator("#payload script, #payload img")).to_have_count(0)
        assert page.evaluate("window.pwned") is None

        # Another site's page posting to the dashboard, in the signed-in browser.
        page.goto("about:blank")
        page.set_content(
            f'<form method="post" action="{server.url}/dashboard/jobs/{job_id}/cancel">'
            '<input name="csrf" value="guess"><button>go</button></form>'
        )
        with page.expect_navigation():
            page.click("button")
        expect(page.locator("h1")).to_contain_text("40")

    await in_browser(scenario)
    assert (await server.engine.job_get("acme", job_id)).status is Status.PENDING


# -- over HTTP -------------------------------------------------------------


async def test_every_answer_carries_the_security_headers(server: RunningServer) -> None:
    async with signed_in(server) as client:
        for path in ["/dashboard/", "/dashboard/signin", "/dashboard/jobs/nope", "/dashboard/static/dashboard.js"]:
            answer = await client.get(path)
            csp = answer.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp, path
            assert "frame-ancestors 'none'" in csp, path
            assert answer.headers["X-Frame-Options"] == "DENY", path
            assert answer.headers["X-Content-Type-Options"] == "nosniff", path


async def test_sign_in_sets_an_http_only_strict_cookie_and_refuses_a_wrong_token(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.post("/dashboard/signin", data={"token": "nope"})
        assert answer.status_code == 401 and "set-cookie" not in answer.headers
        assert "unknown credential" in answer.text
        answer = await client.post("/dashboard/signin", data={"token": ACME, "next": "https://evil.example/"})
        assert answer.status_code == 303 and answer.headers["Location"] == "/dashboard/"
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/dashboard" in cookie
        # Plain HTTP here: the cookie could not be sent back if it were Secure.
        assert "Secure" not in cookie
        behind_tls = {"X-Forwarded-Proto": "https"}
        answer = await client.post("/dashboard/signin", data={"token": ACME}, headers=behind_tls)
        assert "; Secure" in answer.headers["set-cookie"]


async def test_an_action_without_the_sessions_csrf_token_is_refused(server: RunningServer) -> None:
    (job_id,) = await enqueue(server.engine, 1)
    cancel = f"/dashboard/jobs/{job_id}/cancel"
    async with signed_in(server) as client:
        assert (await client.post(cancel)).status_code == 403
        assert (await client.post(cancel, data={"csrf": csrf_token("globex-secret")})).status_code == 403
        other_site = {"Origin": "https://evil.example"}
        answer = await client.post(cancel, data={"csrf": csrf_token(ACME)}, headers=other_site)
        assert answer.status_code == 403
        answer = await client.post(cancel, data={"csrf": csrf_token(ACME), "pad": "x" * 20_000})
        assert answer.status_code == 413
        assert (await server.engine.job_get("acme", job_id)).status is Status.PENDING
        answer = await client.post(cancel, data={"csrf": csrf_token(ACME)})
        assert answer.status_code == 303
    assert (await server.engine.job_get("acme", job_id)).status is Status.CANCELLED


async def test_a_tenant_sees_only_its_own_jobs(server: RunningServer) -> None:
    (job_id,) = await enqueue(server.engine, 1, queue="secret-q")
    async with signed_in(server, "globex-secret") as client:
        assert (await client.get(f"/dashboard/jobs/{job_id}")).status_code == 404
        assert job_id not in (await client.get("/dashboard/jobs")).text
        assert "secret-q" not in (await client.get("/dashboard/")).text
        answer = await client.post(f"/dashboard/jobs/{job_id}/cancel", data={"csrf": csrf_token("globex-secret")})
        assert answer.status_code == 404
    assert (await server.engine.job_get("acme", job_id)).status is Status.PENDING


async def test_bad_filters_get_a_4xx_page_and_pages_go_by_cursor(server: RunningServer) -> None:
    ids = await enqueue(server.engine, 51)
    async with signed_in(server) as client:
        for query in ["status=bogus", "queue=no%20spaces", "cursor=garbage"]:
            answer = await client.get(f"/dashboard/jobs?{query}")
            assert answer.status_code == 422 and "text/html" in answer.headers["content-type"], query
        first = await client.get("/dashboard/jobs?queue=q")
        (older,) = re.findall(r'href="(\?[^"]*cursor=[^"]*)"', first.text)
        second = await client.get("/dashboard/jobs" + older.replace("&amp;", "&"))
    shown = set(re.findall(r"/dashboard/jobs/([0-9a-f-]{36})", first.text + second.text))
    assert shown == set(ids)


async def test_the_timeline_follows_a_job_through_its_attempts(server: RunningServer) -> None:
    (job_id,) = await enqueue(server.engine, 1, max_attempts=2)
    for _ in range(2):
        (lease,) = await server.engine.lease("q")
        await server.engine.fail([FailItem(job_id, lease.lease_token, "boom", True)])
        server.clock.advance(3600)
    events = [what for _, what in timeline(await server.engine.job_get("acme", job_id))]
    assert events == ["enqueued", "attempt 1 failed", "attempt 2 failed; no attempt left (dead letter)"]


async def test_the_workflow_and_workers_pages_show_steps_and_who_holds_jobs(server: RunningServer) -> None:
    body = WorkflowCreateRequest.model_validate(
        {"name": "wf", "steps": [{"name": "a", "kind": "k"}, {"name": "b", "kind": "k", "depends_on": ["a"]}]}
    )
    workflow = await server.engine.workflow_create("acme", body)
    await server.engine.lease("default", worker_id="worker-7")
    async with signed_in(server) as client:
        page = (await client.get(f"/dashboard/workflows/{workflow.id}")).text
        workers = (await client.get("/dashboard/workers")).text
        listing = (await client.get("/dashboard/workflows")).text
    steps = re.findall(r"<tr>\s*<td>(\w+)</td>\s*<td>k</td>\s*<td>([^<]*)</td>\s*<td><span[^>]*>(\w+)</span>", page)
    assert steps == [("a", "–", "running"), ("b", "a", "waiting")]
    assert "worker-7" in workers and workflow.id in listing


def test_throughput_is_completed_jobs_per_second_over_the_last_minute() -> None:
    now = [0.0]
    throughput = Throughput(clock=lambda: now[0])

    def observe(at: float, completed: int) -> tuple[float | None, list[float]]:
        now[0] = at
        counts = {"completed": completed}
        stats = QueueStats(queue="q", counts=counts, oldest_ready_at=None, next_available_at=None)
        return throughput.observe("acme", stats)

    assert observe(0, 100) == (None, [])
    assert observe(2, 110) == (5.0, [5.0])
    assert observe(2.5, 112) == (4.8, [5.0])
    assert observe(4, 130) == (7.5, [5.0, 10.0])
    # A minute without a look: no rate until the next sample.
    assert observe(70, 130) == (None, [5.0, 10.0, 0.0])
    # Deleting completed jobs is not negative throughput.
    assert observe(71, 0) == (0.0, [5.0, 10.0, 0.0, 0.0])
