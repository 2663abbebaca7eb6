"""The transports the clients send their calls through.

:class:`qftrio.Client` sends through one interface, :class:`Transport`, with
two implementations:

* :class:`HttpPool`, HTTP/1.1 on Trio sockets with answers parsed by llhttp
  (the parser of Node.js, through ``httptools``): what a client under Trio
  uses unless it needs one of httpx's extras.
* :class:`HttpxTransport`, an ``httpx.AsyncClient``: for callers on asyncio,
  proxies named by the environment, and a caller's own httpx transport.

:class:`qftrio.SyncClient` sends through :class:`HttpxSyncTransport`, an
``httpx.Client`` shared by the threads that call it.

Each takes a target already percent-encoded, bounds the call by its
*timeout* (the async ones the whole call: waiting for a connection,
connecting, sending, the whole answer), caps the answer's body at
*max_body_size* bytes, returns a :class:`Response`, and raises
:class:`HttpError` for anything that kept the call from an answer. None
sends a call again after a failure: an enqueue without an idempotency key
is not safe to repeat.

Why a pool of its own under Trio: an ``httpx.AsyncClient`` spends several
times the CPU of :class:`HttpPool` per call (``benchmarks/http_client.py``,
figures in ``docs/performance.md``), and a worker makes a lease and a report
call per batch of jobs.
"""

from __future__ import annotations

import contextlib
import re
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, TypedDict
from urllib.parse import urlsplit

import httptools
import trio

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_MAX_BODY_SIZE",
    "HttpError",
    "HttpPool",
    "HttpxSyncTransport",
    "HttpxTransport",
    "Response",
    "Transport",
    "check_headers",
]

#: The default cap on an answer's body: room for a lease of 100 jobs whose
#: payloads each fill the server's default 1 MiB request cap, twice over.
DEFAULT_MAX_BODY_SIZE = 256 * 1024 * 1024

# The most answer bytes in a row that carry no body: the head, the framing
# between two chunks, the trailers. Real servers send far less; a server
# flooding any of them is cut off here instead of being read until the timeout.
_MAX_FRAMING = 64 * 1024
_READ = 65536

# RFC 9110 field names (tokens) and field values, the latter limited to
# visible ASCII with inner spaces: what every server reads the same way.
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?")


class HttpError(Exception):
    """The call failed below HTTP: no connection, a broken one, a malformed
    or oversized answer, or the timeout. The message says which."""


class Response:
    """A complete answer: its status, lower-cased header names (a repeated
    header's values joined by ``", "``), and body."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes | bytearray) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class Transport(Protocol):
    """What :class:`qftrio.Client` sends its calls through."""

    async def request(self, method: str, target: str, body: bytes | None, *, timeout: float) -> Response:
        """Send one call and read its whole answer. *target* is the path
        (percent-encoded) and query, relative to the base URL; *body*, when
        given, is JSON.

        Raises:
            HttpError: anything that kept the call from getting an answer.
        """
        ...

    async def aclose(self) -> None:
        """Close every connection. Idempotent."""
        ...


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse a header that could not go out as it is: a name that is not
    a token, a value holding a line break, a control or non-ASCII character,
    or surrounding spaces (which a server would strip). The message names
    the header, never its value (it may be a credential).

    Raises:
        ValueError: the first such header.
    """
    for name, value in headers.items():
        if not _FIELD_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a header name")
        if not _FIELD_VALUE.fullmatch(value):
            raise ValueError(
                f"the {name} header holds a line break, a control or non-ASCII character, or surrounding spaces"
            )


def _ssl_context() -> ssl.SSLContext:
    """The certificates httpx trusts (certifi, or ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` when set), so both transports verify alike."""
    import httpx

    return httpx.create_ssl_context()


class _Connection:
    """One connection and the llhttp parser reading its answers. The parser's
    callbacks only record; :meth:`feed` decides."""

    __slots__ = (
        "stream",
        "socket",
        "parser",
        "max_body_size",
        "status",
        "headers",
        "body",
        "head_done",
        "done",
        "keep",
        "error",
        "since_body",
    )

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType, max_body_size: int) -> None:
        self.stream = stream
        self.socket = socket
        self.max_body_size = max_body_size
        self.parser = httptools.HttpResponseParser(self)
        self.begin()

    def begin(self) -> None:
        """Get ready for the next answer."""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()  # the body is held here once, and handed out as it is
        self.head_done = self.done = self.keep = False
        self.error: str | None = None
        self.since_body = 0

    def reusable(self) -> bool:
        # Readable while idle means the server closed it (or sent bytes
        # nobody asked for): either way it cannot carry another call.
        return self.keep and self.socket.fileno() >= 0 and not self.socket.is_readable()

    def close(self) -> None:
        self.socket.close()

    def feed(self, data: bytes) -> None:
        """Parse the next bytes of the answer.

        Raises:
            HttpError: the answer is malformed or over a cap.
        """
        size = len(self.body)
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if not self.done and self.error is None:
                self.error = f"malformed answer ({exc or type(exc).__name__})"
            self.keep = False  # after a complete answer: bytes nobody asked for
        if self.error is not None:
            raise HttpError(self.error)
        if len(self.body) > self.max_body_size:
            raise HttpError(f"the answer's body is larger than {self.max_body_size} bytes")
        if len(self.body) > size:
            self.since_body = 0
            return
        self.since_body += len(data)
        if self.since_body > _MAX_FRAMING and not self.done:
            what = "chunk framing or trailers" if self.head_done else "head"
            raise HttpError(f"the answer's {what} exceed {_MAX_FRAMING} bytes")

    def feed_eof(self) -> None:
        """The server closed the connection: the answer ends here if its
        length is the connection's (neither Content-Length nor chunked).

        Raises:
            HttpError: the answer was cut short.
        """
        if self.head_done and "content-length" not in self.headers and "transfer-encoding" not in self.headers:
            self.done = True
            self.keep = False
        else:
            raise HttpError("the server closed the connection")

    # -- llhttp's callbacks

    def on_message_begin(self) -> None:
        if self.done:
            raise HttpError("an answer nobody asked for")  # stops the parser; feed drops the connection

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a trailer: nothing here reads them
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key == "transfer-encoding" and text.lower() != "chunked":
            # No transfer coding was asked for, and llhttp would read an
            # unknown one (``xchunked``) as a body ending with the connection.
            self.error = f"malformed answer (Transfer-Encoding: {text[:40]!r})"
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.status = self.parser.get_status_code()
        if not 100 <= self.status <= 599 or self.status == 101:
            self.error = f"malformed answer (status {self.status})"

    def on_body(self, data: bytes) -> None:
        self.body += data

    def on_message_complete(self) -> None:
        if self.status < 200:
            # An interim answer (100 Continue, 103 Early Hints): the real one follows.
            self.headers = {}
            self.head_done = False
            return
        self.done = True
        self.keep = self.parser.should_keep_alive()


class HttpPool:
    """Keep-alive connections to the server at *url* (``http://`` or
    ``https://``), sending *headers* with every call.

    One call per connection at a time, idle connections reused newest first,
    at most *max_connections* open. A connection is dropped after any
    failure, after an answer that ends it (``Connection: close``, HTTP/1.0,
    a body ending with the connection), and after bytes nobody asked for.
    Answers to ``HEAD`` are not read as bodiless: the client sends none.

    Args:
        url: the base URL; its path is prefixed to every call's path.
        headers: sent with every call (``Host`` is added).
        max_connections: connections open at once; further calls wait.
        max_body_size: the largest answer body accepted, in bytes.
        ssl_context: for ``https://``; the default verifies as httpx does.

    Raises:
        ValueError: *url* is not an ``http://`` or ``https://`` URL, or a
            header could not be sent (:func:`check_headers`).
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        max_connections: int = 10,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/").encode()
        self._ssl_context = ssl_context if ssl_context is not None or not self._tls else _ssl_context()
        default_port = self._port == (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host.encode("idna").decode("ascii")
        all_headers = {"Host": host if default_port else f"{host}:{self._port}", **headers}
        check_headers(all_headers)
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in all_headers.items()).encode("ascii")
        self._max_body_size = max_body_size
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    async def request(self, method: str, target: str, body: bytes | None, *, timeout: float) -> Response:
        """See :meth:`Transport.request`."""
        head = b"%s %s%s HTTP/1.1\r\n%s" % (method.encode(), self._prefix, target.encode(), self._fixed)
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        data = head + b"\r\n" + body if body else head + b"\r\n"
        with trio.move_on_after(timeout) as scope:
            async with self._slots:
                if self._closed:
                    raise HttpError("the client is closed")
                conn = self._take_idle() or await self._connect()
                try:
                    answer = await self._exchange(conn, data)
                except BaseException:
                    conn.close()
                    raise
                if conn.keep and not self._closed:
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
            return _Connection(tcp, tcp.socket, self._max_body_size)
        assert self._ssl_context is not None
        stream = trio.SSLStream(tcp, self._ssl_context, server_hostname=self._host, https_compatible=True)
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            tcp.socket.close()
            raise HttpError(f"TLS handshake failed: {exc.__cause__ or exc}") from None
        return _Connection(stream, tcp.socket, self._max_body_size)

    async def _exchange(self, conn: _Connection, data: bytes) -> Response:
        conn.begin()
        try:
            await conn.stream.send_all(data)
            while not conn.done:
                received = await conn.stream.receive_some(_READ)
                if received:
                    conn.feed(received)
                else:
                    conn.feed_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            raise HttpError(f"connection lost: {exc.__cause__ or exc or type(exc).__name__}") from None
        return Response(conn.status, conn.headers, conn.body)


class _HttpxOptions(TypedDict):
    base_url: str
    headers: Mapping[str, str]
    timeout: None
    limits: httpx.Limits


def _httpx_options(url: str, headers: Mapping[str, str], max_connections: int) -> _HttpxOptions:
    """The settings both httpx clients are made with."""
    import httpx

    check_headers(headers)
    return {
        "base_url": url,
        "headers": headers,
        "timeout": None,  # each call's own, in request
        "limits": httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
    }


@contextlib.contextmanager
def _httpx_errors() -> Iterator[None]:
    """httpx's exceptions, raised around a call, as :class:`HttpError`."""
    import httpx

    try:
        yield
    except httpx.TimeoutException:
        raise HttpError("timed out") from None
    except httpx.ConnectError as exc:
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ssl.SSLError):
            cause = cause.__cause__ or cause.__context__  # httpcore re-raises "from None"
        if cause is not None:  # as the Trio pool says it
            raise HttpError(f"TLS handshake failed: {cause}") from None
        raise HttpError(f"cannot connect: {exc}") from None
    except httpx.HTTPError as exc:
        raise HttpError(str(exc) or type(exc).__name__) from None


def _json_headers(body: bytes | None) -> dict[str, str] | None:
    return {"Content-Type": "application/json"} if body is not None else None


class HttpxTransport:
    """Calls through an ``httpx.AsyncClient``, under Trio or asyncio.

    httpx reads proxies from the environment (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``, ``NO_PROXY``) and takes a caller's own *transport*. Its
    parser, h11, is strict as llhttp is and caps the head and the trailers;
    the body cap and the bound on the whole call are added here.

    Args:
        url: the base URL; its path is prefixed to every call's path.
        headers: sent with every call.
        max_connections: connections open at once; further calls wait.
        max_body_size: the largest answer body accepted, in bytes.
        transport: an httpx transport to send through instead of the network.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        max_connections: int = 10,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        import anyio  # httpx's own dependency: one cancel scope under Trio or asyncio
        import httpx

        self._anyio = anyio
        self._httpx = httpx
        self._max_body_size = max_body_size
        self._client = httpx.AsyncClient(**_httpx_options(url, headers, max_connections), transport=transport)

    async def request(self, method: str, target: str, body: bytes | None, *, timeout: float) -> Response:
        """See :meth:`Transport.request`."""
        with self._anyio.move_on_after(timeout), _httpx_errors():
            async with self._client.stream(method, target, content=body, headers=_json_headers(body)) as answer:
                content = bytearray()
                pieces = answer.aiter_bytes()
                async for piece in pieces:
                    content += piece
                    if len(content) > self._max_body_size:
                        await self._abandon(answer, pieces)
                        raise HttpError(f"the answer's body is larger than {self._max_body_size} bytes")
                return Response(answer.status_code, dict(answer.headers), content)
        raise HttpError("timed out")

    async def _abandon(self, answer: httpx.Response, pieces: AsyncIterator[bytes]) -> None:
        """Drop *answer* mid-body. Its connection is closed first, so that
        reading on fails at once and unwinds httpx's chain of generators,
        which would each warn when collected if left suspended."""
        await answer.aclose()
        with contextlib.suppress(self._httpx.HTTPError, self._httpx.StreamError):
            async for _ in pieces:
                pass

    async def aclose(self) -> None:
        """See :meth:`Transport.aclose`."""
        try:
            await self._client.aclose()
        except self._httpx.HTTPError:  # a broken connection while closing changes nothing
            pass


class HttpxSyncTransport:
    """Calls through an ``httpx.Client``, from any number of threads at once:
    what :class:`qftrio.SyncClient` sends through, with proxies from the
    environment as :class:`HttpxTransport`.

    At most *max_connections* calls are in httpx's pool at once; the others
    wait here. httpcore's blocking pool can close a kept-alive connection it
    has just handed to a thread that waited for one (encode/httpcore#1110),
    which fails that call; with no call waiting inside the pool, none is
    handed over that way.

    Blocking code has no cancel scope: the wait for a free connection, and
    then httpx's connecting, each send and each read, are bounded by what is
    left of *timeout*, and the body is read only while the call is within
    it, so that an answer dripping in ends with "timed out" at most one read
    after the bound.

    Args: as :class:`HttpxTransport`'s, with *transport* an
    ``httpx.BaseTransport``.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        max_connections: int = 10,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        import httpx

        self._max_body_size = max_body_size
        self._max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closed = False
        self._client = httpx.Client(**_httpx_options(url, headers, max_connections), transport=transport)

    def request(self, method: str, target: str, body: bytes | None, *, timeout: float) -> Response:
        """Send one call and read its whole answer, as :meth:`Transport.request`."""
        deadline = time.monotonic() + timeout
        if not self._slots.acquire(timeout=timeout):
            raise HttpError("timed out")
        try:
            if self._closed:
                raise HttpError("the client is closed")
            with _httpx_errors():
                left = max(deadline - time.monotonic(), 0.001)
                with self._client.stream(
                    method, target, content=body, headers=_json_headers(body), timeout=left
                ) as answer:
                    content = bytearray()
                    for piece in answer.iter_bytes():
                        content += piece
                        if len(content) > self._max_body_size:
                            raise HttpError(f"the answer's body is larger than {self._max_body_size} bytes")
                        if time.monotonic() > deadline:
                            raise HttpError("timed out")
                    return Response(answer.status_code, dict(answer.headers), content)
        except (HttpError, RuntimeError):
            # Closed by another thread during the call: httpx fails it on
            # the closed connection, or refuses to send (RuntimeError).
            if self._closed:
                raise HttpError("the client is closed") from None
            raise
        finally:
            self._slots.release()

    #: Seconds :meth:`close` waits for the calls in flight to end.
    CLOSE_GRACE = 1.0

    def close(self) -> None:
        """Close every connection. Idempotent.

        Calls in flight in other threads get :attr:`CLOSE_GRACE` seconds to
        end first: httpcore's pool, closed while a call opens a connection,
        keeps that connection open (its socket is never closed). Calls
        still running then fail with "the client is closed"; later ones at
        once."""
        self._closed = True
        deadline = time.monotonic() + self.CLOSE_GRACE
        taken = 0
        while taken < self._max_connections and self._slots.acquire(timeout=max(deadline - time.monotonic(), 0)):
            taken += 1
        try:
            with contextlib.suppress(HttpError), _httpx_errors():
                self._client.close()
        finally:
            for _ in range(taken):
                self._slots.release()
