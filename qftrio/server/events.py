"""The live event stream (``GET /api/v1/events``): every stream open on
this server, fed the store's word of each change of its tenant's jobs
(:attr:`Store.on_event`), with a cap per tenant.

Each stream holds at most ``MAX_BEHIND`` events its client has not taken
(and those of the one write under way, at most ``MAX_WRITE``); one more and
it ends with ``event: overflow``, so that a consumer that reads slowly, or
not at all, holds bounded memory. Nothing is replayed: a
stream sees the changes committed while it is open.
"""

from __future__ import annotations

import collections
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import trio

from .. import errors
from .._json import dumps

__all__ = ["EventStreams", "Subscriber", "chunks", "sse"]


def sse(event: str, data: Any) -> bytes:
    """One server-sent event."""
    return b"event: %s\ndata: %s\n\n" % (event.encode(), dumps(data))


#: The comment a stream sends when it has been quiet this long, for proxies.
KEEPALIVE = b": keep-alive\n\n"

#: The fields of an ``event: job``.
JOB_FIELDS = ("id", "queue", "kind", "status", "attempt", "progress", "at")

#: Events written at most in one write: those ready are taken together, so
#: that a stream holds at most this many beyond its untaken ones.
MAX_WRITE = 256


class Subscriber:
    """One open stream: the events of its tenant's jobs that match its
    filters, in :attr:`receive`; :attr:`overflowed` once it fell behind."""

    __slots__ = ("tenant", "queue", "kind", "job", "behind", "send", "receive", "overflowed", "live")

    def __init__(self, tenant: str, queue: str | None, kind: str | None, job: str | None, behind: int) -> None:
        self.tenant = tenant
        self.queue = queue
        self.kind = kind
        self.job = job
        self.behind = behind
        self.send, self.receive = trio.open_memory_channel[dict[str, Any]](behind)
        self.overflowed = False
        #: Registered in the store and heard: a change committed from now on
        #: reaches it.
        self.live = False

    def matches(self, event: dict[str, Any]) -> bool:
        return (
            (self.queue is None or event["queue"] == self.queue)
            and (self.kind is None or event["kind"] == self.kind)
            and (self.job is None or event["id"] == self.job)
        )

    def offer(self, event: dict[str, Any]) -> None:
        try:
            self.send.send_nowait(event)
        except trio.WouldBlock:
            self.overflow()
        except trio.ClosedResourceError:
            pass

    def overflow(self) -> None:
        self.overflowed = True
        self.send.close()


class EventStreams:
    """Every event stream open on this server, by tenant, at most
    *per_tenant* of one tenant at once (beyond: ``429``, with
    ``Retry-After``)."""

    #: Seconds a caller refused for the cap is told to wait before trying again.
    RETRY_AFTER_SECS = 1
    #: Events a stream's client may leave untaken before the stream ends:
    #: room for the changes of a few commits of 1000 jobs each, which come
    #: at once. The events are shared by the streams that hold them.
    MAX_BEHIND = 4096

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._of_tenant: dict[str, set[Subscriber]] = collections.defaultdict(set)
        self._closed = False

    def __len__(self) -> int:
        return sum(len(streams) for streams in self._of_tenant.values())

    @property
    def live(self) -> int:
        """How many streams are :attr:`Subscriber.live`."""
        return sum(s.live for streams in self._of_tenant.values() for s in streams)

    def open(self, tenant: str, *, queue: str | None, kind: str | None, job: str | None) -> Subscriber:
        """Register a stream; :meth:`close_one` must follow.

        Raises:
            TooManyRequests: *tenant* has ``per_tenant`` streams open here.
            Unavailable: the server is shutting down.
        """
        if self._closed:
            raise errors.Unavailable("the server is shutting down")
        streams = self._of_tenant[tenant]
        if len(streams) >= self.per_tenant:
            raise errors.TooManyRequests(
                f"this tenant has {self.per_tenant} event streams open already", code="too_many_streams",
                retry_after=self.RETRY_AFTER_SECS,
            )  # fmt: skip
        subscriber = Subscriber(tenant, queue, kind, job, self.MAX_BEHIND)
        streams.add(subscriber)
        return subscriber

    def close_one(self, subscriber: Subscriber) -> None:
        streams = self._of_tenant.get(subscriber.tenant)
        if streams is not None:
            streams.discard(subscriber)
            if not streams:
                del self._of_tenant[subscriber.tenant]
        subscriber.send.close()

    def changed(self, event: dict[str, Any]) -> None:
        """The store's word of a change (:attr:`Store.on_event`): offered to
        each matching stream of the job's tenant. ``{"lost": True}``:
        changes may have been missed, and every stream ends with an
        overflow (its client reads what it missed, as after any gap)."""
        if event.get("lost"):
            for streams in self._of_tenant.values():
                for subscriber in streams:
                    subscriber.overflow()
            return
        for subscriber in self._of_tenant.get(event["tenant"], ()):
            if subscriber.matches(event):
                subscriber.offer(event)

    def close(self) -> None:
        """The server is shutting down: every stream ends now."""
        self._closed = True
        for streams in self._of_tenant.values():
            for subscriber in streams:
                subscriber.send.close()


async def chunks(
    subscriber: Subscriber,
    *,
    keepalive_secs: float,
    keep: Callable[[], Awaitable[None]],
    stats_secs: float | None = None,
    stats: Callable[[], Awaitable[list[bytes]]] | None = None,
    fill: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
) -> AsyncGenerator[bytes, None]:
    """*subscriber*'s stream, chunk by chunk, until its channel ends:
    ``event: job`` for each event (those ready at once in one chunk, at
    most ``MAX_WRITE``, in the order they came), ``event: stats`` (*stats*' events) every
    *stats_secs*, a comment and a call of *keep* (the stream's registration
    renewed) every *keepalive_secs*, and ``event: overflow`` last if the
    stream fell behind. *fill* gives an event whose progress was too large
    to carry its job's. No cancel scope spans a ``yield``."""
    now = trio.current_time()
    next_stats = now + stats_secs if stats_secs is not None else math.inf
    next_keep = now + keepalive_secs
    while True:
        event = None
        ended = False
        with trio.move_on_at(min(next_stats, next_keep)):
            try:
                event = await subscriber.receive.receive()
            except trio.EndOfChannel:
                ended = True
        if ended:
            if subscriber.overflowed:
                yield sse("overflow", {"max_behind": subscriber.behind})
            return
        now = trio.current_time()
        if event is not None:
            # The events ready now go out in one write: a commit's changes
            # come at once, and a write (and a trip through the scheduler)
            # per event cost the server more than the events themselves.
            ready = [event]
            while len(ready) < MAX_WRITE:
                try:
                    ready.append(subscriber.receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            written = []
            for event in ready:
                if event.get("progress_omitted"):
                    event = await fill(event)
                written.append(sse("job", {key: event.get(key) for key in JOB_FIELDS}))
            yield b"".join(written)
        if now >= next_stats and stats is not None and stats_secs is not None:
            for chunk in await stats():
                yield chunk
            next_stats = now + stats_secs
        if now >= next_keep:
            await keep()
            yield KEEPALIVE
            next_keep = now + keepalive_secs
