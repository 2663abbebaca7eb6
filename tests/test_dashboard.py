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

from qftrio.models import (
    CompleteItem, EnqueueRequest, FailItem, JobConfig, QueueStats, ScheduleRequest, SnoozeItem, Status, StepsAddRequest,
    WorkflowCreateRequest,
)
from qftrio.server.dashboard import Throughput, csrf_token, timeline
from qftrio.server.dashboard.figures import idle_note
from qftrio.server.engine import Engine
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import open_sqlite_store

from .browser import DESKTOP, PHONE, in_browser, needs_chromium, sign_in
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


def form_csrf(page: str) -> str:
    """The CSRF token the forms of a page carry."""
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no form with a CSRF token"
    return found[1]


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
        expect(page.locator('[data-summary="pending"]')).to_have_text("0")
        expect(page.locator("#throughput")).to_be_visible()

        page.click('tr[data-queue="q"] [data-field="completed"] a')
        page.locator("table.jobs a.mono").first.click()
        expect(page.locator("h1 .status")).to_have_text("completed")
        expect(page.locator("#result")).to_contain_text('"ok": true')
        expect(page.locator("#worker")).to_have_text("w1")
        expect(page.locator("ol.timeline")).to_contain_text("attempt 1 claimed by w1")
        expect(page.locator("ol.timeline")).to_contain_text("attempt 1 completed")

        page.click("header form.signout button")
        expect(page).to_have_url(re.compile(r"/dashboard/signin$"))
        page.goto(f"{server.url}/dashboard/jobs")
        expect(page).to_have_url(re.compile(r"/dashboard/signin\?next=%2Fdashboard%2Fjobs$"))

    await in_browser(scenario)


@needs_chromium
async def test_retry_a_dead_letter_then_all_after_confirming_and_cancel_a_job_with_javascript_off(
    server: RunningServer,
) -> None:
    first, *rest = await dead_letters(server.engine, 3)
    (pending,) = await enqueue(server.engine, 1, queue="other")

    async def statuses() -> list[Status]:
        return [(await server.engine.job_get("acme", job_id)).status for job_id in rest]

    def scenario(page: Any) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        page.click("header nav >> text=Dead letters")
        expect(page.locator("table.jobs tbody tr")).to_have_count(3)
        page.locator(f'tr:has(a:text-is("{first}")) button:text-is("Retry")').click()
        expect(page.locator("h1 .status")).to_have_text("pending")

        page.click("header nav >> text=Dead letters")
        expect(page.locator("table.jobs tbody tr")).to_have_count(2)
        page.click('a:text-is("Retry all…")')
        # The count first, and nothing retried yet.
        expect(page.locator("h1")).to_have_text("Retry 2 jobs?")
        assert trio.from_thread.run(statuses) == [Status.FAILED] * 2
        # No queue is chosen: the browser asks for the explicit choice first.
        page.click('button:text-is("Retry 2 jobs")')
        expect(page.locator("h1")).to_have_text("Retry 2 jobs?")
        assert trio.from_thread.run(statuses) == [Status.FAILED] * 2
        page.check('input[name="every_queue"]')
        page.click('button:text-is("Retry 2 jobs")')
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
async def test_the_queue_page_shows_what_flow_control_holds_back_as_it_changes(server: RunningServer) -> None:
    await enqueue(server.engine, 3, queue="k", concurrency={"key": "one"})

    async def lease_one() -> None:
        assert len(await server.engine.lease("k", max_jobs=5, lease_secs=600)) == 1

    def scenario(page: Any) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        page.goto(f"{server.url}/dashboard/queues/k")
        row = page.locator('tr[data-queue="k"]')
        expect(row.locator('[data-field="held_concurrency"]')).to_have_text("0")
        trio.from_thread.run(lease_one)
        # No reload: the page's refresh brings the count.
        expect(row.locator('[data-field="held_concurrency"]')).to_have_text("2")
        expect(row.locator('[data-field="held_rate_limit"]')).to_have_text("0")

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
        expect(page.locator("h1")).to_have_text("Not allowed")

    await in_browser(scenario)
    assert (await server.engine.job_get("acme", job_id)).status is Status.PENDING


async def every_kind_of_page(engine: Engine) -> list[str]:
    """Jobs, a dead letter, a workflow and a running job with long names
    and a long error, as a worst case for narrow screens; the path of
    every page."""
    long_queue, long_kind = "q-" + "x" * 60, "k-" + "y" * 60
    inserted = await engine.enqueue(
        "acme", [EnqueueRequest(kind=long_kind, payload={"n": 1}, config=JobConfig(queue=long_queue))] * 3
    )
    await engine.lease(long_queue, max_jobs=1, worker_id="worker-" + "w" * 60)
    (dead,) = await enqueue(engine, 1, queue="d", max_attempts=1)
    (lease,) = await engine.lease("d")
    await engine.fail([FailItem(dead, lease.lease_token, "Traceback: " + "boom " * 400, False)])
    body = WorkflowCreateRequest.model_validate({"name": "wf", "steps": [{"name": "a", "kind": long_kind}]})
    workflow = await engine.workflow_create("acme", body)
    schedule = ScheduleRequest.model_validate(
        {"cron": "30 2 * * *", "timezone": "America/Argentina/ComodRivadavia", "job": {"kind": long_kind, "config": {"queue": long_queue}}}
    )
    await engine.schedule_put("acme", "s-" + "z" * 60, schedule)
    await engine.schedule_trigger("acme", "s-" + "z" * 60)
    return [
        "/dashboard/",
        f"/dashboard/queues/{long_queue}",
        "/dashboard/jobs",
        f"/dashboard/jobs/{inserted[0].job.id}",
        f"/dashboard/jobs/{dead}",
        "/dashboard/dead",
        "/dashboard/jobs/bulk?action=cancel",
        "/dashboard/workflows",
        f"/dashboard/workflows/{workflow.id}",
        "/dashboard/workers",
        "/dashboard/schedules",
        "/dashboard/no-such-page",
    ]


@needs_chromium
async def test_on_a_phone_no_page_is_wider_than_the_screen_and_the_header_keeps_sign_out_on_its_line(
    server: RunningServer,
) -> None:
    paths = await every_kind_of_page(server.engine)

    def scenario(page: Any) -> None:
        sign_in(page, server.url, ACME)
        for path in paths:
            page.goto(server.url + path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], (path, width)
            brand = page.locator("header .brand").bounding_box()
            button = page.locator("header form.signout button").bounding_box()
            # One line of text, inside the screen, on the brand's line.
            assert button["height"] < 2 * brand["height"], (path, button)
            assert button["x"] + button["width"] <= PHONE["width"], (path, button)
            assert abs((button["y"] + button["height"] / 2) - (brand["y"] + brand["height"] / 2)) < brand["height"], path
            # The menu wraps: every item whole, on the screen, none hidden
            # in a box that would have to scroll.
            nav = page.locator("header nav")
            assert nav.evaluate("(el) => el.scrollWidth <= el.clientWidth"), path
            items = nav.locator("a")
            assert items.count() == 7, path
            for k in range(items.count()):
                box = items.nth(k).bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (path, k, box)
                assert box["y"] + box["height"] <= page.viewport_size["height"], (path, k, box)

    await in_browser(scenario, viewport=PHONE)


@needs_chromium
async def test_on_a_desktop_ids_and_ages_stay_on_one_line(server: RunningServer) -> None:
    paths = await every_kind_of_page(server.engine)
    lines = """(selector) => [...document.querySelectorAll(selector)].map((el) => {
        const range = document.createRange();
        range.selectNodeContents(el);
        return new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size;
    })"""

    def scenario(page: Any) -> None:
        sign_in(page, server.url, ACME)
        for path in paths:
            page.goto(server.url + path)
            counts = page.evaluate(lines, "td .mono, td.age, td .age, td.kind, td .kind")
            assert set(counts) <= {1}, (path, counts)

    await in_browser(scenario)


@needs_chromium
async def test_the_chart_says_when_nothing_completed_and_draws_once_jobs_complete(server: RunningServer) -> None:
    await enqueue(server.engine, 3)

    def scenario(page: Any) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        # Two refreshes a second or more apart: a rate of nothing.
        expect(page.locator("#chart-note")).to_have_text(re.compile(r"^Nothing completed in the last \d+ seconds\.$"))
        expect(page.locator("#throughput")).to_be_hidden()
        # A queue's own page says it too, of that queue.
        page.goto(f"{server.url}/dashboard/queues/q")
        expect(page.locator("#chart-note")).to_have_text(re.compile(r"^Nothing completed in the last \d+ seconds\.$"))
        trio.from_thread.run(complete_all, server.engine, "q")
        expect(page.locator("#throughput")).to_be_visible()
        expect(page.locator("#chart-note")).to_be_hidden()
        page.goto(f"{server.url}/dashboard/")
        expect(page.locator("#throughput")).to_be_visible()
        expect(page.locator("#chart-note")).to_be_hidden()

    await in_browser(scenario)


def test_the_chart_note_names_the_time_its_series_cover() -> None:
    assert idle_note([[0.0], [0.0, 0.0]], 30.4) == "Nothing completed in the last 30 seconds."
    assert idle_note([[0.0]], 90) == "Nothing completed in the last minute."
    assert idle_note([[0.0]], 310) == "Nothing completed in the last 5 minutes."
    assert idle_note([], 310) == "Nothing completed in the last 5 minutes."
    # A job completed in the time covered, or too little time to say.
    assert idle_note([[0.0], [0.0, 0.5]], 310) is None
    assert idle_note([[]], 1.5) is None


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


async def page_csrf(client: httpx.AsyncClient) -> str:
    """The CSRF token of the client's session, as its pages carry it."""
    return form_csrf((await client.get("/dashboard/")).text)


async def test_an_action_without_the_sessions_csrf_token_is_refused(server: RunningServer) -> None:
    (job_id,) = await enqueue(server.engine, 1)
    cancel = f"/dashboard/jobs/{job_id}/cancel"
    async with signed_in(server) as client, signed_in(server) as other_session:
        csrf = await page_csrf(client)
        assert (await client.post(cancel)).status_code == 403
        # the same tenant's other session has a CSRF token of its own
        other = await page_csrf(other_session)
        assert other != csrf
        assert (await client.post(cancel, data={"csrf": other})).status_code == 403
        other_site = {"Origin": "https://evil.example"}
        answer = await client.post(cancel, data={"csrf": csrf}, headers=other_site)
        assert answer.status_code == 403
        answer = await client.post(cancel, data={"csrf": csrf, "pad": "x" * 20_000})
        assert answer.status_code == 413
        assert (await server.engine.job_get("acme", job_id)).status is Status.PENDING
        answer = await client.post(cancel, data={"csrf": csrf})
        assert answer.status_code == 303
    assert (await server.engine.job_get("acme", job_id)).status is Status.CANCELLED


async def test_a_tenant_sees_only_its_own_jobs(server: RunningServer) -> None:
    (job_id,) = await enqueue(server.engine, 1, queue="secret-q")
    async with signed_in(server, "globex-secret") as client:
        assert (await client.get(f"/dashboard/jobs/{job_id}")).status_code == 404
        assert job_id not in (await client.get("/dashboard/jobs")).text
        assert "secret-q" not in (await client.get("/dashboard/")).text
        answer = await client.post(f"/dashboard/jobs/{job_id}/cancel", data={"csrf": await page_csrf(client)})
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
    assert events == [
        "enqueued", "attempt 1 claimed by a worker", "attempt 1 failed: boom", "attempt 2 claimed by a worker",
        "attempt 2 failed: boom; no attempt left (dead letter)",
    ]  # fmt: skip


@needs_chromium
async def test_a_jobs_page_shows_each_attempt_and_how_it_ended(server: RunningServer) -> None:
    (job_id,) = await enqueue(server.engine, 1, max_attempts=5)
    (lease,) = await server.engine.lease("q", worker_id="w1")
    await server.engine.snooze([SnoozeItem(job_id, lease.lease_token, 0)])
    (lease,) = await server.engine.lease("q", worker_id="w2")
    await server.engine.fail([FailItem(job_id, lease.lease_token, "bad <input>", False)])

    def scenario(page: Any, width: int) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        page.goto(f"{server.url}/dashboard/jobs/{job_id}")
        steps = page.locator("ol.timeline li")
        expect(steps).to_have_count(5)
        expect(steps.nth(1)).to_contain_text("attempt 1 claimed by w1")
        expect(steps.nth(2)).to_contain_text("attempt 1 snoozed")
        expect(steps.nth(3)).to_contain_text("attempt 2 claimed by w2")
        expect(steps.nth(4)).to_contain_text("attempt 2 failed: bad <input>; failed permanently")
        # the page fits the window: nothing wider than it
        assert page.evaluate("document.documentElement.scrollWidth") <= width

    for viewport in (DESKTOP, PHONE):
        await in_browser(scenario, viewport["width"], viewport=viewport)


async def test_the_timeline_says_failed_permanently_when_attempts_were_left(server: RunningServer) -> None:
    server.clock.freeze()
    (job_id,) = await enqueue(server.engine, 1, max_attempts=5)
    (lease,) = await server.engine.lease("q", worker_id="w1")
    server.clock.advance(2)
    await server.engine.fail([FailItem(job_id, lease.lease_token, "bad input", False)])
    job = await server.engine.job_get("acme", job_id)
    (attempt,) = job.attempts
    assert attempt.claimed_at is not None and attempt.ended_at is not None
    assert (attempt.ended_at - attempt.claimed_at).total_seconds() == pytest.approx(2, abs=1e-6)
    assert timeline(job)[1:] == [
        (attempt.claimed_at, "attempt 1 claimed by w1"),
        (attempt.ended_at, "attempt 1 failed: bad input; failed permanently"),
    ]


async def test_the_workflow_and_workers_pages_show_steps_and_who_holds_jobs(server: RunningServer) -> None:
    body = WorkflowCreateRequest.model_validate(
        {"name": "wf", "steps": [{"name": "a", "kind": "k"}, {"name": "b", "kind": "k", "depends_on": ["a"]}]}
    )
    workflow = await server.engine.workflow_create("acme", body)
    (lease,) = await server.engine.lease("default", worker_id="worker-7")
    added = StepsAddRequest.model_validate({"lease_token": lease.lease_token, "steps": [{"name": "c", "kind": "k"}]})
    await server.engine.steps_add(lease.job.id, added)
    async with signed_in(server) as client:
        page = (await client.get(f"/dashboard/workflows/{workflow.id}")).text
        workers = (await client.get("/dashboard/workers")).text
        listing = (await client.get("/dashboard/workflows")).text
    steps = re.findall(
        r"<tr>\s*<td>(\w+)</td>\s*<td class=.kind.>k</td>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>\s*<td><span[^>]*>(\w+)</span>",
        page,
    )
    assert steps == [("a", "–", "–", "running"), ("b", "a", "–", "waiting"), ("c", "–", "a", "waiting")]
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


async def test_a_bulk_action_shows_its_count_and_changes_nothing_until_confirmed(server: RunningServer) -> None:
    await dead_letters(server.engine, 1, queue="other")
    in_q = await enqueue(server.engine, 3)
    elsewhere = await enqueue(server.engine, 2, queue="other")

    async def pending() -> int:
        jobs = [await server.engine.job_get("acme", job_id) for job_id in in_q + elsewhere]
        return sum(job.status is Status.PENDING for job in jobs)

    async with signed_in(server) as client:
        # The jobs page only links to the confirmation: no form there acts.
        assert 'action="/dashboard/jobs/bulk"' not in (await client.get("/dashboard/jobs")).text
        confirm = await client.get("/dashboard/jobs/bulk?action=cancel")
        csrf = form_csrf(confirm.text)
        assert confirm.status_code == 200
        assert re.search(r'<span id="count">5</span>', confirm.text)
        assert 'name="every_queue"' in confirm.text and "every queue" in confirm.text
        assert await pending() == 5

        # Every queue needs the explicit choice.
        answer = await client.post("/dashboard/jobs/bulk", data={"csrf": csrf, "action": "cancel"})
        assert answer.status_code == 422 and "every_queue" in answer.text
        assert await pending() == 5
        # Without the session's CSRF token, nothing either.
        form = {"action": "cancel", "every_queue": "yes"}
        assert (await client.post("/dashboard/jobs/bulk", data=form)).status_code == 403
        assert await pending() == 5

        confirm = await client.get("/dashboard/jobs/bulk?action=cancel&queue=q")
        assert '<span id="count">3</span>' in confirm.text and 'name="every_queue"' not in confirm.text
        answer = await client.post("/dashboard/jobs/bulk", data={"csrf": csrf, "action": "cancel", "queue": "q"})
        assert answer.status_code == 303 and "done=cancel&count=3" in answer.headers["Location"]
        assert await pending() == 2

        # The counts are per queue and status: a kind filter is an upper bound.
        confirm = await client.get("/dashboard/jobs/bulk?action=cancel&kind=k")
        assert re.search(r'Cancel up to <span id="count">2</span> jobs\?', confirm.text)
        # One dead letter and the three cancelled jobs.
        assert '<span id="count">4</span>' in (await client.get("/dashboard/jobs/bulk?action=retry")).text
        for query in ["action=drop", "action=retry&status=pending", "action=cancel&queue=a%20b"]:
            answer = await client.get(f"/dashboard/jobs/bulk?{query}")
            assert answer.status_code == 422 and "<h1>Invalid input</h1>" in answer.text, query

        answer = await client.post("/dashboard/jobs/bulk", data={"csrf": csrf, **form})
        assert answer.status_code == 303 and "count=2" in answer.headers["Location"]
    assert await pending() == 0


async def test_the_queues_page_sums_up_pending_running_failed_in_the_last_hour_and_oldest_ready(
    server: RunningServer,
) -> None:
    server.clock.freeze()  # ages are shown to the second
    await dead_letters(server.engine, 1, queue="d")
    server.clock.advance(2 * 3600)
    await enqueue(server.engine, 3)
    await server.engine.lease("q", worker_id="w1", lease_secs=600)
    server.clock.advance(125)
    await dead_letters(server.engine, 2, queue="d")
    expected = {
        "pending": "2", "scheduled": "0", "running": "1", "failed_last_hour": "2", "oldest_ready": "2m 05s ago",
        "held_back": "none",
    }  # fmt: skip
    async with signed_in(server) as client:
        page = (await client.get("/dashboard/")).text
        live = (await client.get("/dashboard/queues.json")).json()
    shown = dict(re.findall(r'data-summary="(\w+)">(?:<a[^>]*>)?([^<]*)<', page))
    assert shown == expected
    assert live["summary"] == expected
    # The two rates say which is which: the table's and the chart's.
    assert ">Completed/s, last minute</th>" in page
    assert "Completed jobs per second, all queues, between refreshes 2 seconds apart" in page
    # Past the page it counts among, "at least".
    assert await server.engine.jobs_failed_since("acme", server.engine.clock() - 3600, limit=2) == (2, True)


async def test_oldest_ready_leaves_paused_queues_out(server: RunningServer) -> None:
    server.clock.freeze()
    await enqueue(server.engine, 1, queue="held")
    server.clock.advance(600)
    await enqueue(server.engine, 1, queue="q")
    server.clock.advance(60)
    await server.engine.queue_pause("acme", "held")
    async with signed_in(server) as client:
        page = (await client.get("/dashboard/")).text
        live = (await client.get("/dashboard/queues.json")).json()
        await server.engine.queue_pause("acme", "q")
        everything_paused = (await client.get("/dashboard/queues.json")).json()
    assert 'data-summary="oldest_ready">1m 00s ago<' in page
    assert live["summary"]["oldest_ready"] == "1m 00s ago"
    # The paused queue's own row still says how long its job has waited.
    assert {row["queue"]: row["oldest_ready"] for row in live["queues"]} == {"held": "11m 00s ago", "q": "1m 00s ago"}
    assert everything_paused["summary"]["oldest_ready"] == "–"


async def test_the_overview_has_a_line_for_workers_schedules_and_held_back_jobs(server: RunningServer) -> None:
    server.clock.freeze()

    def line(page: str, name: str) -> str:
        found = re.search(rf'<li id="overview-{name}">(.*?)</li>', page, re.S)
        assert found, name
        return re.sub(r"<[^>]+>", "", found[1])

    async with signed_in(server) as client:
        empty = (await client.get("/dashboard/")).text
        await enqueue(server.engine, 3, queue="k", concurrency={"key": "one"})
        await server.engine.lease("k", worker_id="w-busy", lease_secs=600)
        await enqueue(server.engine, 1, queue="idle")
        (done,) = await server.engine.lease("idle", worker_id="w-idle")
        await server.engine.complete([CompleteItem(done.job.id, done.lease_token, None)])
        for name, paused in [("nightly", False), ("weekly", True)]:
            body = ScheduleRequest.model_validate({"cron": "0 * * * *", "job": {"kind": "k"}, "paused": paused})
            await server.engine.schedule_put("acme", name, body)
        page = (await client.get("/dashboard/")).text
        live = (await client.get("/dashboard/queues.json")).json()
    assert line(empty, "workers") == "Workers: no worker seen in the last 5 minutes"
    assert line(empty, "schedules") == "Schedules: none"
    assert line(empty, "held-back") == "Held back by flow control: none"
    assert line(page, "workers") == "Workers: 2 workers seen in the last 5 minutes, 1 of them running jobs"
    assert re.fullmatch(r"Schedules: 2 schedules, 1 paused; the next tick in \d+m \d\ds", line(page, "schedules"))
    held = "2 jobs by their concurrency key, 0 jobs by their rate limit"
    assert line(page, "held-back") == f"Held back by flow control: {held}"
    assert live["summary"]["held_back"] == held


async def test_favicon_answers_with_the_dashboards_icon(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        answer = await client.get("/favicon.ico")
        signin = (await client.get("/dashboard/signin")).text
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "image/x-icon"
    assert answer.content[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
    assert '<link rel="icon" href="/favicon.ico">' in signin


async def test_the_scheduled_page_lists_jobs_whose_time_has_not_come_next_first(server: RunningServer) -> None:
    server.clock.freeze()  # times are shown to the second
    await enqueue(server.engine, 1)  # ready now: not listed
    later, soon = await enqueue(server.engine, 1, delay_secs=300), await enqueue(server.engine, 1, delay_secs=100)
    other = await enqueue(server.engine, 1, queue="other", delay_secs=200)
    async with signed_in(server) as client:
        page = (await client.get("/dashboard/scheduled")).text
        summary = dict(re.findall(r'data-summary="(\w+)">(?:<a[^>]*>)?([^<]*)<', (await client.get("/dashboard/")).text))
        one_queue = (await client.get("/dashboard/scheduled?queue=other")).text
        bad = await client.get("/dashboard/scheduled?queue=no%20spaces")
    assert re.findall(r"/dashboard/jobs/([0-9a-f-]{36})\"", page) == [*soon, *other, *later]
    assert "in 1m 40s" in page
    assert summary["pending"] == "4" and summary["scheduled"] == "3"
    assert re.findall(r"/dashboard/jobs/([0-9a-f-]{36})\"", one_queue) == other
    assert bad.status_code == 422


async def test_error_pages_are_headed_in_words(server: RunningServer) -> None:
    async with signed_in(server) as client:
        for path, status, heading in [
            ("/dashboard/jobs/no-such-job", 404, "Page not found"),
            ("/dashboard/no/such/page", 404, "Page not found"),
            ("/dashboard/jobs?status=bogus", 422, "Invalid input"),
        ]:
            answer = await client.get(path)
            assert answer.status_code == status, path
            assert "text/html" in answer.headers["content-type"], path
            assert f"<h1>{heading}</h1>" in answer.text, path
            assert "not_found" not in answer.text and "invalid_input" not in answer.text, path
        csrf = form_csrf((await client.get("/dashboard/")).text)
        answer = await client.post("/dashboard/jobs/nope/cancel", data={"csrf": csrf})
        assert answer.status_code == 404 and "<h1>Page not found</h1>" in answer.text


async def test_big_payloads_results_and_errors_are_cut_with_a_link_to_the_whole_job(server: RunningServer) -> None:
    blob, answer_blob, error = "p" * 300_000, "r" * 300_000, "e" * 60_000
    (done,) = await enqueue(server.engine, 1, payload={"blob": blob})
    (lease,) = await server.engine.lease("q")
    await server.engine.complete([CompleteItem(done, lease.lease_token, {"blob": answer_blob})])
    (dead,) = await enqueue(server.engine, 1, max_attempts=1, payload={"blob": blob})
    (lease,) = await server.engine.lease("q")
    await server.engine.fail([FailItem(dead, lease.lease_token, error, False)])
    async with signed_in(server) as client:
        for job_id in (done, dead):
            page = await client.get(f"/dashboard/jobs/{job_id}")
            assert page.status_code == 200 and len(page.content) < 64_000, len(page.content)
            assert f'href="/dashboard/jobs/{job_id}/json"' in page.text and "more in" in page.text
        for path in ["/dashboard/jobs", "/dashboard/dead"]:
            assert len((await client.get(path)).content) < 32_000, path
        whole = (await client.get(f"/dashboard/jobs/{done}/json")).json()
        assert whole["payload"] == {"blob": blob} and whole["result"] == {"blob": answer_blob}
        assert (await client.get(f"/dashboard/jobs/{dead}/json")).json()["error"] == error
    body = WorkflowCreateRequest.model_validate(
        {"name": "wf", "context": {"blob": blob}, "steps": [{"name": "a", "kind": "k"}]}
    )
    workflow = await server.engine.workflow_create("acme", body)
    async with signed_in(server) as client:
        page = await client.get(f"/dashboard/workflows/{workflow.id}")
        assert len(page.content) < 64_000 and f'href="/dashboard/workflows/{workflow.id}/json"' in page.text
        whole = (await client.get(f"/dashboard/workflows/{workflow.id}/json")).json()
        assert whole["context"] == {"blob": blob}
    async with signed_in(server, "globex-secret") as client:
        assert (await client.get(f"/dashboard/jobs/{done}/json")).status_code == 404
        assert (await client.get(f"/dashboard/workflows/{workflow.id}/json")).status_code == 404


async def test_the_workers_page_shows_idle_workers_and_the_jobs_each_holds(server: RunningServer) -> None:
    (held,) = await enqueue(server.engine, 1, queue="busy-q")
    await enqueue(server.engine, 1, queue="idle-q", delay_secs=3600)
    await server.engine.lease("busy-q", worker_id="worker-busy", lease_secs=3600)
    assert await server.engine.lease("idle-q", worker_id="worker-idle") == []
    async with signed_in(server) as client:
        page = (await client.get("/dashboard/workers")).text
    rows = re.findall(r'<tr>\s*<td class="mono">([^<]+)</td>\s*<td>(.*?)</td>', page, re.S)
    assert [worker for worker, _ in rows] == ["worker-busy", "worker-idle"]
    assert f"/dashboard/jobs/{held}" in rows[0][1] and rows[1][1].strip() == "idle"
