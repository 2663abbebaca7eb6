"""The API's front: every route, found by one :class:`Router` and answered in
one :class:`Envelope`, straight from the HTTP server's
:class:`~qftrio.server.http11.Exchange`.

Its routes are the API (:data:`~qftrio.server.api.ALL_ROUTES`) and the
server's pages: ``/metrics``, ``/openapi.json`` (built from the routes) and
``/docs``. A method a declared path does not allow is answered ``405`` with
``Allow``. A path it does not declare is left to the ASGI application (the
dashboard, and the ``404`` of every other path).

Each request's client (the HTTP server has already taken it from a trusted
proxy's ``X-Forwarded-For``) is :data:`~qftrio.server.throttle.current_client`
while it is answered, with whether its address is throttled; a ``429``
answer to a throttled address gets ``Retry-After``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST

from .. import errors
from .._batching import Batcher
from .._json import dumps as json_dumps
from .api import ALL_ROUTES
from .auth import Credentials
from .docs_page import DOCS_PAGE
from .engine import Engine
from .envelope import Answer, Call, Disconnected, Envelope, Reply, Route, Router, Stream
from .http11 import Exchange
from .openapi import document
from .throttle import Throttle, client_of, current_client, retry_after_header

__all__ = ["ApiFront"]

log = logging.getLogger("qftrio.server")

_JSON = (b"content-type", b"application/json")


class ApiFront:
    """The :data:`~qftrio.server.http11.Front` of qftrio's HTTP server."""

    def __init__(self, engine: Engine, credentials: Credentials, throttle: Throttle, *, max_body_bytes: int) -> None:
        self.document = b""
        routes = [*ALL_ROUTES, *_pages(engine, lambda: self.document)]
        # built once: the routes do not change
        self.document = json_dumps(document(routes))
        self.router = Router(routes)
        self.envelope = Envelope(engine, credentials, max_body_bytes=max_body_bytes)
        self.throttle = throttle

    async def __call__(self, exchange: Exchange) -> bool:
        found = self.router.match(exchange.method, exchange.path)
        if found is None:
            return False
        peer = exchange.client
        wait = None
        reset = None
        if peer is not None:
            where = {"method": exchange.method, "path": exchange.path, "raw_path": exchange.raw_path}
            client = client_of(self.throttle, peer[0], where)
            wait = client[2]
            reset = current_client.set(client)
        try:
            if isinstance(found, list):
                err = errors.ApiError(f"{exchange.method} is not allowed here", code="method_not_allowed")
                await _respond(exchange, wait, 405, err.to_wire(), headers=[(b"allow", ", ".join(found).encode())])
            else:
                await self._serve(exchange, wait, *found)
        finally:
            if reset is not None:
                current_client.reset(reset)
        return True

    async def _serve(self, exchange: Exchange, wait: float | None, route: Route, params: dict[str, str]) -> None:
        async def receive_chunk() -> tuple[bytes, bool]:
            chunk = await exchange.read_chunk()
            if chunk is None:
                raise Disconnected
            return chunk

        try:
            call = await self.envelope.prepare(
                route,
                params,
                authorization=exchange.header(b"authorization"),
                content_length=exchange.header(b"content-length"),
                query_string=exchange.query_string,
                receive_chunk=receive_chunk,
            )
        except Disconnected:
            return  # nobody to answer
        except Exception as exc:
            await _respond_with(exchange, wait, self.envelope.refusal(route, exc))
            return
        if route.waits is not None and route.waits(call):
            # A long poll is abandoned if its client goes away. Its answer is
            # sent from inside the watch, so that it leaves before the watch
            # is torn down.
            try:
                await _unless_disconnected(self._answer(exchange, wait, route, call), exchange)
            except Disconnected:
                pass
            return
        await self._answer(exchange, wait, route, call)

    async def _answer(self, exchange: Exchange, wait: float | None, route: Route, call: Call) -> None:
        answer = await self.envelope.run(route, call)
        if isinstance(answer.payload, Stream):
            await self._stream(exchange, wait, route, answer.payload)
            return
        if route.media is not None and 200 <= answer.status < 300:
            payload = answer.payload
            await exchange.respond(answer.status, [(b"content-type", route.media.encode()), (b"content-length", b"%d" % len(payload))], payload)
            return
        await _respond_with(exchange, wait, answer)


    async def _stream(self, exchange: Exchange, wait: float | None, route: Route, stream: Stream) -> None:
        """Write *stream* as its chunks come (chunked); the head goes with
        the first. An error before it is answered as any route's."""
        assert route.media is not None
        media = route.media.encode()

        async def write(chunk: bytes) -> bool:
            if not exchange.head_sent:
                exchange.start(200, [(b"content-type", media), (b"cache-control", b"no-store"), (b"x-accel-buffering", b"no")])
            await exchange.write_chunk(chunk)
            return not exchange.gone

        try:
            await stream.run(write)
        except Exception as exc:
            if exchange.head_sent:
                log.exception("a stream failed: %s %s", route.method, route.path)
            else:
                await _respond_with(exchange, wait, self.envelope.refusal(route, exc))
                return
        finally:
            stream.close()
        if not exchange.head_sent:  # the server closed before the stream began
            await _respond_with(exchange, wait, self.envelope.refusal(route, errors.Unavailable("the server is shutting down")))
            return
        await exchange.end_chunks()


async def _respond_with(exchange: Exchange, wait: float | None, answer: Answer) -> None:
    """:func:`_respond` with *answer*; its own ``Retry-After`` before the
    throttle's."""
    retry = answer.retry_after if answer.retry_after is not None else wait
    await _respond(exchange, retry, answer.status, answer.payload, answer.close)


async def _respond(
    exchange: Exchange,
    wait: float | None,
    status: int,
    payload: Any,
    close: bool = False,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer with *payload* as JSON (None: no body)."""
    headers = list(headers or ())
    if close:
        headers.append((b"connection", b"close"))
    if status == 429 and wait is not None:
        headers.append(retry_after_header(wait))
    if payload is None:
        await exchange.respond(status, headers, b"")
        return
    body = json_dumps(payload)
    headers += [_JSON, (b"content-length", b"%d" % len(body))]
    await exchange.respond(status, headers, body)


async def _unless_disconnected(call: Awaitable[None], exchange: Exchange) -> None:
    """Await *call*; abandon it if the client disconnects meanwhile (a long
    poll must not claim jobs for a caller that is gone)."""
    done = False
    failed: list[Exception] = []

    async def watch(cancel_scope: trio.CancelScope) -> None:
        await exchange.wait_disconnect()
        cancel_scope.cancel()

    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, outer)
            try:
                await call
                done = True
            except Exception as exc:
                failed.append(exc)  # raised below, not wrapped in the nursery's group
            nursery.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if not done:
        raise Disconnected


def _pages(engine: Engine, openapi: Callable[[], bytes]) -> list[Route]:
    """The routes of ``/metrics``, ``/openapi.json`` and ``/docs``."""

    async def expose(scrapes: list[None]) -> list[bytes]:
        text = await engine.metrics_exposition()
        return [text] * len(scrapes)

    # Scrapes that come while one reads the store share the next reading:
    # however many scrapers there are, /metrics holds one store connection.
    scrape = Batcher(expose, limit=1, split_on=lambda exc: False)

    async def metrics_route(engine: Engine, call: Call) -> Reply:
        """Prometheus metrics (text); with ``--metrics-token``, for that token only."""
        (text,) = await scrape([None])
        return 200, text

    async def openapi_document(engine: Engine, call: Call) -> Reply:
        return 200, openapi()

    page = DOCS_PAGE.encode()

    async def docs(engine: Engine, call: Call) -> Reply:
        return 200, page

    return [
        Route("GET", "/metrics", metrics_route, "metrics", {200: None}, media=CONTENT_TYPE_LATEST),
        Route("GET", "/openapi.json", openapi_document, "anyone", {200: None}, media="application/json", documented=False),
        Route("GET", "/docs", docs, "anyone", {200: None}, media="text/html; charset=utf-8", documented=False),
    ]
