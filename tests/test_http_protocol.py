"""HTTP/1.1 with no socket: what each byte stream a client sends means as
events and where it stops, and how an answer is framed."""

from __future__ import annotations

from typing import Any

import pytest

from qftrio.server.http_protocol import BODY, END, HEAD, MAX_HEAD_BYTES, MAX_HEADERS, Framing, RequestParser, response_head


def parsed(*pieces: bytes, max_body_bytes: int = 1 << 20) -> RequestParser:
    parser = RequestParser(max_body_bytes)
    for piece in pieces:
        parser.feed(piece)
    return parser


def kinds(parser: RequestParser) -> list[int]:
    return [kind for kind, _ in parser.events]


def test_a_request_fed_byte_by_byte_is_one_head_its_body_and_its_end() -> None:
    raw = b"POST /a?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nX-Pad:  v \r\n\r\nhello"
    parser = parsed(*(raw[i : i + 1] for i in range(len(raw))))
    assert parser.error is None
    assert kinds(parser)[0] == HEAD and kinds(parser)[-1] == END
    head = parser.events[0][1]
    assert (head.method, head.target, head.version, head.keep_alive) == (b"POST", b"/a?x=1", "1.1", True)
    # names lower-cased, values stripped of trailing blanks
    assert head.headers == [(b"host", b"h"), (b"content-length", b"5"), (b"x-pad", b"v")]
    assert b"".join(value for kind, value in parser.events if kind == BODY) == b"hello"


def test_pipelined_requests_come_out_in_order() -> None:
    parser = parsed(b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    heads = [value for kind, value in parser.events if kind == HEAD]
    assert [h.target for h in heads] == [b"/1", b"/2"]
    assert [h.keep_alive for h in heads] == [True, False]
    assert kinds(parser) == [HEAD, END, HEAD, END]


def test_a_chunked_body_is_its_chunks_and_trailers_count_toward_the_cap() -> None:
    parser = parsed(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert b"".join(v for k, v in parser.events if k == BODY) == b"abcde" and kinds(parser)[-1] == END
    over = parsed(
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 12345\r\n\r\n",
        max_body_bytes=8,
    )
    assert over.error is not None and over.error.status == 413


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        # both framings at once: the request smuggling no strict parser lets through
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
        (b"GET / HTTP/1.1\r\nHost: h\r\nX: a\nb\r\n\r\n", 400),  # a bare LF
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n", 431),
        (b"GET / HTTP/1.1\r\nX: " + b"v" * MAX_HEAD_BYTES + b"\r\n\r\n", 431),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world", 413),
    ],
)
def test_a_fault_stops_the_parser_after_the_events_before_it(raw: bytes, status: int) -> None:
    parser = parsed(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n" + raw, max_body_bytes=10)
    assert parser.error is not None and parser.error.status == status
    assert parser.events[0][1].target == b"/first" and kinds(parser)[:2] == [HEAD, END]
    more = len(parser.events)
    parser.feed(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
    assert parser.error.status == status and len(parser.events) == more  # nothing read past it


def test_an_upgrade_stops_the_parsing() -> None:
    parser = parsed(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\nnot http")
    assert parser.upgraded and parser.events[0][1].upgrade


def head(status: int = 200, headers: list[tuple[bytes, bytes]] | None = None, **options: Any) -> Framing:
    given: dict[str, Any] = dict(first_body=5, more=False, head_only=False, version="1.1", keep_alive=True, date=b"D")
    given.update(options)
    return response_head(status, headers or [], **given)


def test_an_answer_is_framed_by_the_server() -> None:
    whole = head(headers=[(b"Content-Type", b"x"), (b"Transfer-Encoding", b"gzip"), (b"Date", b"old")])
    assert whole.head == b"HTTP/1.1 200 OK\r\ncontent-type: x\r\ncontent-length: 5\r\ndate: D\r\n\r\n"
    assert (whole.length, whole.chunked, whole.keep_alive) == (5, False, True)
    streamed = head(more=True)
    assert streamed.chunked and streamed.length is None and b"transfer-encoding: chunked" in streamed.head
    # HTTP/1.0 has no chunks: the body ends with the connection
    old = head(more=True, version="1.0")
    assert not old.chunked and not old.keep_alive and b"connection: close" in old.head
    assert b"connection: keep-alive" in head(version="1.0").head
    assert not head(headers=[(b"Connection", b"close")]).keep_alive
    assert b"content-length" not in head(204).head and head(204).length is None
    assert b"connection: close" in head(keep_alive=False).head


def test_a_line_break_in_an_answer_s_header_is_refused() -> None:
    for name, value in ((b"x", b"a\r\nset-cookie: evil"), (b"x\n", b"v")):
        with pytest.raises(RuntimeError):
            head(headers=[(name, value)])
