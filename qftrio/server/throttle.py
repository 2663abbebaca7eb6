"""Throttling failed credentials per client address: a token bucket each.

Each address starts with ``burst`` tokens; a failed credential takes one, and
one comes back every ``refill_secs``. While an address has none, its
credentials are not even checked: it is answered ``429`` with the time until
its next token (``Retry-After``). A bucket that has filled up again is the
same as no bucket, so it is forgotten; the table holds at most
``max_addresses`` buckets, the least recently failing forgotten first, so the
memory it takes is bounded however many addresses fail.

An IPv6 client is keyed by its ``/64`` (one host's usual share), so that a
caller cannot make a new bucket, or a new connection count, by moving
through the addresses of its own network.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import ipaddress
import math
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Client", "Throttle", "ThrottleFront", "client_key", "client_of", "current_client", "retry_after_header", "route_of"]

#: The client of a request, as the server's front saw it: the address
#: limits count by (:func:`client_key`), the request's ASGI scope, and the
#: seconds the address must wait before its next credential is checked (None:
#: it may be checked now), decided once per request. A plain tuple: one is
#: made for every request.
Client = tuple[str, dict[str, Any], float | None]


def route_of(scope: dict[str, Any]) -> str:
    """``METHOD /path`` for a log, the path as sent (percent-escapes kept, so
    that no line break reaches the log) and cut short."""
    path = scope.get("raw_path") or scope["path"].encode("utf-8", "replace")
    return f"{scope['method']} {path[:200].decode('ascii', 'replace')}"


#: The client of the request being served: set by the API's front
#: (:class:`~qftrio.server.front.ApiFront`) and, for the dashboard, by
#: :class:`ThrottleFront`; read where a credential is checked
#: (:mod:`qftrio.server.auth`).
current_client: contextvars.ContextVar[Client | None] = contextvars.ContextVar("qftrio_current_client", default=None)


@functools.lru_cache(maxsize=4096)  # once per client, not per request
def client_key(host: str) -> str:
    """The address that limits count by: *host* itself, or for IPv6 its
    ``/64``; a host that is not an IP address (a Unix socket) as given."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class Throttle:
    """Token buckets of failures, by address.

    Args:
        burst: failures an address may have at once before it is throttled.
        refill_secs: one failure forgiven every this many seconds.
        max_addresses: buckets kept at most.
        clock: monotonic seconds (Trio's clock in tests).
    """

    def __init__(
        self,
        *,
        burst: int = 20,
        refill_secs: float = 3.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill_secs = refill_secs
        self.max_addresses = max_addresses
        self._clock = clock
        #: address → (tokens left, when they were counted), the least
        #: recently failing first.
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _tokens(self, address: str, now: float) -> float:
        entry = self._buckets.get(address)
        if entry is None:
            return float(self.burst)
        tokens, at = entry
        return min(float(self.burst), tokens + (now - at) / self.refill_secs)

    def retry_after(self, address: str) -> float | None:
        """Seconds until *address* may try a credential again; None if it may now."""
        if address not in self._buckets:  # nearly every request
            return None
        tokens = self._tokens(address, self._clock())
        if tokens >= 1:
            return None
        return (1 - tokens) * self.refill_secs

    def fail(self, address: str) -> None:
        """Take a token from *address* for a failed credential."""
        now = self._clock()
        tokens = max(0.0, self._tokens(address, now) - 1)
        self._buckets[address] = (tokens, now)
        self._buckets.move_to_end(address)
        self._forget(now)

    def _forget(self, now: float) -> None:
        """Drop the buckets that are full again (from the least recently
        failing, until one is not), then the oldest while over the cap."""
        buckets = self._buckets
        while buckets:
            address, (tokens, at) = next(iter(buckets.items()))
            if tokens + (now - at) / self.refill_secs < self.burst and len(buckets) <= self.max_addresses:
                break
            del buckets[address]


def client_of(throttle: Throttle, host: str, where: dict[str, Any]) -> Client:
    """The :data:`Client` of a request from *host* (the HTTP server has
    already taken it from a trusted proxy's ``X-Forwarded-For``) to *where*
    (its method and paths), with whether its address is throttled."""
    address = client_key(host)
    return address, where, throttle.retry_after(address)


def retry_after_header(wait: float) -> tuple[bytes, bytes]:
    """The ``Retry-After`` of a ``429`` to an address throttled for *wait* seconds."""
    return b"retry-after", str(math.ceil(wait)).encode()


class ThrottleFront:
    """An ASGI app around *app* (the dashboard's): each request's client is
    :data:`current_client` while *app* answers it (:func:`client_of`); a
    ``429`` answer to a throttled address gets ``Retry-After``, whichever
    page gave it."""

    def __init__(self, app: Any, throttle: Throttle) -> None:
        self.app = app
        self.throttle = throttle

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope.get("client"):
            await self.app(scope, receive, send)
            return
        client = client_of(self.throttle, scope["client"][0], scope)
        wait = client[2]
        if wait is not None:
            retry_after = retry_after_header(wait)
            plain_send = send

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start" and message["status"] == 429:
                    headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"retry-after"]
                    message = {**message, "headers": [*headers, retry_after]}
                await plain_send(message)

        reset = current_client.set(client)
        try:
            await self.app(scope, receive, send)
        finally:
            current_client.reset(reset)
