"""The HTTP/1.1 server over raw sockets: keep-alive, pipelining, request
bodies (Content-Length, chunked, 100-continue, slow), malformed requests,
connection closing, HEAD, the Date and Content-Length headers, and graceful
shutdown.

These tests check HTTP behaviour only, so they run on the SQLite store alone
(the ``storage`` fixture below overrides the one in conftest).
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import functools
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from qftrio.server.http11 import serve_asgi
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import open_sqlite_store

from .conftest import RunningServer, server_config


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Store]:
    """SQLite only: nothing here depends on the store."""
    async with open_sqlite_store(tmp_path / "qftrio.db") as store:
        yield store


# -- a raw HTTP/1.1 client -------------------------------------------------------


@dataclasses.dataclass
class RawResponse:
    version: str
    status: int
    reason: str
    headers: list[tuple[str, str]]  # names lower-cased, in the order received
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name.lower()]
        return ", ".join(values) if values else None

    def header_count(self, name: str) -> int:
        return sum(1 for k, _ in self.headers if k == name.lower())

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def says_close(self) -> bool:
        tokens = (self.header("connection") or "").lower().split(",")
        return "close" in (t.strip() for t in tokens)


class RawConnection:
    """One TCP connection: write bytes as given, read responses back."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> bool:
        """Reads more bytes into the buffer; False once the peer has closed
        (a reset counts as closed)."""
        try:
            chunk = await self.stream.receive_some()
        except trio.BrokenResourceError:
            return False
        if not chunk:
            return False
        self.buffer += chunk
        return True

    async def _read_until(self, marker: bytes) -> bytes:
        while (at := self.buffer.find(marker)) < 0:
            if not await self._fill():
                raise AssertionError(f"connection closed before {marker!r}; buffered: {bytes(self.buffer)!r}")
        data = bytes(self.buffer[:at])
        del self.buffer[: at + len(marker)]
        return data

    async def _read_exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not await self._fill():
                raise AssertionError(f"connection closed {n - len(self.buffer)} bytes short of a {n}-byte body")
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    async def read_response(self, *, head: bool = False) -> RawResponse:
        """The next response; *head* says it answers a HEAD (no body)."""
        block = await self._read_until(b"\r\n\r\n")
        status_line, *lines = block.decode("latin-1").split("\r\n")
        version, status, *reason = status_line.split(" ", 2)
        assert version.startswith("HTTP/1."), f"not a status line: {status_line!r}"
        headers = []
        for line in lines:
            name, sep, value = line.partition(":")
            assert sep and name == name.strip(), f"bad response header line {line!r}"
            headers.append((name.lower(), value.strip()))
        response = RawResponse(version, int(status), reason[0] if reason else "", headers, b"")
        if head or 100 <= response.status < 200 or response.status in (204, 304):
            return response
        if (response.header("transfer-encoding") or "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int((await self._read_until(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while await self._read_until(b"\r\n"):  # trailers, up to the empty line
                        pass
                    break
                body += await self._read_exactly(size)
                assert await self._read_exactly(2) == b"\r\n"
            response.body = bytes(body)
        elif (length := response.header("content-length")) is not None:
            # a repeated header with one value is tolerated here (RFC 9110 §8.6);
            # test_responses_carry_date_and_content_length asserts there is one
            (single,) = {v.strip() for v in length.split(",")}
            response.body = await self._read_exactly(int(single))
        else:  # delimited by the close
            while await self._fill():
                pass
            response.body = bytes(self.buffer)
            self.buffer.clear()
        return response

    async def expect_closed(self, within: float = 2.0) -> None:
        """Asserts the server closes the connection within *within* seconds
        without sending anything more."""
        closed = False
        with trio.move_on_after(within):
            while await self._fill():
                pass
            closed = True
        assert not self.buffer, f"unexpected bytes from the server: {bytes(self.buffer)!r}"
        assert closed, f"the server did not close the connection within {within}s"

    async def expect_silence(self, secs: float) -> None:
        """Asserts nothing arrives (and the connection stays open) for *secs*."""
        with trio.move_on_after(secs):
            more = await self._fill()
            raise AssertionError(
                f"unexpected bytes: {bytes(self.buffer)!r}" if more else "the server closed the connection"
            )


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[RawConnection]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        yield RawConnection(stream)


def request(
    method: str,
    path: str,
    *,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
    version: str = "HTTP/1.1",
    host: bool = True,
) -> bytes:
    """A request's bytes; a body gets a Content-Length unless *headers* frame it."""
    lines = [f"{method} {path} {version}"]
    if host:
        lines.append("Host: qftrio.test")
    lines += [f"{name}: {value}" for name, value in headers]
    framed = any(name.lower() in ("content-length", "transfer-encoding") for name, _ in headers)
    if body is not None and not framed:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def auth(server: RunningServer, who: str = "acme") -> list[tuple[str, str]]:
    return list(server.headers(who).items())


def job_body(payload: dict[str, Any]) -> bytes:
    return json.dumps({"kind": "resize", "payload": payload, "config": {"queue": "q"}}).encode()


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%X\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def assert_json_error(response: RawResponse, status: int) -> None:
    assert response.status == status, (response.status, response.body)
    assert (response.header("content-type") or "").startswith("application/json"), response.headers
    assert isinstance(response.json()["error"]["code"], str), response.body
    assert isinstance(response.json()["error"]["message"], str), response.body


# -- keep-alive and pipelining ---------------------------------------------------


async def test_keep_alive_answers_requests_in_turn(server) -> None:
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(request("GET", "/healthz"))
            first = await conn.read_response()
            await conn.send(request("GET", "/no/such/path"))
            second = await conn.read_response()
            await conn.send(request("GET", "/healthz"))
            third = await conn.read_response()
    assert (first.status, second.status, third.status) == (200, 404, 200)
    assert first.json() == {"status": "ok"} and not first.says_close
    assert_json_error(second, 404)
    assert not second.says_close


async def test_pipelined_requests_are_answered_in_order(server) -> None:
    pipeline = (
        request("POST", "/api/v1/jobs", headers=auth(server), body=job_body({"i": 0}))
        + request("GET", "/no/such/path")
        + request("POST", "/api/v1/jobs", headers=auth(server), body=job_body({"i": 1}))
        + request("GET", "/healthz")
    )
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(pipeline)
            answers = [await conn.read_response() for _ in range(4)]
            await conn.expect_silence(0.2)
    assert [a.status for a in answers] == [201, 404, 201, 200]
    assert answers[0].json()["payload"] == {"i": 0}
    assert answers[2].json()["payload"] == {"i": 1}
    assert answers[3].json() == {"status": "ok"}


# -- request bodies ----------------------------------------------------------------


async def test_chunked_request_body(server) -> None:
    payload = {"text": "h\u00e9llo w\u00f6rld", "n": [1, 2, 3]}
    raw = job_body(payload)
    parts = [raw[:7], raw[7:20], raw[20:]]
    head = request("POST", "/api/v1/jobs", headers=[*auth(server), ("Transfer-Encoding", "chunked")])
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(head + b"%X\r\n%s\r\n" % (len(parts[0]), parts[0]))
            await trio.sleep(0.05)
            # a chunk extension, which a recipient must ignore (RFC 9112 §7.1.1)
            await conn.send(b"%X;note=x\r\n%s\r\n" % (len(parts[1]), parts[1]))
            await trio.sleep(0.05)
            await conn.send(chunked(parts[2]))
            created = await conn.read_response()
            assert created.status == 201, created.body
            job_id = created.json()["id"]
            await conn.send(request("GET", f"/api/v1/jobs/{job_id}", headers=auth(server)))
            fetched = await conn.read_response()
    assert created.json()["payload"] == payload
    assert fetched.status == 200 and fetched.json()["payload"] == payload


async def test_expect_100_continue(server) -> None:
    body = job_body({"expect": True})
    head = request(
        "POST",
        "/api/v1/jobs",
        headers=[*auth(server), ("Content-Length", str(len(body))), ("Expect", "100-continue")],
    )
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(head)
            with trio.fail_after(2):
                interim = await conn.read_response()
            assert interim.status == 100, (interim.status, interim.headers)
            assert not conn.buffer, "bytes after the 100 Continue before the body was sent"
            await conn.send(body)
            final = await conn.read_response()
    assert final.status == 201, final.body
    assert final.json()["payload"] == {"expect": True}


async def test_slow_body_is_answered(server) -> None:
    body = job_body({"slow": "x" * 100})
    head = request("POST", "/api/v1/jobs", headers=[*auth(server), ("Content-Length", str(len(body)))])
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(head)
            await trio.sleep(0.2)
            await conn.send(body[:30])
            await trio.sleep(0.2)
            await conn.send(body[30:])
            created = await conn.read_response()
            await conn.send(request("GET", "/healthz"))
            health = await conn.read_response()
    assert created.status == 201, created.body
    assert created.json()["payload"] == {"slow": "x" * 100}
    assert health.status == 200


# -- malformed requests ----------------------------------------------------------------

_JOBS = "POST /api/v1/jobs HTTP/1.1\r\nHost: qftrio.test\r\nAuthorization: Bearer acme-secret\r\n"
_BIG_HEADERS = "".join(f"X-Filler-{i}: {'a' * 1000}\r\n" for i in range(70))  # about 70 KiB

MALFORMED = [
    pytest.param(b"GARBAGE\r\n\r\n", 400, id="garbage-request-line"),
    # "0\r\n\r\n" is five bytes, so both framings consume the same bytes
    pytest.param(
        (_JOBS + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode(),
        400,
        id="content-length-and-chunked",
    ),
    pytest.param((_JOBS + "Content-Length: abc\r\n\r\n").encode(), 400, id="content-length-abc"),
    pytest.param(
        (_JOBS + "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}").encode(),
        400,
        id="two-content-lengths",
    ),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: qftrio.test\r\nNoColonHere\r\n\r\n", 400, id="header-without-colon"),
    pytest.param(b"GET /healthz HTTP/1.1\r\n\r\n", 400, id="no-host"),
    pytest.param(b"GET /healthz HTTP/2.0\r\nHost: qftrio.test\r\n\r\n", 505, id="http-2.0"),
    pytest.param(
        f"GET /healthz HTTP/1.1\r\nHost: qftrio.test\r\n{_BIG_HEADERS}\r\n".encode(),
        431,
        id="header-block-over-64k",
    ),
    # RFC 9112 §6.3: chunked not the final coding, the length is unknown
    pytest.param((_JOBS + "Transfer-Encoding: gzip\r\n\r\n").encode(), 400, id="transfer-encoding-gzip"),
    # a coding the server does not understand, then chunked (RFC 9112 §6.1)
    pytest.param(
        (_JOBS + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n").encode(), 501, id="transfer-encoding-gzip-chunked"
    ),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: qftrio.test\r\nX-A: 1\r\n  folded\r\n\r\n", 400, id="obs-fold"),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost : qftrio.test\r\n\r\n", 400, id="space-before-colon"),
    pytest.param((_JOBS + "Transfer-Encoding: chunked\r\n\r\nzz\r\n").encode(), 400, id="chunk-size-not-hex"),
    pytest.param((_JOBS + "Transfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n").encode(), 400, id="chunk-size-0x"),
    pytest.param((_JOBS + "Transfer-Encoding: chunked\r\n\r\n+2\r\n{}\r\n0\r\n\r\n").encode(), 400, id="chunk-size-signed"),
    pytest.param((_JOBS + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n").encode(), 400, id="chunk-without-crlf"),
]


@pytest.mark.parametrize(("raw", "status"), MALFORMED)
async def test_malformed_request_is_refused_and_the_connection_closed(server, raw: bytes, status: int) -> None:
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            try:
                await conn.send(raw)
            except trio.BrokenResourceError:
                pass  # the server may answer and close before reading it all
            response = await conn.read_response()
            await conn.expect_closed()
    assert_json_error(response, status)
    assert response.header("date") is not None
    assert response.header("content-length") == str(len(response.body))


# -- closing the connection -----------------------------------------------------------


async def test_http_1_0_request_is_answered_then_closed(server) -> None:
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(request("GET", "/healthz", version="HTTP/1.0", host=False))
            response = await conn.read_response()
            await conn.expect_closed()
    assert response.status == 200 and response.json() == {"status": "ok"}
    assert response.header("transfer-encoding") is None  # HTTP/1.0 has no chunked


async def test_http_1_0_keep_alive_is_answered_in_kind(server) -> None:
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            for _ in range(2):
                await conn.send(
                    request("GET", "/healthz", version="HTTP/1.0", host=False, headers=[("Connection", "keep-alive")])
                )
                response = await conn.read_response()
                assert response.status == 200 and response.json() == {"status": "ok"}
                assert (response.header("connection") or "").lower() == "keep-alive"


async def test_connection_close_is_honoured(server) -> None:
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(request("GET", "/healthz", headers=[("Connection", "close")]))
            response = await conn.read_response()
            await conn.expect_closed()
    assert response.status == 200 and response.json() == {"status": "ok"}
    assert response.says_close, response.headers


# -- HEAD, Date, Content-Length --------------------------------------------------------


async def test_head_has_headers_and_no_body(server) -> None:
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(request("HEAD", "/healthz"))
            head = await conn.read_response(head=True)
            assert not conn.buffer, f"body bytes after a HEAD response: {bytes(conn.buffer)!r}"
            await conn.expect_silence(0.3)
            await conn.send(request("GET", "/healthz"))
            # read_response starts at the first byte after HEAD's header block
            get = await conn.read_response()
    assert head.status == 200
    assert head.header("date") is not None
    assert (head.header("content-type") or "").startswith("application/json")
    if head.header("content-length") is not None:
        assert head.header("content-length") == str(len(get.body))
    assert get.status == 200 and get.json() == {"status": "ok"}


async def test_responses_carry_date_and_content_length(server) -> None:
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            answers = []
            for raw in [
                request("GET", "/healthz"),
                request("GET", "/no/such/path"),
                request("POST", "/api/v1/jobs", headers=auth(server), body=job_body({})),
                request("POST", "/api/v1/jobs", headers=auth(server), body=b"{not json"),
                request("GET", "/api/v1/jobs/nope", headers=auth(server)),
                request("GET", "/api/v1/jobs/nope"),  # unauthenticated
                request("POST", "/api/v1/queues/q/lease", headers=auth(server, "worker"), body=b'{"max_jobs": 1}'),
            ]:
                await conn.send(raw)
                answers.append(await conn.read_response())
    assert [a.status for a in answers][:3] == [200, 404, 201]
    assert all(a.status >= 400 for a in answers[3:6]), [a.status for a in answers]
    assert answers[6].status == 200
    for answer in answers:
        assert answer.header_count("date") == 1, answer.headers
        assert email.utils.parsedate_to_datetime(answer.header("date")) is not None
        assert (answer.header("content-type") or "").startswith("application/json"), answer.headers
        assert answer.header("transfer-encoding") is None, answer.headers
        assert answer.header_count("content-length") == 1, answer.headers
        assert answer.header("content-length") == str(len(answer.body))
        answer.json()


# -- graceful shutdown -------------------------------------------------------------------


async def test_shutdown_closes_idle_connections_and_finishes_in_flight_requests(storage, nursery) -> None:
    from qftrio.server.engine import Engine
    from qftrio.server.serve import run_server

    stop = trio.Event()
    engine = Engine(storage)
    (url,) = await nursery.start(
        lambda task_status: run_server(engine, server_config(), shutdown_trigger=stop.wait, task_status=task_status)
    )
    body = job_body({"late": True})
    head = request(
        "POST",
        "/api/v1/jobs",
        headers=[("Authorization", "Bearer acme-secret"), ("Content-Length", str(len(body)))],
    )
    with trio.fail_after(10):
        async with connect(url) as idle, connect(url) as busy:
            await idle.send(request("GET", "/healthz"))
            assert (await idle.read_response()).status == 200
            await busy.send(head)
            await trio.sleep(0.2)  # the server has the headers, not the body
            stop.set()
            await idle.expect_closed(within=1.0)
            await busy.send(body)
            response = await busy.read_response()
            await busy.expect_closed()
    assert response.status == 201, response.body
    assert response.json()["payload"] == {"late": True}
    assert response.says_close, response.headers


@pytest.mark.parametrize(
    "path, body",
    [
        ("/api/v1/queues/q/lease", b'{"max_jobs": 1, "wait_secs": 5}'),  # the protocol front
        ("/api/v1/workflows", None),  # Quart, its body cut short
    ],
)
async def test_a_client_that_leaves_mid_request_is_not_an_error(server, caplog, path: str, body: bytes | None) -> None:
    headers = [("Authorization", f"Bearer {server.worker_token}")]
    raw = request("POST", path, headers=headers, body=body or b"{}")
    if body is None:
        raw = raw[:-1]  # the body's last byte never comes
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(raw)
            await trio.sleep(0.2)
        await trio.sleep(0.3)  # the server sees the end of the stream
    assert [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/workflows"])  # the protocol front, Quart
async def test_an_oversized_body_gets_its_413_before_the_connection_closes(server, path: str) -> None:
    # The server answers from the declared length without reading the body;
    # a client that sends the whole body before reading still gets the answer.
    size = 2_000_000  # twice the default cap
    head = request("POST", path, headers=[*auth(server), ("Content-Length", str(size))])
    with trio.fail_after(10):
        async with connect(server.url) as conn:
            await conn.send(head)
            for _ in range(size // 100_000):
                await conn.send(b"x" * 100_000)
            response = await conn.read_response()
            await conn.expect_closed()
    assert_json_error(response, 413)
    assert response.says_close


async def ok_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def serve_app(nursery: trio.Nursery, app: Any, **options: Any) -> str:
    """Serve the ASGI *app* until the test ends; its URL."""
    stop = trio.Event()
    nursery.start_soon(stop.wait)
    serve = functools.partial(serve_asgi, shutdown_trigger=stop.wait, graceful_timeout_secs=1, **options)
    (url,) = await nursery.start(serve, app, "127.0.0.1", 0)
    return url


async def test_at_the_connection_limit_an_idle_connection_makes_room(nursery, autojump_clock) -> None:
    url = await serve_app(nursery, ok_app, max_connections=2)
    with trio.fail_after(10):
        async with connect(url) as first, connect(url) as second:
            for conn in (first, second):
                await conn.send(request("GET", "/"))
                assert (await conn.read_response()).status == 200
            async with connect(url) as third:
                await third.send(request("GET", "/"))
                assert (await third.read_response()).status == 200
                await first.expect_closed()  # the longest idle one
                await second.send(request("GET", "/"))
                assert (await second.read_response()).status == 200


async def test_at_the_connection_limit_with_none_idle_a_new_client_gets_a_quick_503(nursery, autojump_clock) -> None:
    url = await serve_app(nursery, ok_app, max_connections=2)
    with trio.fail_after(10):
        async with connect(url) as first, connect(url) as second:
            for conn in (first, second):  # both in the middle of a request head
                await conn.send(b"GET / HTTP/1.1\r\n")
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(6):  # health probes
                async with connect(url) as probe:
                    with trio.fail_after(1):
                        refused = await probe.read_response()
                    await probe.expect_closed()
                assert_json_error(refused, 503)
                assert refused.says_close
            await first.send(b"Host: qftrio.test\r\n\r\n")
            assert (await first.read_response()).status == 200
