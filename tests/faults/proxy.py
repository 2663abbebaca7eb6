"""A TCP proxy that loses answers: the server receives the request and acts
on it, and the client sees its connection closed instead of the answer.

It parses both directions with httptools to pair each answer with its
request (clients of qftrio send one request at a time per connection), so
that a test can choose which answers to lose by the request's target and the
answer's body.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable

import httptools
import trio

__all__ = ["AnswerDroppingProxy"]

#: ``drop(target, request_body, answer_body)``: whether to lose that answer
#: to a request for *target* (path and query).
DropRule = Callable[[str, bytes, bytes], bool]


class _Requests:
    """httptools callbacks: the target and body of each request read so
    far, oldest first, each added once the request is complete."""

    def __init__(self) -> None:
        self.pending: collections.deque[tuple[str, bytes]] = collections.deque()
        self._url = b""
        self._body = b""

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.pending.append((self._url.decode("latin-1"), self._body))
        self._url = self._body = b""


class _Answers:
    """httptools callbacks: each complete answer's raw bytes and body."""

    def __init__(self) -> None:
        self.body = b""
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


class AnswerDroppingProxy:
    """Forward ``127.0.0.1:<port>`` to *upstream_port*, losing the answers
    *drop* picks. ``dropped`` lists the targets whose answers were lost."""

    def __init__(self, upstream_port: int, drop: DropRule) -> None:
        self.upstream_port = upstream_port
        self.drop = drop
        self.dropped: list[str] = []

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(url)``."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(trio.serve_listeners, self._connection, listeners))
            task_status.started(f"http://127.0.0.1:{port}")

    async def _connection(self, client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        except OSError:
            await client.aclose()
            return
        requests = _Requests()
        async with client, upstream, trio.open_nursery() as nursery:
            # Either side going away ends the connection, as it would
            # without the proxy.

            async def to_server() -> None:
                parser = httptools.HttpRequestParser(requests)
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    async for data in client:
                        parser.feed_data(data)
                        await upstream.send_all(data)
                nursery.cancel_scope.cancel()

            async def to_client() -> None:
                answers = _Answers()
                parser = httptools.HttpResponseParser(answers)
                raw = b""
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    async for data in upstream:
                        raw += data
                        parser.feed_data(data)
                        if not answers.complete:
                            continue
                        target, request_body = requests.pending.popleft()
                        if self.drop(target, request_body, answers.body):
                            self.dropped.append(target)
                            break  # both connections close, the answer unsent
                        await client.send_all(raw)
                        raw, answers.body, answers.complete = b"", b"", False
                nursery.cancel_scope.cancel()

            nursery.start_soon(to_server)
            nursery.start_soon(to_client)
