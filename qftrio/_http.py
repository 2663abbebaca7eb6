"""A small HTTP/1.1 client on Trio sockets: what :class:`qftrio.Client` sends
its calls through when nothing asks for httpx's extras.

One request per connection at a time, connections kept alive and reused
(newest first), at most *max_connections* open. Answers may be framed by
``Content-Length``, chunked, or end with the connection. The whole call
(waiting for a free connection, connecting, sending, the answer) is bounded
by its *timeout*. A connection is only reused when it is neither closed nor
holding unread bytes; a call that fails is not sent again (an enqueue
without an idempotency key is not safe to repeat), as with httpx.

Why not httpx: under Trio, an ``httpx.AsyncClient`` spends 560-690 µs of CPU
per call on 127.0.0.1 with a 50 KB answer, this client about 90
(``benchmarks/http_client.py``).
A worker sends one lease and one report call per 100 jobs, so that was
about 11 µs per job, the largest share of a worker's CPU after its own
scheduling. httpx stays for what this does not do: proxies taken from the
environment, a caller's own ``httpx`` transport, and callers on asyncio.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

import trio

__all__ = ["Answer", "HttpPool", "HttpError"]

_MAX_HEAD = 64 * 1024
_READ = 65536


class HttpError(Exception):
    """The call failed below HTTP: no connection, a broken one, a malformed
    answer, or the timeout. The message says which."""


class Answer:
    """A complete answer: its status, lower-cased header names, and body."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class _Connection:
    __slots__ = ("stream", "buffer", "socket")

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self.stream = stream
        self.socket = socket
        self.buffer = bytearray()

    def reusable(self) -> bool:
        # Readable while idle means the server closed it (or sent bytes
        # nobody asked for): either way it cannot carry another call.
        return not self.buffer and self.socket.fileno() >= 0 and not self.socket.is_readable()

    async def fill(self) -> None:
        data = await self.stream.receive_some(_READ)
        if not data:
            raise HttpError("the server closed the connection")
        self.buffer += data

    def close(self) -> None:
        self.socket.close()


class HttpPool:
    """Keep-alive connections to the server at *url* (``http://`` or
    ``https://``), sending *headers* with every call.

    Args:
        url: the base URL; its path is prefixed to every call's path.
        headers: sent with every call (``Host`` is added).
        max_connections: connections open at once; further calls wait.
        ssl_context: for ``https://``; the default verifies against the
            system's certificates.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        max_connections: int = 10,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self._ssl_context = ssl_context if ssl_context is not None or not self._tls else ssl.create_default_context()
        default_port = self._port == (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        all_headers = {"Host": host if default_port else f"{host}:{self._port}", **headers}
        if any(c in text for item in all_headers.items() for text in item for c in "\r\n\0"):
            raise ValueError("a header holds a line break")
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in all_headers.items()).encode("latin-1")
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    async def request(self, method: str, target: str, body: bytes | None, *, timeout: float) -> Answer:
        """Send one call and read its whole answer. *target* is the path
        (already quoted) and query, relative to the base URL.

        Raises:
            HttpError: anything that kept the call from getting an answer.
        """
        head = b"%s %s%s HTTP/1.1\r\n%s" % (method.encode(), self._prefix.encode(), target.encode(), self._fixed)
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        data = head + b"\r\n" + body if body else head + b"\r\n"
        with trio.move_on_after(timeout) as scope:
            async with self._slots:
                if self._closed:
                    raise HttpError("the client is closed")
                conn = self._take_idle() or await self._connect()
                try:
                    answer, keep = await self._exchange(conn, method, data)
                except BaseException:
                    conn.close()
                    raise
                if keep and not self._closed:
                    self._idle.append(conn)
                else:
                    conn.close()
                return answer
        assert scope.cancelled_caught
        raise HttpError("timed out")

    def close(self) -> None:
        """Close every idle connection; calls in flight close theirs when
        they end. Idempotent."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def aclose(self) -> None:
        """:meth:`close`, as a checkpoint."""
        self.close()
        await trio.lowlevel.checkpoint()

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable():
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        try:
            tcp = await trio.open_tcp_stream(self._host, self._port)
        except OSError as exc:
            raise HttpError(f"cannot connect: {exc.strerror or exc}") from None
        tcp.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        if not self._tls:
            return _Connection(tcp, tcp.socket)
        assert self._ssl_context is not None
        stream = trio.SSLStream(tcp, self._ssl_context, server_hostname=self._host, https_compatible=True)
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            tcp.socket.close()
            raise HttpError(f"TLS handshake failed: {exc.__cause__ or exc}") from None
        return _Connection(stream, tcp.socket)

    async def _exchange(self, conn: _Connection, method: str, data: bytes) -> tuple[Answer, bool]:
        try:
            await conn.stream.send_all(data)
            while True:
                status, headers, keep = await self._read_head(conn)
                if 100 <= status < 200 and status != 101:
                    continue  # an interim answer; the real one follows
                break
            if method == "HEAD" or status in (204, 304):
                content = b""
            elif headers.get("transfer-encoding", "").lower().endswith("chunked"):
                content = await self._read_chunked(conn)
            elif "content-length" in headers:
                length = _int(headers["content-length"], 10, "Content-Length")
                content = await self._read_exactly(conn, length)
            else:
                content = await self._read_to_end(conn)
                keep = False
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            raise HttpError(f"connection lost: {exc.__cause__ or exc or type(exc).__name__}") from None
        return Answer(status, headers, content), keep

    async def _read_head(self, conn: _Connection) -> tuple[int, dict[str, str], bool]:
        buffer = conn.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > _MAX_HEAD:
                raise HttpError("the answer's head is too large")
            await conn.fill()
        lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
        del buffer[: end + 4]
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise HttpError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        status = _int(rest[:3], 10, "status")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise HttpError(f"malformed header line: {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        return status, headers, keep

    async def _read_exactly(self, conn: _Connection, length: int) -> bytes:
        while len(conn.buffer) < length:
            await conn.fill()
        content = bytes(conn.buffer[:length])
        del conn.buffer[:length]
        return content

    async def _read_chunked(self, conn: _Connection) -> bytes:
        parts = []
        while True:
            while (end := conn.buffer.find(b"\r\n")) < 0:
                if len(conn.buffer) > _MAX_HEAD:
                    raise HttpError("a chunk size line is too long")
                await conn.fill()
            size_line = bytes(conn.buffer[:end]).split(b";", 1)[0].strip()
            del conn.buffer[: end + 2]
            size = _int(size_line.decode("latin-1"), 16, "chunk size")
            if size == 0:
                # trailers, if any, up to the empty line
                while (end := conn.buffer.find(b"\r\n")) != 0:
                    if end > 0:
                        del conn.buffer[: end + 2]
                    else:
                        await conn.fill()
                del conn.buffer[:2]
                return b"".join(parts)
            parts.append(await self._read_exactly(conn, size))
            if (await self._read_exactly(conn, 2)) != b"\r\n":
                raise HttpError("a chunk does not end where its size says")

    async def _read_to_end(self, conn: _Connection) -> bytes:
        while True:
            data = await conn.stream.receive_some(_READ)
            if not data:
                content = bytes(conn.buffer)
                conn.buffer.clear()
                return content
            conn.buffer += data


def _int(text: str, base: int, what: str) -> int:
    digits = "0123456789" if base == 10 else "0123456789abcdefABCDEF"
    if not text or any(c not in digits for c in text):
        raise HttpError(f"malformed {what} in the answer: {text[:40]!r}")
    return int(text, base)
