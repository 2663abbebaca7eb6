"""The client's transports (``qftrio._http``) against scripted servers on
real sockets: connection reuse, answers framed every way HTTP/1.1 allows,
servers that close, stall, answer nonsense or flood, ambiguous framing,
size caps, timeouts, cancellation, the connection limit, headers that
cannot be sent, path parameters, and the switch to httpx when the
environment names a proxy. Hostile servers are tried through both
transports, the Trio pool and httpx."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.server
import json
import shutil
import ssl
import subprocess
import threading
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio import errors
from qftrio._http import HttpError, HttpPool
from qftrio.client import Client

Reply = Callable[[trio.SocketStream, bytes, bytes], Awaitable[bool]]


class ScriptedServer:
    """Reads requests (head and Content-Length body) and lets *reply*
    answer each one; *reply* returns False to close the connection."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests: list[bytes] = []  # the request heads, as received
        self.url = ""

    async def run(self, *, task_status: trio.TaskStatus[ScriptedServer] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        buffer = b""
        try:
            while True:
                while (end := buffer.find(b"\r\n\r\n")) < 0:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer[:end], buffer[end + 4 :]
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                body, buffer = buffer[:length], buffer[length:]
                self.requests.append(head)
                if not await self.reply(stream, head, body):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.open -= 1
            await stream.aclose()


def answer(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status.encode(),
        len(body),
        extra,
        body,
    )


async def echo(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
    target = head.split(b"\r\n")[0].split(b" ")[1]
    await stream.send_all(answer(json.dumps({"target": target.decode(), "body": body.decode()}).encode()))
    return True


async def start(nursery: trio.Nursery, reply: Reply) -> ScriptedServer:
    return await nursery.start(ScriptedServer(reply).run)


@pytest.fixture
async def pools() -> AsyncIterator[Callable[..., HttpPool]]:
    """Makes pools, and closes them after the test."""
    made: list[HttpPool] = []

    def make(*args: Any, **kwargs: Any) -> HttpPool:
        made.append(HttpPool(*args, **kwargs))
        return made[-1]

    yield make
    for pool in made:
        await pool.aclose()


async def test_calls_share_one_kept_alive_connection(pools: Callable[..., HttpPool], nursery: trio.Nursery) -> None:
    server = await start(nursery, echo)
    pool = pools(server.url + "/base/", {"Authorization": "Bearer t"})
    for i in range(5):
        got = await pool.request("POST", f"/x/{i}?a=1", b'{"n":%d}' % i, timeout=5)
        assert got.status_code == 200
        assert json.loads(got.content) == {"target": f"/base/x/{i}?a=1", "body": '{"n":%d}' % i}
    assert server.connections == 1
    head = server.requests[0].decode()
    assert f"Host: {server.url.removeprefix('http://')}" in head
    assert "Authorization: Bearer t" in head and "Content-Type: application/json" in head


async def test_a_connection_the_server_closed_is_not_reused(pools: Callable[..., HttpPool], nursery: trio.Nursery) -> None:
    async def once(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        await stream.send_all(answer(b"{}"))
        return False  # closes without saying so

    server = await start(nursery, once)
    pool = pools(server.url, {})
    for _ in range(3):
        assert (await pool.request("GET", "/", None, timeout=5)).status_code == 200
        await trio.testing.wait_all_tasks_blocked()  # the server's close has landed
    assert server.connections == 3


async def test_connection_close_and_http_1_0_answers_end_the_connection(pools: Callable[..., HttpPool], nursery: trio.Nursery) -> None:
    answers = [
        answer(b"{}", extra=b"connection: close\r\n"),
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}",
        answer(b"{}"),
        answer(b"{}"),
    ]

    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        await stream.send_all(answers.pop(0))
        return True  # the client must close on its own

    server = await start(nursery, reply)
    pool = pools(server.url, {})
    for _ in range(4):
        assert (await pool.request("GET", "/", None, timeout=5)).content == b"{}"
    assert server.connections == 3


async def test_chunked_and_close_delimited_answers(pools: Callable[..., HttpPool], nursery: trio.Nursery) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"4;ext=1\r\n{\"a\"\r\n3\r\n: 1\r\nA\r\n, \"b\": 22}\r\n0\r\nx-trailer: y\r\n\r\n",
        answer(b'{"next": true}'),
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + b'{"to": "the end"}',
    ]

    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        await stream.send_all(answers.pop(0))
        return bool(answers)

    server = await start(nursery, reply)
    pool = pools(server.url, {})
    assert json.loads((await pool.request("GET", "/", None, timeout=5)).content) == {"a": 1, "b": 22}
    assert json.loads((await pool.request("GET", "/", None, timeout=5)).content) == {"next": True}
    assert json.loads((await pool.request("GET", "/", None, timeout=5)).content) == {"to": "the end"}
    assert server.connections == 1


async def test_interim_answers_are_skipped(pools: Callable[..., HttpPool], nursery: trio.Nursery) -> None:
    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"{}", "201 Created"))
        return True

    server = await start(nursery, reply)
    got = await pools(server.url, {}).request("POST", "/", b"{}", timeout=5)
    assert (got.status_code, got.content) == (201, b"{}")


@pytest.mark.parametrize(
    "garbage",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1_0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
    ],
)
async def test_a_malformed_or_cut_answer_is_a_transport_error(nursery: trio.Nursery, garbage: bytes) -> None:
    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        await stream.send_all(garbage)
        return False

    server = await start(nursery, reply)
    async with Client(server.url, "t") as client:
        with pytest.raises(errors.TransportError, match=r"^GET http://127\.0\.0\.1:\d+/healthz: "):
            await client.health()


async def test_a_server_that_stalls_times_out_and_the_connection_is_dropped(pools: Callable[..., HttpPool], 
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    calls = 0

    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab")
            await trio.sleep_forever()
        await stream.send_all(answer(b"{}"))
        return True

    server = await start(nursery, reply)
    pool = pools(server.url, {})
    started = trio.current_time()
    with pytest.raises(HttpError, match="timed out"):
        await pool.request("GET", "/", None, timeout=3)
    assert trio.current_time() - started == pytest.approx(3)
    assert (await pool.request("GET", "/", None, timeout=3)).content == b"{}"
    assert server.connections == 2


async def test_a_cancelled_call_leaves_no_connection_behind(pools: Callable[..., HttpPool], 
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    slow = True

    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        if slow:
            await trio.sleep(10)
        await stream.send_all(answer(b"{}"))
        return True

    server = await start(nursery, reply)
    pool = pools(server.url, {})
    with trio.move_on_after(1):
        await pool.request("GET", "/", None, timeout=30)
    slow = False
    assert (await pool.request("GET", "/", None, timeout=30)).content == b"{}"
    assert server.connections == 2  # the first answer, late, did not land on the second call


async def test_calls_beyond_the_limit_wait_for_a_connection(pools: Callable[..., HttpPool], 
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        await trio.sleep(1)
        await stream.send_all(answer(b"{}"))
        return True

    server = await start(nursery, reply)
    pool = pools(server.url, {}, max_connections=2)
    started = trio.current_time()
    async with trio.open_nursery() as calls:
        for _ in range(6):
            calls.start_soon(functools.partial(pool.request, "GET", "/", None, timeout=10))
    assert server.most_open == server.connections == 2
    assert trio.current_time() - started == pytest.approx(3)


async def test_a_closed_port_is_a_transport_error() -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    async with Client(f"http://127.0.0.1:{port}", "t") as client:
        with pytest.raises(errors.TransportError, match="cannot connect"):
            await client.health()


async def test_paths_are_quoted_and_error_answers_mapped(nursery: trio.Nursery) -> None:
    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        target = head.split(b"\r\n")[0].split(b" ")[1].decode()
        error = {"error": {"code": "not_found", "message": target}}
        await stream.send_all(answer(json.dumps(error).encode(), "404 Not Found"))
        return True

    server = await start(nursery, reply)
    async with Client(server.url, "t") as client:
        with pytest.raises(errors.NotFound, match=r"^.*/api/v1/jobs/a%20b%3Fc/cancel$"):
            await client.job_cancel("a b?c")
        with pytest.raises(errors.NotFound, match=r"/api/v1/jobs\?queue=q&status=running&limit=5$"):
            await client.jobs_list(queue="q", status="running", limit=5)


async def test_a_proxy_from_the_environment_is_used(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    # The proxy is a scripted server too: it sees the absolute URL httpx sends to proxies.
    proxy = await start(nursery, echo)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with Client("http://qftrio.invalid:8000", "t") as client:
        assert await client.health() == {"target": "http://qftrio.invalid:8000/healthz", "body": ""}
    monkeypatch.setenv("NO_PROXY", "qftrio.invalid")
    async with Client("http://qftrio.invalid:8000", "t") as client:
        with pytest.raises(errors.TransportError, match="cannot connect"):
            await client.health()


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_https(nursery: trio.Nursery, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    scripted = ScriptedServer(echo)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"https://127.0.0.1:{listeners[0].socket.getsockname()[1]}"

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with contextlib.suppress(trio.BrokenResourceError):
            await scripted._handle(stream)  # type: ignore[arg-type]

    nursery.start_soon(
        trio.serve_listeners, handle, [trio.SSLListener(listener, server_context) for listener in listeners]
    )
    # The certificate is trusted the way httpx is told to (SSL_CERT_FILE), and
    # checked: a client that does not trust it gets a clear transport error.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    async with Client(url, "t") as client:
        for _ in range(3):
            assert await client.health() == {"target": "/healthz", "body": ""}
    assert scripted.connections == 1
    monkeypatch.delenv("SSL_CERT_FILE")
    async with Client(url, "t") as client:
        with pytest.raises(errors.TransportError, match="TLS handshake failed"):
            await client.health()


def test_under_asyncio_calls_go_through_httpx() -> None:
    """An asyncio application (a web app enqueuing jobs, say) can use the
    same client: off Trio it sends through httpx."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            if self.path == "/healthz":
                answer, status = b'{"status": "ok"}', 200
            else:
                answer, status = b'{"error": {"code": "not_found", "message": "no such job"}}', 404
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    async def main() -> None:
        async with Client(f"http://127.0.0.1:{server.server_address[1]}", "t") as client:
            assert await client.health() == {"status": "ok"}
            with pytest.raises(errors.NotFound, match="no such job"):
                await client.job_get("j1")

    try:
        asyncio.run(main())
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert seen == ["/healthz", "/api/v1/jobs/j1"]


# -- hostile servers, through both transports ------------------------------------


@pytest.fixture(params=["pool", "httpx"])
def client_for(request: pytest.FixtureRequest) -> Callable[..., Client]:
    """Makes a client whose calls go through the Trio pool, or through httpx
    (a caller-supplied httpx transport)."""

    def make(url: str, **kwargs: Any) -> Client:
        if request.param == "httpx":
            kwargs["transport"] = httpx.AsyncHTTPTransport()
        return Client(url, "t", **kwargs)

    return make


def script(*answers: bytes) -> tuple[Reply, list[bool]]:
    """A reply sending *answers* in turn (the last one again once they run
    out), keeping the connection open; and a list of whether each send went
    through in full."""
    finished: list[bool] = []

    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        data = answers[min(len(finished), len(answers) - 1)]
        finished.append(False)
        index = len(finished) - 1
        await stream.send_all(data)
        finished[index] = True
        return True

    return reply, finished


GOOD = answer(b'{"ok": true}')


@pytest.mark.parametrize(
    "ambiguous",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\n Content-Length: 2\r\n\r\n{}", id="folded-first-line"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX: a\r\n Content-Length: 2\r\n\r\n{}", id="obs-fold"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\n{}", id="space-before-colon"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", id="xchunked"),
        pytest.param(b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\n{}", id="status-2000"),
        pytest.param(b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\n{}", id="status-600"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            id="length-and-chunked",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\n{}\r\n0\r\n\r\n", id="chunk-size-space"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;\nx\r\n{}\r\n0\r\n\r\n", id="lf-in-extension"
        ),
        pytest.param(b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}", id="bare-lf-head"),
        pytest.param(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", id="upgrade"
        ),
    ],
)
async def test_an_ambiguous_answer_is_a_transport_error_and_its_connection_dropped(
    nursery: trio.Nursery, ambiguous: bytes
) -> None:
    # The Trio pool's parser, llhttp, reads these strictly; httpx's, h11,
    # reads several of them leniently, which is httpx's to decide.
    reply, _ = script(ambiguous, GOOD)
    server = await start(nursery, reply)
    async with Client(server.url, "t", timeout=5) as client:
        with pytest.raises(errors.TransportError, match=r"^GET http://127\.0\.0\.1:\d+/healthz: ") as info:
            await client.health()
        assert "timed out" not in str(info.value)
        assert await client.health() == {"ok": True}
    assert server.connections == 2  # the connection the ambiguous answer came on was not reused


FLOOD = 32 * 1024 * 1024


@pytest.mark.parametrize(
    "prefix, line, suffix, what",
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n",
            b"x-flood: " + b"a" * 1013 + b"\r\n",
            b"\r\n",
            "chunk framing or trailers",
            id="trailers",
        ),
        pytest.param(b"", b"HTTP/1.1 100 Continue\r\n\r\n", GOOD, "head", id="interim-answers"),
    ],
)
async def test_a_flood_without_body_ends_the_call_at_once(
    nursery: trio.Nursery, prefix: bytes, line: bytes, suffix: bytes, what: str
) -> None:
    flood = prefix + line * (FLOOD // len(line)) + suffix
    reply, finished = script(flood)
    server = await start(nursery, reply)
    async with Client(server.url, "t", timeout=30) as client:
        with pytest.raises(errors.TransportError, match=f"the answer's {what} exceed 65536 bytes"):
            await client.health()
    await trio.testing.wait_all_tasks_blocked()
    assert finished == [False]  # cut off long before the server could send it all


@pytest.mark.parametrize(
    "head, piece",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\n\r\n", b"a" * 65536, id="to-the-close"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            b"10000\r\n" + b"a" * 65536 + b"\r\n",
            id="chunked",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (FLOOD * 2), b"a" * 65536, id="length"),
    ],
)
async def test_a_body_over_the_cap_ends_the_call_at_once(
    nursery: trio.Nursery, client_for: Callable[..., Client], head: bytes, piece: bytes
) -> None:
    reply, finished = script(head + piece * (FLOOD // len(piece)))
    server = await start(nursery, reply)
    async with client_for(server.url, timeout=30, max_body_size=1024 * 1024) as client:
        with pytest.raises(errors.TransportError, match="body is larger than 1048576 bytes"):
            await client.health()
    await trio.testing.wait_all_tasks_blocked()
    assert finished == [False]


async def test_a_body_is_held_once(pools: Callable[..., HttpPool], nursery: trio.Nursery) -> None:
    size = 8 * 1024 * 1024
    reply, _ = script(answer(b"a" * size))
    server = await start(nursery, reply)
    pool = pools(server.url, {})
    assert (await pool.request("GET", "/", None, timeout=30)).status_code == 200  # the connection is up
    tracemalloc.start()
    try:
        got = await pool.request("GET", "/", None, timeout=30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got.content) == size
    assert peak < 1.5 * size


async def test_the_timeout_bounds_the_whole_call(
    nursery: trio.Nursery, client_for: Callable[..., Client], autojump_clock: trio.testing.MockClock
) -> None:
    async def trickle(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        for byte in GOOD:
            await stream.send_all(bytes([byte]))
            await trio.sleep(1)
        return True

    server = await start(nursery, trickle)
    async with client_for(server.url, timeout=3) as client:
        started = trio.current_time()
        with pytest.raises(errors.TransportError, match="timed out"):
            await client.health()
        assert trio.current_time() - started == pytest.approx(3)


@pytest.mark.parametrize("token", ["s3cret\r\nX-Injected: 1", "s3cret\n", "s3cret\x00", "s3crét", "s3cret "])
@pytest.mark.parametrize("transport", [None, "httpx"])
def test_a_token_that_cannot_be_sent_is_a_config_error_at_construction(token: str, transport: str | None) -> None:
    kwargs: dict[str, Any] = {"transport": httpx.AsyncHTTPTransport()} if transport else {}
    with pytest.raises(errors.ConfigError, match="the token cannot be sent") as info:
        Client("http://127.0.0.1:8000", token, **kwargs)
    assert "s3cr" not in str(info.value)  # a credential is never shown


CALLS: list[tuple[str, Callable[[Client, str], Awaitable[Any]], str]] = [
    ("GET", lambda c, v: c.job_get(v), "/api/v1/jobs/{}"),
    ("POST", lambda c, v: c.job_cancel(v), "/api/v1/jobs/{}/cancel"),
    ("POST", lambda c, v: c.job_retry(v), "/api/v1/jobs/{}/retry"),
    ("POST", lambda c, v: c.heartbeat(v, "t", 10), "/api/v1/jobs/{}/heartbeat"),
    ("POST", lambda c, v: c.complete(v, "t"), "/api/v1/jobs/{}/complete"),
    ("POST", lambda c, v: c.fail(v, "t", "boom"), "/api/v1/jobs/{}/fail"),
    ("POST", lambda c, v: c.lease(v), "/api/v1/queues/{}/lease"),
    ("GET", lambda c, v: c.queue_stats(v), "/api/v1/queues/{}/stats"),
    ("GET", lambda c, v: c.workflow_get(v), "/api/v1/workflows/{}"),
    ("POST", lambda c, v: c.workflow_cancel(v), "/api/v1/workflows/{}/cancel"),
]


async def test_every_path_parameter_is_percent_encoded(nursery: trio.Nursery, client_for: Callable[..., Client]) -> None:
    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        request_line = head.split(b"\r\n")[0].decode()
        error = {"error": {"code": "not_found", "message": request_line}}
        await stream.send_all(answer(json.dumps(error).encode(), "404 Not Found"))
        return True

    server = await start(nursery, reply)
    hostile = {"../../queues": "..%2F..%2Fqueues", "..": "%2E%2E", "a b?c#d%2F": "a%20b%3Fc%23d%252F"}
    async with client_for(server.url) as client:
        for method, call, path in CALLS:
            for value, encoded in hostile.items():
                with pytest.raises(errors.NotFound) as info:
                    await call(client, value)
                assert info.value.message == f"{method} {path.format(encoded)} HTTP/1.1"
