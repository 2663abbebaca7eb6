"""HTTP/1.1 with no I/O: requests parsed from bytes, answers' heads framed.

:class:`RequestParser` is fed the bytes a client sends (:meth:`~RequestParser.feed`)
and queues what they mean, in order: a request's head, its body's bytes,
its end. It does no I/O and keeps no time: the connection loop of
:mod:`qftrio.server.http11` reads the socket, feeds it, and serves the
events, and a test feeds it bytes alone.

The framing is parsed by llhttp (Node.js's parser, through ``httptools``)
with every leniency off; this object adds the limits llhttp does not keep
(the head's size and its number of fields, the body's size) and stops at
the first fault, which it keeps as :attr:`~RequestParser.error` after the
events before it.

:func:`response_head` frames an answer: its head, and whether it is sent
with a ``Content-Length``, chunked, or until the connection closes.
"""

from __future__ import annotations

import collections
from http import HTTPStatus
from typing import Any, NamedTuple

import httptools

__all__ = [
    "BadRequest", "Framing", "Request", "RequestParser", "response_head",
    "HEAD", "BODY", "END", "MAX_HEAD_BYTES", "MAX_HEADERS", "NO_BODY_STATUS", "REASONS",
]  # fmt: skip

#: A request head (the leading empty lines a client may send before it
#: included) is at most this long and holds at most ``MAX_HEADERS`` fields;
#: so is the framing between a chunked body's bytes (a chunk's size line and
#: extensions, the trailer section). Trailers count toward the body cap.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100

REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
NO_BODY_STATUS = frozenset({204, 304})

# The parser's events, queued in order: a request head, body bytes, the end
# of a request.
HEAD, BODY, END = range(3)


class BadRequest(Exception):
    """A request the server refuses: its status, code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class Request(NamedTuple):
    """A request head, as the parser delivered it."""

    method: bytes
    target: bytes
    version: str
    headers: list[tuple[bytes, bytes]]
    keep_alive: bool
    upgrade: bool


class RequestParser:
    """A client's bytes parsed into requests. The parser's callbacks (the
    ``on_*`` methods) run inside :meth:`feed` and only queue events or
    raise :class:`BadRequest`."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.parser = httptools.HttpRequestParser(self)
        # every leniency is off by default; say so, so that a later default
        # cannot turn one on unseen
        self.parser.set_dangerous_leniencies(
            lenient_headers=False,
            lenient_chunked_length=False,
            lenient_keep_alive=False,
            lenient_transfer_encoding=False,
            lenient_version=False,
            lenient_data_after_close=False,
            lenient_optional_lf_after_cr=False,
            lenient_optional_cr_before_lf=False,
            lenient_optional_crlf_after_chunk=False,
            lenient_spaces_after_chunk_size=False,
        )
        self.events: collections.deque[tuple[int, Any]] = collections.deque()
        #: Why the parser stopped: nothing after the queued events can be read.
        self.error: BadRequest | None = None
        #: The parser saw an upgrade request (or CONNECT); what follows it is
        #: not HTTP, and is not read.
        self.upgraded = False
        # the message being parsed
        self.begun = False
        self.in_head = False
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.body_bytes = 0

    # -- the parser's callbacks ---------------------------------------------

    def on_message_begin(self) -> None:
        self.begun = self.in_head = True
        self.target = b""
        self.headers = []
        self.head_bytes = self.body_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.target += url
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + 4  # ": " and CRLF
        if self.in_head:
            self.head_bytes += size
            if self.head_bytes > MAX_HEAD_BYTES:
                raise BadRequest(431, "headers_too_large", "the request head is too large")
            if len(self.headers) >= MAX_HEADERS:
                raise BadRequest(431, "headers_too_large", "the request has too many header fields")
            self.headers.append((name.lower(), value.rstrip(b" \t")))
        else:  # a trailer field: llhttp has checked its syntax, and drops it
            self._count_body(size)

    def on_headers_complete(self) -> None:
        parser = self.parser
        self.in_head = False
        self.events.append(
            (
                HEAD,
                Request(
                    parser.get_method(),
                    self.target,
                    parser.get_http_version(),
                    self.headers,
                    parser.should_keep_alive(),
                    parser.should_upgrade(),
                ),
            )
        )

    def on_body(self, body: bytes) -> None:
        self._count_body(len(body))
        self.events.append((BODY, body))

    def on_message_complete(self) -> None:
        self.begun = False
        self.events.append((END, None))

    def _count_body(self, size: int) -> None:
        self.body_bytes += size
        if self.body_bytes > self.max_body_bytes:
            raise BadRequest(
                413, "payload_too_large", f"the request body is larger than {self.max_body_bytes} bytes"
            )

    def feed(self, data: bytes) -> None:
        """Parse *data*: its events are queued, a fault kept in ``error``.
        Nothing past a fault or an upgrade is read."""
        if self.error is not None or self.upgraded:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.upgraded = True
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, BadRequest):
                raise exc.__context__ or exc  # a fault of the callbacks, not of the request
            self.error = exc.__context__
        except httptools.HttpParserError as exc:
            self.error = BadRequest(400, "bad_request", f"malformed request: {exc}")


class Framing(NamedTuple):
    """An answer's head and how its body is framed."""

    head: bytes
    #: The body's length, when a ``Content-Length`` frames it.
    length: int | None
    chunked: bool
    #: Whether the connection carries another request after it.
    keep_alive: bool


def response_head(
    status: int,
    headers: list[tuple[bytes, bytes]],
    *,
    first_body: int,
    more: bool,
    head_only: bool,
    version: str,
    keep_alive: bool,
    date: bytes,
) -> Framing:
    """Frame an answer of *status* and *headers* whose first part of the body
    is *first_body* bytes long (*more*: others follow), to a request of HTTP
    *version* (a ``HEAD`` with *head_only*) on a connection that may carry
    another request (*keep_alive*). The framing is the server's to choose: a
    ``Content-Length`` given is kept, ``Transfer-Encoding`` and ``Date``
    given are replaced.

    Raises:
        RuntimeError: a header holds a line break.
    """
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b""))]
    length: int | None = None
    out_left: int | None = None
    chunked = False
    for name, value in headers:
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
                keep_alive = False
            continue
        elif name == b"date":
            continue
        lines.append(b"%s: %s\r\n" % (name, value))
    if status in NO_BODY_STATUS or status < 200:
        if length is not None and status == 304:
            lines.append(b"content-length: %d\r\n" % length)
    elif length is not None:
        lines.append(b"content-length: %d\r\n" % length)
        out_left = length
    elif not more:
        lines.append(b"content-length: %d\r\n" % first_body)
        out_left = first_body
    elif head_only:
        pass
    elif version == "1.1":
        lines.append(b"transfer-encoding: chunked\r\n")
        chunked = True
    else:
        keep_alive = False  # the body ends where the connection does
    if not keep_alive:
        lines.append(b"connection: close\r\n")
    elif version == "1.0":
        lines.append(b"connection: keep-alive\r\n")  # HTTP/1.0 closes by default
    lines.append(b"date: %s\r\n\r\n" % date)
    return Framing(b"".join(lines), out_left, chunked, keep_alive)
