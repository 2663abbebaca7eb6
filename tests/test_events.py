"""The live event stream (DESIGN §3, "Waiting and watching"):
``GET /api/v1/events`` over real HTTP on every backend, and across two
servers on one PostgreSQL database. On the real clock: the stores' threads
and sockets make Trio's autojump clock fire the clients' timeouts; every
wait here ends by the work (an event read, a stream counted), never a
guess."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx
import pytest
import trio

from qftrio.server.engine import Engine
from qftrio.server.store.base import Store

from .conftest import RunningServer, serve_store
from .test_job_wait import two_servers  # noqa: F401 (a fixture)
from .test_protocol import enqueue, lease, report


class Events:
    """The events of one open stream, parsed as a browser's EventSource
    does: ``(event, data)``, comments apart."""

    def __init__(self, response: httpx.Response, lines: AsyncIterator[str]) -> None:
        self.response = response
        self.lines = lines
        self.comments = 0

    async def next(self) -> tuple[str, Any]:
        event, data = "message", []
        async for line in self.lines:
            if not line:
                if data:
                    return event, json.loads("\n".join(data))
                continue
            if line.startswith(":"):
                self.comments += 1
            field, _, value = line.partition(": ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        raise EOFError

    async def job(self, **want: Any) -> dict[str, Any]:
        """The next ``job`` event, which must have *want*'s fields."""
        event, data = await self.next()
        assert event == "job", (event, data)
        assert {key: data[key] for key in want} == want, data
        return data


@asynccontextmanager
async def events(http: httpx.AsyncClient, server: RunningServer, who: str = "acme", **query: Any) -> AsyncIterator[Events]:
    async with http.stream("GET", "/api/v1/events", params=query, headers=server.headers(who)) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"] == "text/event-stream"
        lines = r.aiter_lines()
        try:
            yield Events(r, lines)
        finally:
            # Closed first, so that reading on ends httpx's generators,
            # which would each warn when collected if left suspended.
            await r.aclose()
            with suppress(httpx.HTTPError, httpx.StreamError):
                async for _ in lines:
                    pass


async def open_streams(engine: Engine, n: int) -> None:
    """Until *n* streams are open on *engine*: its state, not a time."""
    while len(engine.events) != n:
        await trio.sleep(0.001)


async def test_a_stream_sees_every_change_of_a_job(http, server) -> None:
    async with events(http, server) as stream:
        job = await enqueue(http, server, queue="q", kind="k")
        await stream.job(id=job["id"], queue="q", kind="k", status="pending", attempt=0, progress=None)
        (leased,) = await lease(http, server, queue="q", lease_secs=300)
        await stream.job(id=job["id"], status="running", attempt=1)
        r = await http.post(
            f"/api/v1/jobs/{job['id']}/progress", json={"lease_token": leased["lease_token"], "progress": {"done": 3}},
            headers=server.headers("worker"),
        )
        assert r.status_code in (200, 204), r.text
        await stream.job(id=job["id"], status="running", progress={"done": 3})
        await report(http, server, job["id"], "fail", lease_token=leased["lease_token"], error="boom")
        retry = await stream.job(id=job["id"], status="pending", attempt=1)
        assert isinstance(retry["at"], float)
        cancelled = await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
        assert cancelled.status_code == 200
        await stream.job(id=job["id"], status="cancelled")
