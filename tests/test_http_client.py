"""The client's own HTTP/1.1 connection pool (``qftrio._http``) against
scripted servers on real sockets: connection reuse, answers framed every way
HTTP/1.1 allows, servers that close, stall or answer nonsense, timeouts,
cancellation, the connection limit, and the switch to httpx when the
environment names a proxy."""

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
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

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


async def test_a_token_with_a_line_break_is_never_sent(nursery: trio.Nursery) -> None:
    server = await start(nursery, echo)
    async with Client(server.url, "t\r\nX-Injected: 1") as client:
        with pytest.raises(errors.TransportError):
            await client.health()
    assert all(b"X-Injected" not in head for head in server.requests)
