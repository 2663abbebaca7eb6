"""An HTTP/1.1 server for ASGI applications, on Trio.

It serves qftrio's API: keep-alive, pipelining, ``Content-Length`` and
chunked request bodies, ``Expect: 100-continue``, HEAD, chunked or
length-delimited responses, the ASGI lifespan protocol, and a graceful
shutdown. It does not speak HTTP/2, TLS or WebSocket: put a proxy in front
for those.

Each connection is one task, and each request's application call runs in
it (no task per request). A body the application did not read (a request
refused on its headers) is read after the answer, so the connection carries
the client's next request. While the application waits after the request
body, ``receive()`` watches the socket, so a client that goes away is seen
as ``http.disconnect`` (a long poll relies on that); bytes of a pipelined
next request read meanwhile are kept for it.

Malformed requests get a JSON error (400, 408, 417, 431, 501 or 505) and
the connection is closed, after lingering (``LINGER_SECS``) if the client may
still be sending, so that it can read the answer. Limits: a request head of
at most ``MAX_HEAD_BYTES`` and ``MAX_HEADERS`` lines; ``HEAD_TIMEOUT_SECS``
to send a head once begun, ``BODY_TIMEOUT_SECS`` without progress in a body,
``WRITE_TIMEOUT_SECS`` for a client to take an answer; idle connections
close after ``KEEP_ALIVE_SECS``; open connections are capped by the
process's file limit.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import trio

from .._json import dumps

__all__ = ["serve_asgi", "KEEP_ALIVE_SECS"]

log = logging.getLogger("qftrio.server.http")

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
MAX_CHUNK_LINE_BYTES = 4096
KEEP_ALIVE_SECS = 120.0
HEAD_TIMEOUT_SECS = 30.0
BODY_TIMEOUT_SECS = 30.0
WRITE_TIMEOUT_SECS = 30.0
LIFESPAN_TIMEOUT_SECS = 30.0
LINGER_SECS = 2.0
LINGER_BYTES = 16 * 1024 * 1024
#: A request body the application left unread is read after its answer, so
#: the connection carries the next request, if it is no longer than this and
#: comes within ``DRAIN_SECS``; otherwise the connection is closed.
DRAIN_BYTES = 1024 * 1024
DRAIN_SECS = 5.0
#: File descriptors kept free of connections (the store's, logs, sockets of
#: the server's own clients) when the connection limit follows the process's.
RESERVED_FDS = 256
READ_SIZE = 65536

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_FIELD_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_NO_BODY_STATUS = frozenset({204, 304})
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_ASGI = {"version": "3.0", "spec_version": "2.3"}


class _BadRequest(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class _Closed(Exception):
    """The client went away, or stopped sending or taking data."""


class _BadFraming(_Closed):
    """A chunked body broke its framing: nothing more can be read."""


class _Date:
    """The ``Date`` header's value, formatted once a second."""

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.value = email.utils.formatdate(now, usegmt=True).encode()
        return self.value


_date = _Date()


class _Server:
    def __init__(self, app: Any, lifespan_state: dict[str, Any], max_connections: int) -> None:
        self.app = app
        self.state = lifespan_state
        self.max_connections = max_connections
        self.slots = trio.Semaphore(max_connections)
        self.full_logged_at = -math.inf
        self.closing = False
        self.idle: set[trio.CancelScope] = set()
        self.connections = 0
        self.drained = trio.Event()

    def begin_closing(self) -> None:
        """Stop keeping connections alive: idle ones close now, busy ones
        after their current answer."""
        self.closing = True
        for scope in list(self.idle):
            scope.cancel()
        if self.connections == 0:
            self.drained.set()

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            connection = _Connection(self, stream)
            await connection.run()
            if connection.linger:
                await connection.linger_close()
        except _Closed:
            pass
        finally:
            self.connections -= 1
            if self.closing and self.connections == 0:
                self.drained.set()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            self.slots.release()


class _Connection:
    def __init__(self, server: _Server, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.buffer = bytearray()
        self.eof = False
        #: The client may still be sending when the connection closes.
        self.linger = False
        try:
            self.local = _address(stream.socket.getsockname())
            self.peer = _address(stream.socket.getpeername())
        except OSError:
            self.local = self.peer = None

    async def run(self) -> None:
        while not self.server.closing:
            try:
                head = await self._read_head()
            except _BadRequest as exc:
                self.linger = True
                with contextlib.suppress(_Closed):
                    await self._refuse(exc)
                return
            if head is None:
                return
            exchange = _Exchange(self, *head)
            if not await exchange.run():
                self.linger = not exchange.body_done
                return

    async def linger_close(self) -> None:
        """Stop sending, and read (and drop) what the client still sends,
        for at most ``LINGER_SECS`` and ``LINGER_BYTES``: closing a socket
        with unread data resets the connection, and the client would lose
        the answer (a 413 sent before the body was read) before reading it."""
        with trio.move_on_after(LINGER_SECS):
            try:
                await self.stream.send_eof()
                received = 0
                while received < LINGER_BYTES:
                    data = await self.stream.receive_some(READ_SIZE)
                    if not data:
                        return
                    received += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return

    async def _receive_into_buffer(self, timeout: float) -> bool:
        """Append what the client sends next; False on end of stream or
        when *timeout* passes with nothing."""
        with trio.move_on_after(timeout):
            return await self._receive()
        return False

    async def _receive(self) -> bool:
        """:meth:`_receive_into_buffer` without a time limit of its own."""
        try:
            data = await self.stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    async def _read_head(self) -> tuple[bytes, list[bytes]] | None:
        """The next request's head, or None if the client is done (end of
        stream, idle timeout, server closing)."""
        buffer = self.buffer
        deadline = None
        searched = 0
        while True:
            while buffer[:2] == b"\r\n":  # empty lines before a request are allowed
                del buffer[:2]
                searched = 0
            end = buffer.find(b"\r\n\r\n", max(0, searched - 3))
            if end >= 0:
                if end > MAX_HEAD_BYTES:
                    raise _BadRequest(431, "headers_too_large", "the request head is too large")
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                lines = head.split(b"\r\n")
                if len(lines) > MAX_HEADERS + 1:
                    raise _BadRequest(431, "headers_too_large", "the request has too many header lines")
                return lines[0], lines[1:]
            searched = len(buffer)
            if searched > MAX_HEAD_BYTES:
                raise _BadRequest(431, "headers_too_large", "the request head is too large")
            if self.eof:
                if buffer:
                    raise _Closed
                return None
            if not buffer:
                if self.server.closing:
                    return None
                received = False
                with trio.CancelScope(deadline=trio.current_time() + KEEP_ALIVE_SECS) as idle:
                    self.server.idle.add(idle)
                    try:
                        received = await self._receive()
                    finally:
                        self.server.idle.discard(idle)
                if not received:
                    return None
                deadline = trio.current_time() + HEAD_TIMEOUT_SECS
                continue
            if deadline is None:
                deadline = trio.current_time() + HEAD_TIMEOUT_SECS
            if not await self._receive_into_buffer(deadline - trio.current_time()):
                if self.eof:
                    raise _Closed
                raise _BadRequest(408, "request_timeout", "the request head was not sent in time")

    async def write(self, data: bytes) -> None:
        with trio.move_on_after(WRITE_TIMEOUT_SECS):
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            else:
                return
        self.eof = True  # the connection is of no further use
        raise _Closed

    async def _refuse(self, exc: _BadRequest) -> None:
        body = dumps({"error": {"code": exc.code, "message": exc.message}})
        await self.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\ndate: %s\r\n\r\n%s" % (exc.status, _REASONS.get(exc.status, b""), len(body), _date(), body)
        )


class _Exchange:
    """One request and its answer on a connection."""

    def __init__(self, connection: _Connection, request_line: bytes, header_lines: list[bytes]) -> None:
        self.connection = connection
        self.request_line = request_line
        self.header_lines = header_lines
        # request body framing
        self.remaining = 0  # bytes left of a Content-Length body, or of the current chunk
        self.chunked = False
        self.body_done = True
        self.expect_continue = False
        self.body_delivered = False
        self.bad_framing = False
        # answer
        self.started = False
        self.head_sent = False
        self.complete = False
        self.head_only = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.out_chunked = False
        self.out_left: int | None = None
        self.keep_alive = True

    async def run(self) -> bool:
        """Serve the request; True if the connection can carry another."""
        connection = self.connection
        try:
            scope = self._scope()
        except _BadRequest as exc:
            await connection._refuse(exc)
            return False
        try:
            await connection.server.app(scope, self.receive, self.send)
        except _Closed:
            return False
        except Exception:
            log.exception("request failed: %s %s", scope["method"], scope["path"])
            if not self.started:
                self.keep_alive = False
                await self._answer_500()
            return False
        if not self.complete:
            if self.bad_framing and not self.started:
                with contextlib.suppress(_Closed):
                    await connection._refuse(_BadRequest(400, "bad_request", "malformed chunked body"))
                return False
            if self.started or connection.eof:
                return False  # an unfinished answer, or nobody left to answer
            log.error("no answer to %s %s", scope["method"], scope["path"])
            self.keep_alive = False
            await self._answer_500()
            return False
        if self.keep_alive and not self.body_done:
            await self._drain()
        return self.keep_alive and self.body_done and not connection.eof

    def _drainable(self) -> bool:
        """Whether the unread rest of the body is worth reading to keep the
        connection (a client still waiting for ``100 Continue`` sends none)."""
        return not self.expect_continue and (self.chunked or self.remaining <= DRAIN_BYTES)

    async def _drain(self) -> None:
        """Read and drop the rest of the request body (see ``DRAIN_BYTES``)."""
        drained = 0
        with trio.move_on_after(DRAIN_SECS):
            while not self.body_done and drained <= DRAIN_BYTES:
                try:
                    drained += len(await self._read_body())
                except _Closed:
                    return

    def _scope(self) -> dict[str, Any]:
        parts = self.request_line.split(b" ")
        if len(parts) != 3:
            raise _BadRequest(400, "bad_request", "malformed request line")
        method, target, version = parts
        if version == b"HTTP/1.1":
            http_version = "1.1"
        elif version == b"HTTP/1.0":
            http_version = "1.0"
            self.keep_alive = False
        elif version.startswith(b"HTTP/") and len(version) == 8:
            raise _BadRequest(505, "http_version_not_supported", "only HTTP/1.1 and HTTP/1.0 are served")
        else:
            raise _BadRequest(400, "bad_request", "malformed request line")
        if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
            raise _BadRequest(400, "bad_request", "malformed request line")
        headers: list[tuple[bytes, bytes]] = []
        lengths: set[bytes] = set()
        transfer_encoding: bytes | None = None
        hosts = 0
        for line in self.header_lines:
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):
                raise _BadRequest(400, "bad_request", "malformed header line")
            value = value.strip(b" \t")
            if _FIELD_VALUE_BAD.search(value):
                raise _BadRequest(400, "bad_request", "malformed header value")
            name = name.lower()
            if name == b"content-length":
                lengths.update(item.strip(b" \t") for item in value.split(b","))
            elif name == b"transfer-encoding":
                if transfer_encoding is not None:
                    raise _BadRequest(400, "bad_request", "more than one Transfer-Encoding header")
                transfer_encoding = value.lower()
            elif name == b"host":
                hosts += 1
            elif name == b"connection":
                tokens = {item.strip(b" \t").lower() for item in value.split(b",")}
                if b"close" in tokens:
                    self.keep_alive = False
                elif b"keep-alive" in tokens and http_version == "1.0":
                    self.keep_alive = True
            elif name == b"expect":
                if value.lower() != b"100-continue":
                    raise _BadRequest(417, "expectation_failed", "only Expect: 100-continue is understood")
                self.expect_continue = http_version == "1.1"
            headers.append((name, value))
        if hosts > 1 or (hosts == 0 and http_version == "1.1"):
            raise _BadRequest(400, "bad_request", "an HTTP/1.1 request needs exactly one Host header")
        if transfer_encoding is not None:
            if lengths:
                raise _BadRequest(400, "bad_request", "both Content-Length and Transfer-Encoding are set")
            if http_version == "1.0":
                raise _BadRequest(400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request")
            if transfer_encoding != b"chunked":
                raise _BadRequest(501, "not_implemented", "only the chunked transfer coding is understood")
            self.chunked = True
            self.body_done = False
        elif lengths:
            if len(lengths) > 1:
                raise _BadRequest(400, "bad_request", "conflicting Content-Length headers")
            (length,) = lengths
            if not length.isdigit() or len(length) > 18:
                raise _BadRequest(400, "bad_request", "invalid Content-Length")
            self.remaining = int(length)
            self.body_done = self.remaining == 0
        if self.body_done:
            self.expect_continue = False
        method_text = method.decode("ascii")
        self.head_only = method_text == "HEAD"
        raw_path, _, query = target.partition(b"?")
        if raw_path.startswith((b"http://", b"https://")):
            authority_and_path = raw_path.split(b"//", 1)[1]
            slash = authority_and_path.find(b"/")
            raw_path = authority_and_path[slash:] if slash >= 0 else b"/"
        elif not raw_path.startswith(b"/") and not (raw_path == b"*" and method == b"OPTIONS"):
            raise _BadRequest(400, "bad_request", "malformed request target")
        connection = self.connection
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": http_version,
            "method": method_text,
            "scheme": "http",
            "path": unquote(raw_path.decode("ascii")) if b"%" in raw_path else raw_path.decode("ascii"),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "client": connection.peer,
            "server": connection.local,
            "extensions": {},
            "state": dict(connection.server.state),
        }

    # -- the request body -------------------------------------------------

    async def receive(self) -> dict[str, Any]:
        if not self.body_done:
            try:
                if self.expect_continue:
                    self.expect_continue = False
                    if not self.connection.buffer:
                        await self.connection.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = await self._read_body()
            except _BadFraming:
                self.bad_framing = True
                return {"type": "http.disconnect"}
            except _Closed:
                return {"type": "http.disconnect"}
            self.body_delivered = self.body_done
            return {"type": "http.request", "body": body, "more_body": not self.body_done}
        if not self.body_delivered:
            self.body_delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._wait_for_disconnect()
        return {"type": "http.disconnect"}

    async def _fill(self) -> None:
        """Read more of the body into the buffer, or raise _Closed."""
        if not await self.connection._receive_into_buffer(BODY_TIMEOUT_SECS):
            self.connection.eof = True
            raise _Closed

    async def _read_body(self) -> bytes:
        buffer = self.connection.buffer
        if not self.chunked:
            if not buffer:
                await self._fill()
            data = bytes(buffer[: self.remaining])
            del buffer[: len(data)]
            self.remaining -= len(data)
            self.body_done = self.remaining == 0
            return data
        while self.remaining == 0:
            line = await self._chunk_line()
            size_text = line.split(b";", 1)[0].strip(b" \t")
            if not _CHUNK_SIZE.fullmatch(size_text):
                self.connection.eof = True  # the stream's framing is lost
                raise _BadFraming
            size = int(size_text, 16)
            if size == 0:
                while await self._chunk_line():  # trailers, ignored
                    pass
                self.body_done = True
                return b""
            self.remaining = size
        if not buffer:
            await self._fill()
        data = bytes(buffer[: self.remaining])
        del buffer[: len(data)]
        self.remaining -= len(data)
        if self.remaining == 0:
            while len(buffer) < 2:
                await self._fill()
            if buffer[:2] != b"\r\n":
                self.connection.eof = True
                raise _BadFraming
            del buffer[:2]
        return data

    async def _chunk_line(self) -> bytes:
        buffer = self.connection.buffer
        while True:
            end = buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 2]
                return line
            if len(buffer) > MAX_CHUNK_LINE_BYTES:
                self.connection.eof = True
                raise _BadFraming
            await self._fill()

    async def _wait_for_disconnect(self) -> None:
        """Return when the client has gone (or the answer is complete);
        bytes it sends meanwhile are kept for the next request."""
        connection = self.connection
        while not self.complete and not connection.eof:
            if len(connection.buffer) > MAX_HEAD_BYTES:
                await trio.sleep_forever()  # enough kept; the answer ends this wait
            await connection._receive()

    # -- the answer -------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started or self.complete:
            raise RuntimeError("http.response.body out of order")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if not more:
            self.complete = True
        head = b""
        if not self.head_sent:
            self.head_sent = True
            head = self._head(len(body), more)
        try:
            await self._write_framed(head, body, more)
        except _Closed:
            pass  # the client is gone; the application need not care

    async def _write_framed(self, head: bytes, body: bytes, more: bool) -> None:
        if self.head_only or self.status in _NO_BODY_STATUS or self.status < 200:
            payload = b""
        elif self.out_chunked:
            payload = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more:
                payload += b"0\r\n\r\n"
        else:
            if self.out_left is not None:
                if len(body) > self.out_left:
                    raise RuntimeError("the answer is longer than its Content-Length")
                self.out_left -= len(body)
                if not more and self.out_left:
                    self.keep_alive = False
            payload = body
        if head or payload:
            await self.connection.write(head + payload if payload else head)

    def _head(self, first_body: int, more: bool) -> bytes:
        status = self.status
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
        length: int | None = None
        for name, value in self.headers:
            name = name.lower()
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
                raise RuntimeError("a header of the answer holds a line break")
            if name == b"content-length":
                length = int(value)
                continue
            elif name == b"transfer-encoding":
                continue  # the framing is this server's to choose
            elif name == b"connection":
                if b"close" in value.lower():
                    self.keep_alive = False
                continue
            elif name == b"date":
                continue
            lines.append(b"%s: %s\r\n" % (name, value))
        framed_by_close = False
        if status in _NO_BODY_STATUS or status < 200:
            if length is not None and status == 304:
                lines.append(b"content-length: %d\r\n" % length)
        elif length is not None:
            lines.append(b"content-length: %d\r\n" % length)
            self.out_left = length
        elif not more:
            lines.append(b"content-length: %d\r\n" % first_body)
            self.out_left = first_body
        elif self.head_only:
            pass
        elif self.request_http_1_1:
            lines.append(b"transfer-encoding: chunked\r\n")
            self.out_chunked = True
        else:
            framed_by_close = True
        if framed_by_close or self.connection.server.closing or not (self.body_done or self._drainable()):
            self.keep_alive = False
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        elif not self.request_http_1_1:
            lines.append(b"connection: keep-alive\r\n")  # HTTP/1.0 closes by default
        lines.append(b"date: %s\r\n\r\n" % _date())
        return b"".join(lines)

    @property
    def request_http_1_1(self) -> bool:
        return self.request_line.endswith(b"HTTP/1.1")

    async def _answer_500(self) -> None:
        with contextlib.suppress(_Closed):
            await self.connection._refuse(_BadRequest(500, "internal", "internal error"))


def _address(address: Any) -> tuple[str, int] | None:
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return None


@contextlib.asynccontextmanager
async def _lifespan(app: Any, state: dict[str, Any]) -> AsyncIterator[None]:
    """Run the ASGI lifespan protocol around the block: startup before it,
    shutdown after. An application without lifespan support is served
    anyway.

    Raises:
        RuntimeError: the application's startup failed or took longer than
            ``LIFESPAN_TIMEOUT_SECS``.
    """
    to_app, from_server = trio.open_memory_channel[dict[str, Any]](4)
    to_server, from_app = trio.open_memory_channel[dict[str, Any]](4)

    async def run_app() -> None:
        scope = {"type": "lifespan", "asgi": _ASGI, "state": state}
        try:
            await app(scope, from_server.receive, to_server.send)
        except Exception:
            log.debug("the application's lifespan ended with an error", exc_info=True)
        to_server.send_nowait({"type": "lifespan.ended"})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_app)
        await to_app.send({"type": "lifespan.startup"})
        with trio.fail_after(LIFESPAN_TIMEOUT_SECS):
            answer = (await from_app.receive())["type"]
        if answer == "lifespan.startup.failed":
            raise RuntimeError("the application's startup failed")
        supported = answer == "lifespan.startup.complete"
        try:
            yield
        except BaseException:
            # cancelled or failed: the application's lifespan is cancelled
            # with it, and there is no shutdown to wait for
            nursery.cancel_scope.cancel()
            raise
        if supported:
            await to_app.send({"type": "lifespan.shutdown"})
            with trio.move_on_after(LIFESPAN_TIMEOUT_SECS):
                if (await from_app.receive())["type"] != "lifespan.shutdown.complete":
                    log.error("the application's shutdown failed")
        nursery.cancel_scope.cancel()


async def serve_asgi(
    app: Any,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    graceful_timeout_secs: float,
    max_connections: int | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* on *host*:*port* until *shutdown_trigger* returns, then
    stop accepting, close idle connections, and give requests in flight
    *graceful_timeout_secs* to finish.

    At most *max_connections* are open at once (by default the process's
    limit on open files, less ``RESERVED_FDS``); more wait in the listen
    backlog until one closes.

    Calls ``task_status.started(urls)`` once listening, with the bound URLs
    (port 0 binds a free port). Raises ``OSError`` if it cannot listen.
    """
    state: dict[str, Any] = {}
    listeners = await trio.open_tcp_listeners(port, host=host.strip("[]") or None)
    server = _Server(app, state, max_connections or _default_max_connections())
    try:
        async with _lifespan(app, state):
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(_accept, listener, server, connections)
                    task_status.started([_url(listener) for listener in listeners])
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
                for listener in listeners:
                    with trio.CancelScope(shield=True):
                        await listener.aclose()
                server.begin_closing()
                with trio.move_on_after(graceful_timeout_secs):
                    await server.drained.wait()
                connections.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()


def _default_max_connections() -> int:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(16, soft - RESERVED_FDS)


async def _accept(listener: trio.SocketListener, server: _Server, connections: trio.Nursery) -> None:
    while True:
        if server.slots.value == 0:
            now = trio.current_time()
            if now - server.full_logged_at > 60:
                server.full_logged_at = now
                log.warning("%d connections open, the most allowed: new ones wait", server.max_connections)
        await server.slots.acquire()
        try:
            stream = await listener.accept()
        except BaseException as exc:
            server.slots.release()
            if not isinstance(exc, OSError):
                raise
            # out of file descriptors and the like: wait, then go on
            log.warning("accepting a connection failed: %s", exc)
            await trio.sleep(0.1)
            continue
        connections.start_soon(server.handle, stream)


def _url(listener: trio.SocketListener) -> str:
    host, port = listener.socket.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
