"""Driving Debian's chromium with Playwright from Trio tests.

Playwright's sync API runs in a worker thread (it brings its own event
loop); a scenario calls back into the test's Trio loop with
``trio.from_thread.run`` to act on the server between page steps.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
import trio

CHROMIUM = os.environ.get("QFTRIO_TEST_CHROMIUM", "/usr/bin/chromium")

# Skipped without chromium, except under CI (scripts/test installs it).
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and os.environ.get("CI") != "true",
    reason=f"no chromium at {CHROMIUM}: apt-get install -y chromium (or set QFTRIO_TEST_CHROMIUM)",
)

#: How long one page step may wait for the page (a live refresh is 2 s).
STEP_MS = 8_000


#: A phone's viewport (an iPhone 12 to 15 is 390 CSS pixels wide).
PHONE = {"width": 390, "height": 844}
#: A desktop's.
DESKTOP = {"width": 1280, "height": 800}


async def in_browser(
    scenario: Callable[..., None], *args: Any, javascript: bool = True, viewport: dict[str, int] = DESKTOP
) -> None:
    """Run ``scenario(page, *args)`` in a fresh chromium, in a thread,
    with JavaScript on or off, in a window of *viewport*'s size."""

    def run() -> None:
        from playwright.sync_api import expect, sync_playwright

        expect.set_options(timeout=STEP_MS)
        # Once trio-asyncio is imported (the PostgreSQL store), a new event
        # loop is one of its loops; Playwright needs asyncio's own. The
        # policy set here holds for this thread only under trio-asyncio.
        asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM)
                try:
                    page = browser.new_page(java_script_enabled=javascript, viewport=viewport)
                    page.set_default_timeout(STEP_MS)
                    scenario(page, *args)
                finally:
                    browser.close()
        finally:
            asyncio.set_event_loop_policy(None)

    # Playwright's own step timeouts bound the thread; this bounds the test.
    with trio.fail_after(60):
        await trio.to_thread.run_sync(run)


def sign_in(page: Any, url: str, token: str) -> None:
    """Sign in through the form, from the page a visitor first sees."""
    from playwright.sync_api import expect

    page.goto(f"{url}/dashboard/")
    expect(page).to_have_url(re.compile(r"/dashboard/signin"))
    page.fill("#token", token)
    page.click("form.signin button")
    expect(page.locator("header .tenant")).to_be_visible()
