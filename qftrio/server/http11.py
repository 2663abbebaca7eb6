"""An HTTP/1.1 server on Trio, for a front and an ASGI application.

It serves qftrio's API: keep-alive, pipelining, ``Content-Length`` and
chunked request bodies, ``Expect: 100-continue``, HEAD, chunked or
length-delimited responses, the ASGI lifespan protocol, and a graceful
shutdown. It does not speak HTTP/2, TLS, WebSocket or protocol upgrades:
put a proxy in front for those.

The framing is parsed by llhttp (Node.js's parser, through ``httptools``)
with every leniency off, so a request means here what it means to any strict
parser: what llhttp refuses is answered ``400`` and the connection closed,
and no second request is ever read where a strict parser sees one. The
parsing is a protocol object with no I/O (:mod:`qftrio.server.http_protocol`);
this module keeps the connection loop around it: each connection is one
task, and each request's front or application call runs in it (no task per
request). The parser runs ahead of the application only as far as one read
goes; its events (a head, body bytes, the end of a message) are queued and
served in order, and a parse error comes after the requests before it.

A body the application did not read (a request refused on its headers) is
read after the answer, so the connection carries the client's next request.
While the application waits after the request body, ``receive()`` watches
the socket, so a client that goes away is seen as ``http.disconnect`` (a
long poll relies on that); bytes of a pipelined next request read meanwhile
are parsed and kept for it.

Connections are capped in all (``max_connections``) and per client address
(``max_connections_per_address``), so that one address cannot take every
connection. A peer that is a trusted proxy is not capped by address (the
proxy limits its own clients); the client address it names in
``X-Forwarded-For`` is the request's ASGI ``client``, which the application
throttles by.

Whatever a client sends, its connection's task ends on its own: an error
there is logged once, and the server goes on. Malformed requests get a JSON
error (400, 408, 413, 417, 431, 501 or 505) and the connection is closed,
after lingering (``LINGER_SECS``) if the client may still be sending, so that
it can read the answer. The limits are documented in docs/protocol.md
(``## HTTP``) and set by the constants below.
"""

from __future__ import annotations

import contextlib
import email.utils
import ipaddress
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import unquote

import httptools
import trio

from .._json import dumps
from .http_protocol import END, HEAD, MAX_HEAD_BYTES, NO_BODY_STATUS, REASONS, BadRequest, Request, RequestParser, response_head
from .throttle import client_key

__all__ = ["Exchange", "Front", "serve_asgi", "KEEP_ALIVE_SECS"]

log = logging.getLogger("qftrio.server.http")

KEEP_ALIVE_SECS = 120.0
#: From a head's first byte (an empty line counts) to its end.
HEAD_TIMEOUT_SECS = 30.0
#: A body must keep coming at ``BODY_MIN_RATE`` bytes a second, measured
#: over each ``BODY_WINDOW_SECS`` the server spends waiting for it (the time
#: the application takes between reads is not the client's): a window that
#: brings fewer than ``BODY_MIN_RATE * BODY_WINDOW_SECS`` bytes, and not the
#: body's end, gets 408. Apache's mod_reqtimeout asks the same by default.
BODY_WINDOW_SECS = 20.0
BODY_MIN_RATE = 500
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
#: Connections accepted past the limit only to be answered 503 at once,
#: when no idle connection can be closed to make room; more wait in the
#: listen backlog.
MAX_REFUSING = 64
#: Connections open at once from one client address, by default; past it,
#: an address's connections are answered 503, this many at a time.
MAX_CONNECTIONS_PER_ADDRESS = 256
MAX_REFUSING_PER_ADDRESS = 8
READ_SIZE = 65536

_ASGI = {"version": "3.0", "spec_version": "2.3"}
_VERSIONS = frozenset({"1.0", "1.1"})
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_DISCONNECT = {"type": "http.disconnect"}



#: Answers an :class:`Exchange` itself (True), or leaves it to the ASGI
#: application (False).
Front = Callable[["Exchange"], Awaitable[bool]]


class _Closed(Exception):
    """The client went away, or stopped sending or taking data."""


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
    def __init__(
        self,
        app: Any,
        lifespan_state: dict[str, Any],
        max_connections: int,
        max_body_bytes: int,
        max_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
        trusted_proxies: Sequence[str] = (),
        front: Front | None = None,
    ) -> None:
        self.app = app
        self.front = front
        self.state = lifespan_state
        self.max_connections = max_connections
        self.max_body_bytes = max_body_bytes
        self.max_per_address = max_per_address
        self.trusted_proxies = [ipaddress.ip_network(proxy, strict=False) for proxy in trusted_proxies]
        self.slots = trio.Semaphore(max_connections + MAX_REFUSING)
        self.full_logged_at = -math.inf
        self.closing = False
        #: Connections waiting for a next request, oldest first, with their
        #: client address: the first to close when the server (or their
        #: address's share) is full, or closing.
        self.idle: dict[trio.CancelScope, str | None] = {}
        self.connections = 0
        #: Connections open by client address (trusted proxies left out),
        #: and those being refused for being past it.
        self.by_address: dict[str, int] = {}
        self.refusing: dict[str, int] = {}
        self.drained = trio.Event()

    def trusted(self, host: str) -> bool:
        """Whether *host* is a trusted proxy."""
        if not self.trusted_proxies:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.trusted_proxies)

    def address_of(self, stream: trio.SocketStream) -> str | None:
        """The address *stream*'s connection counts against (None: uncapped)."""
        try:
            peer = _address(stream.socket.getpeername())
        except OSError:
            return None
        if peer is None or self.trusted(peer[0]):
            return None
        return client_key(peer[0])

    def begin_closing(self) -> None:
        """Stop keeping connections alive: idle ones close now, busy ones
        after their current answer."""
        self.closing = True
        for scope in list(self.idle):
            scope.cancel()
        if self.connections == 0:
            self.drained.set()

    def make_room(self, address: str | None) -> bool:
        """Whether a new connection from *address* may be served: below the
        limits, or once the longest idle connection (of that address, when
        it is the address's share that is full) is told to close."""
        if address is not None and self.by_address.get(address, 0) >= self.max_per_address:
            for scope, idle_address in self.idle.items():
                if idle_address == address:
                    del self.idle[scope]
                    scope.cancel()
                    return True
            return False
        if self.connections < self.max_connections:
            return True
        now = trio.current_time()
        if now - self.full_logged_at > 60:
            self.full_logged_at = now
            log.warning(
                "%d connections open, the most allowed: idle ones are closed, new ones refused with 503",
                self.max_connections,
            )
        if not self.idle:
            return False
        scope = next(iter(self.idle))
        del self.idle[scope]
        scope.cancel()
        return True

    async def handle(self, stream: trio.SocketStream, address: str | None) -> None:
        self.connections += 1
        if address is not None:
            self.by_address[address] = self.by_address.get(address, 0) + 1
        try:
            connection = _Connection(self, stream, address)
            await connection.run()
            if connection.linger:
                await connection.linger_close()
        except _Closed:
            pass
        except Exception:
            # A fault here is the server's, not the client's: it ends this
            # connection only. The message names no header, body or token.
            log.exception("a connection failed")
        finally:
            self.connections -= 1
            if address is not None:
                left = self.by_address.pop(address) - 1
                if left:
                    self.by_address[address] = left
            if self.closing and self.connections == 0:
                self.drained.set()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            self.slots.release()

    async def refuse(self, stream: trio.SocketStream, address: str | None) -> None:
        """Answer a connection past a limit with a 503, and close it; an
        address past its own limit gets at most ``MAX_REFUSING_PER_ADDRESS``
        such answers at a time, and its further connections are closed at
        once, so that its refusals cannot take the slots others need."""
        over = address is not None and self.by_address.get(address, 0) >= self.max_per_address
        if over:
            assert address is not None
            message = "too many connections are open from this address"
            answer = self.refusing.get(address, 0) < MAX_REFUSING_PER_ADDRESS
            self.refusing[address] = self.refusing.get(address, 0) + 1
        else:
            message = "the server has too many connections open"
            answer = True
        try:
            if answer:
                connection = _Connection(self, stream, address)
                await connection.refuse(BadRequest(503, "unavailable", message))
                await connection.linger_close()
        except _Closed:
            pass
        except Exception:
            log.exception("refusing a connection failed")
        finally:
            if over:
                assert address is not None
                left = self.refusing.pop(address) - 1
                if left:
                    self.refusing[address] = left
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            self.slots.release()


class _Connection(RequestParser):
    """One client connection: its bytes read and fed to its parser, its
    requests served in turn."""

    def __init__(self, server: _Server, stream: trio.SocketStream, address: str | None) -> None:
        self.server = server
        self.stream = stream
        #: The address this connection counts against (None: a trusted proxy).
        self.address = address
        RequestParser.__init__(self, server.max_body_bytes)
        self.eof = False
        #: The client may still be sending when the connection closes.
        self.linger = False
        self.fd = stream.socket.fileno()
        #: The last reads waited for the socket (see :meth:`_read_head`).
        self.parked = False
        try:
            self.local = _address(stream.socket.getsockname())
            self.peer = _address(stream.socket.getpeername())
        except OSError:
            self.local = self.peer = None

    @property
    def readable(self) -> bool:
        """Whether more of the stream can be read and parsed."""
        return not (self.eof or self.upgraded or self.error)

    # -- reading ---------------------------------------------------------------

    async def _receive(self) -> bytes:
        """The next bytes from the client; empty at the end of the stream.

        The (non-blocking) socket is read directly, and waited for only when
        it has nothing: Trio's ``receive_some`` yields to the scheduler once
        more after each read, a second wake-up for every request. Sets
        ``parked`` when it waited."""
        while True:
            try:
                data = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(self.fd)
                except trio.ClosedResourceError:
                    data = b""
                else:
                    self.parked = True
                    continue
            except OSError:  # reset by the peer, and the like
                data = b""
            break
        if not data:
            self.eof = True
        return data

    async def _receive_idle(self) -> bytes:
        """:meth:`_receive` between requests: empty after ``KEEP_ALIVE_SECS``
        or when the server closes the connection to make room or to stop."""
        with trio.CancelScope(deadline=trio.current_time() + KEEP_ALIVE_SECS) as idle:
            self.server.idle[idle] = self.address
            try:
                return await self._receive()
            finally:
                self.server.idle.pop(idle, None)
        return b""

    async def _read_head(self) -> Request | None:
        """The next request's head, or None if the client is done (end of
        stream, idle timeout, server closing).

        Raises:
            BadRequest: a malformed, too large or too slow head.
        """
        events = self.events
        # the deadline runs from the head's first byte, an empty line included
        deadline = trio.current_time() + HEAD_TIMEOUT_SECS if self.begun else None
        received = 0
        self.parked = False
        while not events:
            if not self.readable:
                if self.error is not None:
                    raise self.error
                return None
            if deadline is None:
                if self.server.closing:
                    return None
                data = await self._receive_idle()
                deadline = trio.current_time() + HEAD_TIMEOUT_SECS
            else:
                data = None
                with trio.move_on_at(deadline):
                    data = await self._receive()
                if data is None:
                    raise BadRequest(408, "request_timeout", "the request head was not sent in time")
            if not data:
                return None
            received += len(data)
            self.feed(data)
            if not events and received > MAX_HEAD_BYTES:
                raise BadRequest(431, "headers_too_large", "the request head is too large")
        if not self.parked:
            # Pipelined requests come without a wait, and so do their
            # answers: one yield per request keeps a client's stream of them
            # from holding the loop.
            await trio.lowlevel.checkpoint()
        kind, request = events.popleft()
        assert kind == HEAD, "a request's events were left unread"
        return request

    # -- the connection's life ---------------------------------------------------

    async def run(self) -> None:
        while not self.server.closing:
            try:
                request = await self._read_head()
            except BadRequest as exc:
                self.linger = True
                with contextlib.suppress(_Closed):
                    await self.refuse(exc)
                return
            if request is None:
                return
            exchange = Exchange(self, request)
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

    async def write(self, data: bytes) -> None:
        """Send *data*, waiting at most ``WRITE_TIMEOUT_SECS`` for the client
        to take it. An answer nearly always fits the socket's buffer: it is
        written directly, with no timeout to arm nor a yield to the
        scheduler, and only the rest, if any, is waited for."""
        try:
            sent = os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.eof = True
            raise _Closed from None
        if sent == len(data):
            return
        with trio.move_on_after(WRITE_TIMEOUT_SECS):
            try:
                await self.stream.send_all(memoryview(data)[sent:])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            else:
                return
        self.eof = True  # the connection is of no further use
        raise _Closed

    async def refuse(self, exc: BadRequest) -> None:
        """Send *exc* as a JSON error that closes the connection."""
        body = dumps({"error": {"code": exc.code, "message": exc.message}})
        extra = b"retry-after: 1\r\n" if exc.status == 503 else b""
        await self.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n%sdate: %s\r\n\r\n%s"
            % (exc.status, REASONS.get(exc.status, b""), len(body), extra, _date(), body)
        )


class Exchange:
    """One request and its answer on a connection.

    A front (see :func:`serve_asgi`) reads the parsed head (``method``,
    ``path``, ``raw_path``, ``query_string``, ``headers``, ``client``),
    the body with :meth:`read_chunk`, waits for the client to go with
    :meth:`wait_disconnect`, and answers with :meth:`respond`; an ASGI
    application gets the same through ``receive`` and ``send``.
    """

    def __init__(self, connection: _Connection, request: Request) -> None:
        self.connection = connection
        self.request = request
        self.keep_alive = request.keep_alive and not request.upgrade
        # request body
        self.chunked = False
        self.declared = 0  # the Content-Length, if any
        self.body_done = False  # the parser's end of the request was read
        self.body_delivered = False  # and given to the application
        self.expect_continue = False
        self.continuing: trio.Event | None = None  # set once a 100 Continue is written
        #: Why reading the request failed (framing, size, time): the answer.
        self.refusal: BadRequest | None = None
        self.waited = 0.0  # in the current body rate window
        self.window_bytes = 0
        self.framing = 0  # bytes read since the last that brought body bytes
        # answer
        self.started = False
        self.head_sent = False
        self.complete = False
        self.head_only = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.out_chunked = False
        self.out_left: int | None = None

    async def run(self) -> bool:
        """Serve the request; True if the connection can carry another."""
        connection = self.connection
        server = connection.server
        try:
            self._parse_head()
        except BadRequest as exc:
            await self._refuse(exc)
            return False
        try:
            if server.front is None or not await server.front(self):
                await server.app(self._scope(), self.receive, self.send)
        except _Closed:
            return False
        except Exception:
            log.exception("request failed: %s %s", self.method, self.path)
            if not self.head_sent:
                await self._refuse(BadRequest(500, "internal", "internal error"))
            return False
        if self.refusal is not None:
            if not self.head_sent:
                await self._refuse(self.refusal)
            return False
        if not self.complete:
            if self.head_sent or connection.eof:
                return False  # an unfinished answer, or nobody left to answer
            log.error("no answer to %s %s", self.method, self.path)
            await self._refuse(BadRequest(500, "internal", "internal error"))
            return False
        if self.keep_alive and not self.body_done:
            await self._drain()
        # requests the client sent before it stopped sending are still answered
        return self.keep_alive and self.body_done and (not connection.eof or bool(connection.events))

    async def _refuse(self, exc: BadRequest) -> None:
        """Answer with *exc* instead of the application, and close."""
        self.keep_alive = False
        with contextlib.suppress(_Closed):
            await self.connection.refuse(exc)

    def _drainable(self) -> bool:
        """Whether the unread rest of the body is worth reading to keep the
        connection (a client still waiting for ``100 Continue`` sends none)."""
        return not self.expect_continue and (self.chunked or self.declared <= DRAIN_BYTES)

    async def _drain(self) -> None:
        """Read and drop the rest of the request body (see ``DRAIN_BYTES``)."""
        drained = 0
        with trio.move_on_after(DRAIN_SECS):
            while not self.body_done and drained <= DRAIN_BYTES:
                try:
                    drained += len(await self._read_body())
                except (_Closed, BadRequest):
                    return

    def _parse_head(self) -> None:
        """Check the head for what llhttp leaves to the server (RFC 9112
        §3.2, §6.1, RFC 9110 §10.1.1), and read its method and target."""
        request = self.request
        version = request.version
        if version not in _VERSIONS:
            raise BadRequest(505, "http_version_not_supported", "only HTTP/1.1 and HTTP/1.0 are served")
        connection = self.connection
        if connection.error is not None and not connection.events:
            # llhttp refused this head as it ended (say, a Transfer-Encoding
            # that is not chunked) or the body's first bytes
            raise connection.error
        hosts = 0
        transfer_encoding: bytes | None = None
        for name, value in request.headers:
            if name == b"host":
                hosts += 1
            elif name == b"content-length":
                self.declared = int(value)  # llhttp allows one, of digits only
            elif name == b"transfer-encoding":
                transfer_encoding = value.lower()  # llhttp allows one, ending in chunked
            elif name == b"expect":
                if value.lower() != b"100-continue":
                    raise BadRequest(417, "expectation_failed", "only Expect: 100-continue is understood")
                self.expect_continue = version == "1.1"
        if hosts > 1 or (hosts == 0 and version == "1.1"):
            raise BadRequest(400, "bad_request", "an HTTP/1.1 request needs exactly one Host header")
        if transfer_encoding is not None:
            if version == "1.0":
                # RFC 9112 §6.1: its framing is to be treated as faulty
                raise BadRequest(400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request")
            if transfer_encoding != b"chunked":
                raise BadRequest(501, "not_implemented", "only the chunked transfer coding is understood")
            self.chunked = True
        if request.upgrade and (self.chunked or self.declared):
            # llhttp leaves the body of an upgrade request unparsed
            raise BadRequest(400, "bad_request", "a request to switch protocols cannot carry a body here")
        events = connection.events
        if events and events[0][0] == END:  # no body: its end came with the head
            events.popleft()
            self.body_done = True
            self.expect_continue = False
        try:
            url = httptools.parse_url(request.target)
        except httptools.HttpParserInvalidURLError:
            raise BadRequest(400, "bad_request", "malformed request target") from None
        self.method = method = request.method.decode("ascii")
        self.head_only = method == "HEAD"
        self.raw_path = url.path or b"/"
        path = self.raw_path.decode("ascii")
        self.path = unquote(path) if "%" in path else path
        self.query_string = url.query or b""

    def _scope(self) -> dict[str, Any]:
        """The request's ASGI scope."""
        connection = self.connection
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": self.request.version,
            "method": self.method,
            "scheme": "http",
            "path": self.path,
            "raw_path": self.raw_path,
            "query_string": self.query_string,
            "root_path": "",
            "headers": self.request.headers,
            "client": self.client,
            "server": connection.local,
            "extensions": {},
            "state": dict(connection.server.state),
        }

    def header(self, name: bytes) -> str | None:
        """The first value of the request's header *name* (lower case)."""
        for key, value in self.request.headers:
            if key == name:
                return value.decode("latin-1")
        return None

    @property
    def client(self) -> tuple[str, int] | None:
        """The client: the peer, or, when the peer is a trusted proxy, the
        address the proxies name in ``X-Forwarded-For`` (the rightmost that
        is not itself a trusted proxy)."""
        peer = self.connection.peer
        server = self.connection.server
        if peer is None or not server.trusted(peer[0]):
            return peer
        forwarded = b",".join(value for name, value in self.request.headers if name == b"x-forwarded-for")
        for item in reversed(forwarded.split(b",")):
            host = item.strip().decode("latin-1")
            try:
                ipaddress.ip_address(host)
            except ValueError:
                break  # not an address: the proxy's own is what is known
            if not server.trusted(host):
                return host, 0
        return peer

    # -- the request body -------------------------------------------------

    async def read_chunk(self) -> tuple[bytes, bool] | None:
        """The next bytes of the body and whether more follow; None when the
        client has gone or the body cannot be read (the answer is then the
        server's). After the body's end, it returns only when the client
        goes."""
        if self.refusal is not None:
            return None
        if not self.body_done:
            try:
                if self.expect_continue:
                    self.expect_continue = False
                    await self._continue()
                body = await self._read_body()
            except BadRequest as exc:
                self.refusal = exc
                return None
            except _Closed:
                return None
            self.body_delivered = self.body_done
            return body, not self.body_done
        if not self.body_delivered:
            self.body_delivered = True
            return b"", False
        await self._wait_for_disconnect()
        return None

    async def wait_disconnect(self) -> None:
        """Return when the client has gone (the body is read and dropped)."""
        while await self.read_chunk() is not None:
            pass

    async def receive(self) -> dict[str, Any]:
        """ASGI's ``receive``."""
        chunk = await self.read_chunk()
        if chunk is None:
            return _DISCONNECT
        return {"type": "http.request", "body": chunk[0], "more_body": chunk[1]}

    async def _continue(self) -> None:
        """Send ``100 Continue`` if the client waits for it: not once the
        body has begun to arrive, and never once the answer has begun (the
        answer's first write waits for this one)."""
        if self.started or self.connection.events:
            return
        self.continuing = trio.Event()
        try:
            await self.connection.write(_CONTINUE)
        finally:
            self.continuing.set()

    async def _read_body(self) -> bytes:
        """The body bytes parsed so far, reading more if there are none;
        sets ``body_done`` at the request's end.

        Raises:
            BadRequest: the body is malformed, too large or too slow.
            _Closed: the client went away.
        """
        events = self.connection.events
        while not events:
            await self._fill()
        parts = []
        while events:
            kind, value = events.popleft()
            if kind == END:  # a request's events end with its end
                self.body_done = True
                break
            parts.append(value)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _fill(self) -> None:
        """Read and parse more of the body, at the minimum rate (see
        ``BODY_MIN_RATE``)."""
        connection = self.connection
        if connection.error is not None:
            raise connection.error
        if not connection.readable:
            raise _Closed
        began = trio.current_time()
        data = None
        with trio.move_on_at(began + BODY_WINDOW_SECS - self.waited):
            data = await connection._receive()
        if data is None:
            raise BadRequest(408, "request_timeout", "the request body came too slowly")
        if not data:
            raise _Closed
        self.waited += trio.current_time() - began
        self.window_bytes += len(data)
        if self.window_bytes >= BODY_MIN_RATE * BODY_WINDOW_SECS:
            self.waited = 0.0
            self.window_bytes = 0
        events = len(connection.events)
        connection.feed(data)
        # Bytes that bring no body (a chunk's size line and extensions, the
        # trailer section) are bounded as a head is: llhttp keeps no limit.
        if len(connection.events) > events:
            self.framing = 0
        else:
            self.framing += len(data)
            if self.framing > MAX_HEAD_BYTES:
                raise BadRequest(
                    431, "headers_too_large", "the request's chunk framing or trailer section is too large"
                )

    async def _wait_for_disconnect(self) -> None:
        """Return when the client has gone (or the answer is complete);
        bytes it sends meanwhile are parsed and kept for the next request."""
        connection = self.connection
        read = 0
        while not self.complete and connection.readable:
            if read > MAX_HEAD_BYTES:
                await trio.sleep_forever()  # enough kept; the answer ends this wait
            data = await connection._receive()
            read += len(data)
            if data:
                connection.feed(data)
        if not (self.complete or connection.eof):
            # the parser has stopped (an error, an upgrade): the socket is
            # no longer read, and the client may still be there
            await trio.sleep_forever()

    # -- the answer -------------------------------------------------------

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Answer with *status*, *headers* and all of *body*."""
        self._start(status, headers)
        await self._send_body(body, False)

    async def send(self, message: dict[str, Any]) -> None:
        """ASGI's ``send``."""
        kind = message["type"]
        if kind == "http.response.start":
            self._start(message["status"], list(message.get("headers", ())))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        await self._send_body(message.get("body", b""), message.get("more_body", False))

    def _start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self.started:
            raise RuntimeError("http.response.start sent twice")
        self.started = True
        self.status = status
        self.headers = headers

    async def _send_body(self, body: bytes, more: bool) -> None:
        if not self.started or self.complete:
            raise RuntimeError("http.response.body out of order")
        if not more:
            self.complete = True
        if self.refusal is not None and not self.head_sent:
            return  # the refusal is the answer
        if self.continuing is not None:
            await self.continuing.wait()
        head = b""
        if not self.head_sent:
            head = self._head(len(body), more)
            self.head_sent = True
        try:
            await self._write_framed(head, body, more)
        except _Closed:
            pass  # the client is gone; the application need not care

    async def _write_framed(self, head: bytes, body: bytes, more: bool) -> None:
        if self.head_only or self.status in NO_BODY_STATUS or self.status < 200:
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
        server = self.connection.server
        framing = response_head(
            self.status,
            self.headers,
            first_body=first_body,
            more=more,
            head_only=self.head_only,
            version=self.request.version,
            keep_alive=self.keep_alive and not server.closing and (self.body_done or self._drainable()),
            date=_date(),
        )
        self.keep_alive = framing.keep_alive
        self.out_left = framing.length
        self.out_chunked = framing.chunked
        return framing.head


# The name the fault-injection tests patch its phases under.
_Exchange = Exchange


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
    max_body_bytes: int = 1 << 20,
    max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
    trusted_proxies: Sequence[str] = (),
    front: Front | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* on *host*:*port* until *shutdown_trigger* returns, then
    stop accepting, close idle connections, and give requests in flight
    *graceful_timeout_secs* to finish.

    At most *max_connections* are served at once (by default the process's
    limit on open files, less ``RESERVED_FDS``). When a client connects
    past that, the longest idle connection is closed to make room; with none
    idle, the client is answered 503 at once (up to ``MAX_REFUSING`` at a
    time; more wait in the listen backlog). At most
    *max_connections_per_address* are served at once from one client address
    (an IPv6 client's ``/64``), alike: its own longest idle connection is
    closed, or it is answered 503. Peers in *trusted_proxies* (addresses or
    networks) are not capped by address, and the client address they give in
    ``X-Forwarded-For`` is the request's ``client``.

    A request body and its trailers together are at most *max_body_bytes*
    long (413).

    With a *front*, each request goes to it first, as an :class:`Exchange`:
    it answers what it serves and returns True, or returns False, having
    read nothing, to leave the request to *app*.

    Calls ``task_status.started(urls)`` once listening, with the bound URLs
    (port 0 binds a free port). Raises ``OSError`` if it cannot listen.
    """
    state: dict[str, Any] = {}
    listeners = await trio.open_tcp_listeners(port, host=host.strip("[]") or None)
    server = _Server(
        app,
        state,
        max_connections or _default_max_connections(),
        max_body_bytes,
        max_connections_per_address,
        trusted_proxies,
        front,
    )
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
        address = server.address_of(stream)
        connections.start_soon(server.handle if server.make_room(address) else server.refuse, stream, address)


def _url(listener: trio.SocketListener) -> str:
    host, port = listener.socket.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
