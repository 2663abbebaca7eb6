"""A TCP proxy in front of a test's server that sees what a client sends.

It parses both directions with httptools to pair each answer with its
request (qftrio's clients send one request at a time per connection),
records every request (target, body, the answer's status and body), and can
make the network fail: refuse a request (its connection closed before the
server sees it), lose an answer (the server acted, the client sees its
connection closed), or be down (every connection refused, those open cut).
The conformance suite and the fault suite both use it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
from collections.abc import Callable

import httptools
import trio

__all__ = ["Proxy", "Seen"]


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


@dataclasses.dataclass
class Seen:
    """One request the proxy read, with its answer once it came."""

    at: float  # trio.current_time() when it was read
    target: str
    body: bytes
    refused: bool = False
    status: int | None = None
    answer: bytes = b""
    answered_at: float | None = None
    dropped: bool = False


class Proxy:
    """Forward ``127.0.0.1:<port>`` to *upstream_port*.

    ``refuse(target, body)`` picks requests that never reach the server;
    ``drop(target, body, answer)`` picks those whose answer is lost (the
    answer's body given); ``down`` refuses every connection. ``seen`` lists
    every request read, ``attempts`` the time of every connection made to it,
    ``dropped`` the targets whose answers were lost.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.refuse: Callable[[str, bytes], bool] = lambda target, body: False
        self.drop: Callable[[str, bytes, bytes], bool] = lambda target, body, answer: False
        self.seen: list[Seen] = []
        self.attempts: list[float] = []
        self._down = False
        self._open: set[trio.CancelScope] = set()
        self._changed = trio.Event()

    @property
    def dropped(self) -> list[str]:
        return [s.target for s in self.seen if s.dropped]

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, down: bool) -> None:
        self._down = down
        if down:
            for scope in self._open:
                scope.cancel()

    async def wait_for(self, check: Callable[[], bool], *, timeout: float = 30) -> None:
        """Wait until *check* holds, tried after each request or connection.
        The cap only turns a hang into a failure."""
        try:
            with trio.fail_after(timeout):
                while not check():
                    await self._changed.wait()
        except trio.TooSlowError:
            targets = [(s.target, s.status) for s in self.seen[-20:]]
            raise AssertionError(f"still waiting after {timeout}s; the last requests: {targets}") from None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(url)``."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(trio.serve_listeners, self._connection, listeners))
            task_status.started(f"http://127.0.0.1:{port}")

    async def _connection(self, client: trio.SocketStream) -> None:
        self.attempts.append(trio.current_time())
        self._notify()
        if self._down:
            await client.aclose()
            return
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        except OSError:
            await client.aclose()
            return
        requests = _Requests()
        waiting: list[Seen] = []  # forwarded, not answered yet
        with trio.CancelScope() as scope:
            self._open.add(scope)
            try:
                async with client, upstream, trio.open_nursery() as nursery:

                    async def to_server() -> None:
                        parser = httptools.HttpRequestParser(requests)
                        raw = b""
                        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                            async for data in client:
                                raw += data
                                parser.feed_data(data)
                                if not requests.pending:
                                    continue
                                # A client sends one request at a time on a
                                # connection: what was read is that request.
                                now = trio.current_time()
                                batch = [Seen(now, target, body) for target, body in requests.pending]
                                requests.pending.clear()
                                self.seen += batch
                                self._notify()
                                if any(self.refuse(s.target, s.body) for s in batch):
                                    for s in batch:
                                        s.refused = True
                                    break
                                waiting.extend(batch)
                                await upstream.send_all(raw)
                                raw = b""
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
                                seen = waiting.pop(0)
                                seen.status, seen.answer = parser.get_status_code(), answers.body
                                seen.answered_at = trio.current_time()
                                if self.drop(seen.target, seen.body, seen.answer):
                                    seen.dropped = True
                                    self._notify()
                                    break  # both connections close, the answer unsent
                                self._notify()
                                await client.send_all(raw)
                                raw, answers.body, answers.complete = b"", b"", False
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(to_server)
                    nursery.start_soon(to_client)
            finally:
                self._open.discard(scope)
