"""A worker pointed at something that is not qftrio: over real HTTP, a plain
web server's lasting answers stop it at once, with the status, and its
passing ones (a proxy's 502/503/504) are ridden out."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from qftrio import errors
from qftrio.client import Client
from qftrio.worker import Registry, Worker, WorkerEvent
from qftrio.worker.transport import HttpTransport

from .test_http_client import ScriptedServer

PAGE = b"<html><body><h1>%s</h1></body></html>"


def html(status: bytes) -> bytes:
    body = PAGE % status
    return b"HTTP/1.1 %s\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body)


def registry() -> Registry:
    reg = Registry()

    @reg.handler("echo")
    async def echo(job: Any) -> dict[str, Any]:
        return {}

    return reg


@pytest.mark.parametrize("status", [b"501 Not Implemented", b"405 Method Not Allowed", b"404 Not Found"])
async def test_a_web_server_that_is_not_qftrio_stops_the_worker(nursery: trio.Nursery, status: bytes) -> None:
    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        await stream.send_all(html(status))
        return True

    server: ScriptedServer = await nursery.start(ScriptedServer(reply).run)
    events: list[WorkerEvent] = []
    async with Client(server.url, "token") as client:
        worker = Worker(HttpTransport(client), "q", registry(), on_event=events.append, wait_secs=0)
        with trio.fail_after(30), pytest.raises(errors.ApiError) as raised:
            await worker.run()
    assert raised.value.status_code == int(status.split()[0])
    assert "not qftrio's" in raised.value.message
    assert len(server.requests) == 1 and not [e for e in events if e.type == "waiting"]


async def test_a_proxy_s_passing_errors_are_ridden_out(nursery: trio.Nursery) -> None:
    passing = [b"502 Bad Gateway", b"503 Service Unavailable", b"504 Gateway Timeout"]
    leased = trio.Event()

    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        if passing:
            await stream.send_all(html(passing.pop(0)))
            return True
        answer = json.dumps({"jobs": []}).encode()
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer))
        leased.set()
        return True

    server: ScriptedServer = await nursery.start(ScriptedServer(reply).run)
    events: list[WorkerEvent] = []
    async with Client(server.url, "token") as client, trio.open_nursery() as inner:
        worker = Worker(HttpTransport(client), "q", registry(), on_event=events.append, wait_secs=0)
        await inner.start(worker.run)
        with trio.fail_after(30):  # three backoffs: about 0.25-0.5, 0.5-1 and 1-2 s
            await leased.wait()
        worker.stop()
    assert [e.type for e in events if e.type == "waiting"] == ["waiting"] * 3
