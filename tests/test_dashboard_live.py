"""The dashboard's pages update from the event stream (docs/watching.md) in
a real browser (chromium through Playwright): a job completing turns its row
and its page, and the queues' counts, without a reload."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio.models import CompleteItem
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import open_sqlite_store

from .browser import PHONE, in_browser, needs_chromium, sign_in
from .conftest import RunningServer
from .test_dashboard import ACME, complete_all, enqueue, signed_in


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Store]:
    """The embedded store: the stream's own tests cover both backends."""
    async with open_sqlite_store(tmp_path / "qftrio.db") as store:
        yield store


async def streams(server: RunningServer, n: int) -> None:
    """Until *n* streams are open on the server, each registered and heard:
    the page's, not a time."""
    while len(server.engine.events) != n or server.engine.events.live != n:
        await trio.sleep(0.01)


@needs_chromium
async def test_a_job_completing_turns_its_row_its_page_and_the_counts_without_a_reload(server: RunningServer) -> None:
    (job_id,) = await enqueue(server.engine, 1)
    (other,) = await enqueue(server.engine, 1, queue="r")

    def scenario(page: Any) -> None:
        from playwright.sync_api import expect

        sign_in(page, server.url, ACME)
        trio.from_thread.run(streams, server, 1)  # the overview follows the stream
        page.goto(f"{server.url}/dashboard/jobs?queue=q")
        row = page.locator(f'tr[data-job="{job_id}"]')
        expect(row.locator(".status")).to_have_text("pending")
        trio.from_thread.run(streams, server, 1)
        (lease,) = trio.from_thread.run(lambda: server.engine.lease("q", max_jobs=1, worker_id="w1"))
        expect(row.locator(".status")).to_have_text("running")

        page.goto(f"{server.url}/dashboard/jobs/{other}")
        heading = page.locator("h1 .status")
        expect(heading).to_have_text("pending")
        trio.from_thread.run(streams, server, 1)
        trio.from_thread.run(complete_all, server.engine, "r")
        expect(heading).to_have_text("completed")
        expect(heading).to_have_class("status s-completed")

        page.set_viewport_size(PHONE)
        page.goto(f"{server.url}/dashboard/queues/q")
        trio.from_thread.run(streams, server, 1)
        cells = page.locator('tr[data-queue="q"]')
        expect(cells.locator('[data-field="running"]')).to_have_text("1")
        trio.from_thread.run(lambda: server.engine.complete([CompleteItem(job_id, lease.lease_token, {"ok": True})]))
        expect(cells.locator('[data-field="completed"]')).to_have_text("1")
        expect(cells.locator('[data-field="running"]')).to_have_text("0")

    await in_browser(scenario)
    await streams(server, 0)


@pytest.mark.parametrize("path", ["/dashboard/events?queue=no%20queue", "/dashboard/events?job="])
async def test_the_pages_stream_refuses_a_bad_filter(server: RunningServer, path: str) -> None:
    async with signed_in(server) as client:
        r = await client.get(path)
        assert r.status_code == 422, r.text
    assert len(server.engine.events) == 0


async def test_the_pages_stream_needs_a_session(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        r = await client.get("/dashboard/events")
        assert r.status_code == 303 and "/dashboard/signin" in r.headers["location"]
