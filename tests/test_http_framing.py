"""HTTP/1.1 framing over raw sockets: the malformed and ambiguous requests
of RFC 9112 and the request-smuggling literature, the server's limits and
time limits, ``100 Continue``, and faults in every phase of a connection.

Most tests run :func:`serve_asgi` with a tiny ASGI application that records
every request it is given, so that a test can assert both the answer RFC 9112
requires and that no request was read where a strict parser sees none. Time
limits run on Trio's clock (``autojump_clock``), so none waits for real.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from qftrio.server import http11
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import open_sqlite_store

from .test_http11 import RawConnection, RawResponse, assert_json_error, auth, connect, job_body, request, serve_app


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Store]:
    """SQLite only: nothing here depends on the store."""
    async with open_sqlite_store(tmp_path / "qftrio.db") as store:
        yield store


class Recorder:
    """An ASGI application that reads each request's body, records the
    request, and answers 200 with what it read; ``/boom`` raises."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/boom":
            raise RuntimeError("the application failed")
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message["body"]
            if not message["more_body"]:
                break
        self.seen.append((scope["method"], scope["path"], body))
        answer = json.dumps({"path": scope["path"], "body": body.decode("latin-1")}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})


@pytest.fixture
async def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def url(nursery: trio.Nursery, recorder: Recorder) -> str:
    return await serve_app(nursery, recorder, max_body_bytes=4096)


async def read_all(conn: RawConnection) -> list[RawResponse]:
    """Every response until the server closes the connection."""
    responses = []
    while True:
        while not conn.buffer:
            if not await conn._fill():
                return responses
        responses.append(await conn.read_response())


async def exchange(url: str, raw: bytes) -> list[RawResponse]:
    """Send *raw* and stop sending; every response to it."""
    with trio.fail_after(10):
        async with connect(url) as conn:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await conn.send(raw)
                await conn.stream.send_eof()
            return await read_all(conn)


async def trickle(conn: RawConnection, piece: bytes, every: float, times: int | None = None) -> list[RawResponse]:
    """Send *piece* every *every* seconds (*times* times, or until the server
    closes); every response until it closes."""

    async def send() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            sent = 0
            while times is None or sent < times:
                await conn.send(piece)
                sent += 1
                await trio.sleep(every)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        responses = await read_all(conn)
        nursery.cancel_scope.cancel()
    return responses


# -- the battery ----------------------------------------------------------------------

POST = "POST /first HTTP/1.1\r\nHost: qftrio.test\r\n"
SMUGGLED = "GET /smuggled HTTP/1.1\r\nHost: qftrio.test\r\n\r\n"
TE = "Transfer-Encoding: chunked\r\n"
LONG_HEAD = "".join(f"X-Filler-{i}: {'a' * 1000}\r\n" for i in range(70))

# (request bytes, the statuses answered in turn, the paths the application is given)
BATTERY = [
    # RFC 9112 §6.1: Content-Length with Transfer-Encoding may be a smuggling attempt
    pytest.param(POST + "Content-Length: 5\r\n" + TE + "\r\n0\r\n\r\n" + SMUGGLED, [400], [], id="cl-te"),
    pytest.param(POST + TE + "Content-Length: 40\r\n\r\n0\r\n\r\n" + SMUGGLED, [400], [], id="te-cl"),
    # §6.3: a length that is not one valid number
    pytest.param(POST + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", [400], [], id="cl-duplicate"),
    pytest.param(POST + "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}" + SMUGGLED, [400], [], id="cl-conflicting"),
    pytest.param(POST + "Content-Length: 2, 2\r\n\r\n{}", [400], [], id="cl-list"),
    pytest.param(POST + "Content-Length: +2\r\n\r\n{}", [400], [], id="cl-signed"),
    pytest.param(POST + "Content-Length: 99999999999999999999\r\n\r\n", [400], [], id="cl-overflow"),
    # §5.2: obs-fold in a request is refused
    pytest.param("GET /first HTTP/1.1\r\nHost: qftrio.test\r\nX-A: 1\r\n b\r\n\r\n", [400], [], id="obs-fold"),
    pytest.param("GET /first HTTP/1.1\r\n Host: qftrio.test\r\n\r\n", [400], [], id="space-before-first-field"),
    # §5.1: no whitespace between a field name and its colon
    pytest.param("GET /first HTTP/1.1\r\nHost : qftrio.test\r\n\r\n", [400], [], id="space-before-colon"),
    # §2.2: a bare CR is invalid, and only CRLF ends a line
    pytest.param("GET /first HTTP/1.1\r\nHost: qftrio.test\rX: 1\r\n\r\n", [400], [], id="bare-cr-in-field"),
    pytest.param("GET /first HTTP/1.1\r\nHost: qftrio.test\nX: 1\r\n\r\n", [400], [], id="bare-lf-after-field"),
    pytest.param("GET /first HTTP/1.1\nHost: qftrio.test\n\n", [400], [], id="bare-lf-head"),
    pytest.param("GET /first HTTP/1.1\r\nHost: qftrio.test\r\nX: a\x00b\r\n\r\n", [400], [], id="nul-in-field"),
    # §7.1: chunk-size is hex digits only, then extensions, then CRLF
    pytest.param(POST + TE + "\r\n 2\r\n{}\r\n0\r\n\r\n", [400], [], id="chunk-size-leading-space"),
    pytest.param(POST + TE + "\r\n2 \r\n{}\r\n0\r\n\r\n", [400], [], id="chunk-size-trailing-space"),
    pytest.param(POST + TE + "\r\n0x2\r\n{}\r\n0\r\n\r\n", [400], [], id="chunk-size-0x"),
    pytest.param(POST + TE + "\r\nFFFFFFFFFFFFFFFFFF\r\n", [400], [], id="chunk-size-overflow"),
    pytest.param(POST + TE + "\r\n2\n{}\r\n0\r\n\r\n", [400], [], id="chunk-size-bare-lf"),
    # a front end that ends the line at LF reads the rest as a second request
    pytest.param(POST + TE + "\r\n2;\nxx\r\n{}\r\n0\r\n\r\n" + SMUGGLED, [400], [], id="chunk-ext-bare-lf"),
    pytest.param(POST + TE + "\r\n2;a\rb\r\n{}\r\n0\r\n\r\n", [400], [], id="chunk-ext-bare-cr"),
    pytest.param(POST + TE + "\r\n2\r\n{}XX0\r\n\r\n", [400], [], id="chunk-data-without-crlf"),
    # §7.1.2: the trailer section holds fields only
    pytest.param(POST + TE + "\r\n0\r\n" + SMUGGLED, [400], [], id="request-in-trailers"),
    pytest.param(POST + TE + "\r\n0\r\nX: a\r\n b\r\n\r\n", [400], [], id="trailer-obs-fold"),
    pytest.param(POST + TE + "\r\n0\r\nContent-Length: 5\r\n\r\n", [400], [], id="trailer-content-length"),
    # §6.3: chunked must be the final coding, once
    pytest.param(POST + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", [400], [], id="te-chunked-twice"),
    pytest.param(POST + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", [400], [], id="te-xchunked"),
    pytest.param(POST + "Transfer-Encoding: chunked, gzip\r\n\r\n", [400], [], id="te-chunked-not-last"),
    pytest.param(POST + TE + TE + "\r\n0\r\n\r\n", [400], [], id="te-two-fields"),
    # §6.1: a coding the server does not know (501); Transfer-Encoding in HTTP/1.0 is faulty framing
    pytest.param(POST + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", [501], [], id="te-unknown-coding"),
    pytest.param("POST /first HTTP/1.0\r\n" + TE + "\r\n0\r\n\r\n" + SMUGGLED, [400], [], id="te-in-http-1.0"),
    # §3.2: exactly one Host in HTTP/1.1
    pytest.param("GET /first HTTP/1.1\r\n\r\n", [400], [], id="no-host"),
    pytest.param("GET /first HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", [400], [], id="two-hosts"),
    pytest.param("GET /first\r\n\r\n", [505], [], id="http-0.9"),
    pytest.param("GET /first HTTP/2.0\r\nHost: qftrio.test\r\n\r\n", [505], [], id="http-2.0"),
    pytest.param("GET /fi rst HTTP/1.1\r\nHost: qftrio.test\r\n\r\n", [400], [], id="space-in-target"),
    pytest.param("GET first HTTP/1.1\r\nHost: qftrio.test\r\n\r\n", [400], [], id="relative-target"),
    pytest.param("GET /first HTTP/1.1\r\nHost: qftrio.test\r\n" + LONG_HEAD + "\r\n", [431], [], id="head-over-64k"),
    pytest.param(
        "GET /first HTTP/1.1\r\nHost: qftrio.test\r\n" + "X: 1\r\n" * 101 + "\r\n", [431], [], id="over-100-fields"
    ),
    pytest.param(POST + "Expect: teapot\r\nContent-Length: 2\r\n\r\n{}", [417], [], id="expect-unknown"),
    # no protocol switch: the bytes after an upgrade request are not HTTP
    pytest.param(
        POST + "Connection: upgrade\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\n{}", [400], [], id="upgrade-with-body"
    ),
    pytest.param(
        "GET /first HTTP/1.1\r\nHost: qftrio.test\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n" + SMUGGLED,
        [200],
        ["/first"],
        id="upgrade-then-bytes",
    ),
    # requests before a malformed one are answered, then the malformed one
    pytest.param(
        "GET /first HTTP/1.1\r\nHost: qftrio.test\r\n\r\nGARBAGE\r\n\r\n",
        [200, 400],
        ["/first"],
        id="pipelined-garbage",
    ),
    # data after "Connection: close" is not a request
    pytest.param(
        "GET /first HTTP/1.1\r\nHost: qftrio.test\r\nConnection: close\r\n\r\n" + SMUGGLED,
        [200],
        ["/first"],
        id="after-connection-close",
    ),
    # pipelining after a chunked body with trailers (§7.1.2)
    pytest.param(
        POST + TE + "\r\n2\r\n{}\r\n0\r\nX-Check: 1\r\n\r\n" + SMUGGLED.replace("smuggled", "second"),
        [200, 200],
        ["/first", "/second"],
        id="pipelined-after-chunked",
    ),
    # HTTP/1.0 keep-alive, pipelined, then a plain HTTP/1.0 request that closes
    pytest.param(
        "GET /first HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /second HTTP/1.0\r\n\r\n" + SMUGGLED,
        [200, 200],
        ["/first", "/second"],
        id="http-1.0-keep-alive",
    ),
    # leading empty lines are allowed (§2.2), a chunk extension is ignored (§7.1.1)
    pytest.param(
        "\r\n\r\n" + POST + TE + '\r\n2;a="b c"\r\n{}\r\n0\r\n\r\n', [200], ["/first"], id="empty-lines-and-chunk-ext"
    ),
]


@pytest.mark.parametrize(("raw", "statuses", "paths"), BATTERY)
async def test_the_answer_rfc_9112_requires(
    url: str, recorder: Recorder, raw: str, statuses: list[int], paths: list[str]
) -> None:
    responses = await exchange(url, raw.encode("latin-1"))
    assert [r.status for r in responses] == statuses, [(r.status, r.body) for r in responses]
    assert [path for _, path, _ in recorder.seen] == paths
    for response in responses:
        if response.status >= 400:
            assert_json_error(response, response.status)
    if statuses[-1] >= 400:
        assert responses[-1].says_close


async def test_a_chunked_body_and_its_trailers_reach_the_application_as_the_body(url: str, recorder: Recorder) -> None:
    raw = POST + TE + '\r\n3;ext="x"\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 1\r\nX-Empty:\r\n\r\n'
    responses = await exchange(url, raw.encode())
    assert [r.status for r in responses] == [200]
    assert responses[0].json()["body"] == "abcde"


# -- the body cap counts trailers ------------------------------------------------------


async def test_trailers_count_toward_the_body_cap(url: str, recorder: Recorder) -> None:
    trailers = "".join(f"X-T{i}: {'t' * 90}\r\n" for i in range(50))  # 4.7 KB over a 4096-byte cap
    responses = await exchange(url, (POST + TE + "\r\n2\r\n{}\r\n0\r\n" + trailers + "\r\n").encode())
    assert [r.status for r in responses] == [413]
    assert_json_error(responses[0], 413)
    assert recorder.seen == []


async def test_the_api_refuses_a_trailer_flood(server) -> None:
    head = request("POST", "/api/v1/jobs", headers=[*auth(server), ("Transfer-Encoding", "chunked")])
    body = job_body({"x": 1})
    trailer = b"X-Flood: " + b"f" * 8000 + b"\r\n"
    with trio.fail_after(30):
        async with connect(server.url) as conn:
            await conn.send(head + b"%X\r\n%s\r\n0\r\n" % (len(body), body))
            try:
                for _ in range(200):  # 1.6 MB, past the 1 MiB body cap
                    await conn.send(trailer)
                await conn.send(b"\r\n")
            except trio.BrokenResourceError:
                pass  # refused and closed
            response = await conn.read_response()
    # the trailer section's own limit comes first
    assert_json_error(response, 431)
    assert response.says_close


async def test_the_configured_body_cap_counts_trailers(storage: Store, nursery: trio.Nursery) -> None:
    from qftrio.server.engine import Engine
    from qftrio.server.serve import run_server

    from .conftest import server_config

    stop = trio.Event()
    nursery.start_soon(stop.wait)
    config = server_config(max_body_bytes=4096)
    (api,) = await nursery.start(functools.partial(run_server, Engine(storage), config, shutdown_trigger=stop.wait))
    body = job_body({"x": 1})
    trailers = b"".join(b"X-T%d: %s\r\n" % (i, b"t" * 90) for i in range(50))  # 4.7 KB
    headers = [("Authorization", "Bearer acme-secret"), ("Transfer-Encoding", "chunked")]
    head = request("POST", "/api/v1/jobs", headers=headers)
    responses = await exchange(api, head + b"%X\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailers))
    assert [r.status for r in responses] == [413]
    assert_json_error(responses[0], 413)


# -- time limits -------------------------------------------------------------------------


async def test_the_head_timeout_counts_leading_empty_lines(url: str, autojump_clock) -> None:
    with trio.fail_after(100):
        async with connect(url) as conn:
            began = trio.current_time()
            responses = await trickle(conn, b"\r\n", 5)  # an empty line every 5 s, never a request
    assert [r.status for r in responses] == [408]
    assert_json_error(responses[0], 408)
    assert trio.current_time() - began <= http11.HEAD_TIMEOUT_SECS + 5


async def test_a_bare_lf_head_is_refused_at_once(url: str, autojump_clock) -> None:
    with trio.fail_after(100):
        async with connect(url) as conn:
            began = trio.current_time()
            await conn.send(b"GET /first HTTP/1.1\nHost: qftrio.test\n\n")
            response = await conn.read_response()
    assert_json_error(response, 400)
    assert trio.current_time() - began < 1


async def test_a_body_below_the_minimum_rate_gets_408_one_above_it_is_served(
    nursery, recorder: Recorder, autojump_clock
) -> None:
    url = await serve_app(nursery, recorder)
    rate, window = http11.BODY_MIN_RATE, http11.BODY_WINDOW_SECS
    size = int(2 * rate * window)  # two windows' worth
    with trio.fail_after(500):
        async with connect(url) as slow:
            await slow.send((POST + f"Content-Length: {size}\r\n\r\n").encode())
            began = trio.current_time()
            trickled = await trickle(slow, b"x" * (rate // 2), 1)  # half the rate
            waited = trio.current_time() - began
        async with connect(url) as steady:
            await steady.send((POST + f"Content-Length: {size}\r\nConnection: close\r\n\r\n").encode())
            served = await trickle(steady, b"x" * (rate * 5 // 4), 1, times=size * 4 // (rate * 5))
    assert [r.status for r in trickled] == [408]
    assert_json_error(trickled[0], 408)
    assert waited <= window + 2
    assert [r.status for r in served] == [200]
    assert [(path, len(body)) for _, path, body in recorder.seen] == [("/first", size)]


async def test_a_head_trickled_across_its_deadline_leaves_the_server_serving(nursery, mock_clock) -> None:
    # While the head trickles in, Trio's clock runs a thousand times faster
    # than real time, so bytes a virtual millisecond apart keep arriving as
    # the 30 s deadline passes. Connecting happens with the clock stopped, so
    # a busy machine cannot make a connect look late; the trickle is bounded
    # by its bytes (ten times the deadline's worth), not by a timer.
    url = await serve_app(nursery, Recorder())
    async with connect(url) as conn:
        await conn.send(b"GET / HTTP/1.1\r\nX: ")
        mock_clock.rate = 1000
        responses = await trickle(conn, b"a", 0.001, times=300_000)
        mock_clock.rate = 0
    after = await exchange(url, b"GET /after HTTP/1.1\r\nHost: h\r\n\r\n")
    assert [r.status for r in responses] == [408]
    assert [r.status for r in after] == [200]


# -- 100 Continue ------------------------------------------------------------------------


async def test_100_continue_is_never_sent_after_the_answer_began(nursery) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await receive()  # the body, read only after the answer began
            await send({"type": "http.response.body", "body": b"{}"})

    url = await serve_app(nursery, app)
    head = POST + "Expect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    with trio.fail_after(10):
        async with connect(url) as conn:
            await conn.send(head.encode())
            await trio.testing.wait_all_tasks_blocked()
            await conn.send(b"{}")
            first = await conn.read_response()
    assert first.status == 200


@pytest.mark.parametrize("attempt", range(12))
async def test_100_continue_and_an_early_answer_do_not_interleave(server, caplog, attempt: int) -> None:
    # Quart reads the body in a task of its own while the route answers 401
    # before needing it: the 100 and the answer race for the socket.
    head = request("POST", "/api/v1/workflows", headers=[("Expect", "100-continue"), ("Content-Length", "2")])
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(head)
            response = await conn.read_response()
            if response.status == 100:
                await conn.send(b"{}")
                response = await conn.read_response()
    assert_json_error(response, 401)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# -- faults in every phase of a connection -----------------------------------------------


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a fault in the server")


async def _aboom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a fault in the server")


PHASES = [
    pytest.param("_Connection.on_headers_complete", _boom, b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n", id="head"),
    pytest.param("_Exchange._fill", _aboom, (POST + "Content-Length: 2\r\n\r\n").encode(), id="body"),
    pytest.param(None, None, b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n", id="application"),
    pytest.param("_Exchange._head", _boom, b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n", id="answer"),
    pytest.param("_Connection.linger_close", _aboom, b"GARBAGE\r\n\r\n", id="linger"),
]


@pytest.mark.parametrize(("target", "fault", "raw"), PHASES)
async def test_a_fault_in_any_phase_ends_only_its_connection(
    nursery, monkeypatch, caplog, target: str | None, fault: Any, raw: bytes
) -> None:
    url = await serve_app(nursery, Recorder())
    if target is not None:
        cls, name = target.split(".")
        monkeypatch.setattr(getattr(http11, cls), name, fault)
    with trio.fail_after(10):
        async with connect(url) as conn:
            await conn.send(raw)
            await read_all(conn)  # whatever it gets, the connection ends
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    monkeypatch.undo()
    responses = await exchange(url, b"GET /after HTTP/1.1\r\nHost: h\r\n\r\n")
    assert [r.status for r in responses] == [200]
