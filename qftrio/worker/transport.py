"""How a worker talks to the server: the :class:`Transport` interface, and
its HTTP implementation.

A :class:`Transport` offers the four protocol calls, the three reports in
batch form: one call may carry many jobs' heartbeats, completions or failures,
and answers each item with its :class:`~qftrio.models.Outcome` (over HTTP,
what the status the single-job route would have given stands for). The runtime gathers the reports its jobs make within
:attr:`Transport.coalesce_secs` into one call (:mod:`qftrio._batching`).

The in-process implementation, against the engine of the same process, is
the server's: :class:`qftrio.server.inprocess.EngineTransport`. The worker
depends on this interface only.

Errors follow the client's: :class:`~qftrio.errors.TransportError` when the
server cannot be reached, an :class:`~qftrio.errors.ApiError` for an error
answer of the whole call, and :class:`~qftrio.errors.UnexpectedAnswer` for an
answer that is not the protocol's (the client checks every answer's shape).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from .._json import dumps
from ..client import Client
from ..models import (
    CompleteItem, FailItem, HeartbeatItem, HeartbeatReply, Lease, Outcome, ReportReply, SnoozeItem, StepsAddRequest, Workflow,
)

__all__ = [
    "Transport",
    "HttpTransport",
    "HeartbeatItem",
    "CompleteItem",
    "FailItem",
    "SnoozeItem",
    "HeartbeatReply",
    "ReportReply",
    "Outcome",
]

#: The server's request body cap unless it was configured otherwise.
DEFAULT_MAX_BODY_BYTES = 1 << 20

# What one item adds to a batch body besides its result or error: the job id,
# the token, the keys and punctuation, with room to spare.
_ITEM_OVERHEAD = 256

I = TypeVar("I")
R = TypeVar("R")


class Transport(abc.ABC):
    """The worker protocol, reports in batch form."""

    #: How long the worker lets reports gather before sending them as one
    #: batch. A few milliseconds cost little latency and save a great many
    #: round trips when jobs are short.
    coalesce_secs: float = 0.005

    #: At most this many batch calls of one kind in flight at once.
    max_inflight: int = 2

    #: The largest request the server accepts, in bytes (``None``: no cap).
    #: A result that cannot fit fails its job at once.
    max_body_bytes: int | None = None

    @abc.abstractmethod
    async def lease(
        self, queue: str, *, max_jobs: int, lease_secs: int, wait_secs: float, worker_id: str | None
    ) -> list[Lease]:
        """Claim up to *max_jobs*, long-polling up to *wait_secs*."""

    @abc.abstractmethod
    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        """Extend leases; one reply per item, in order."""

    @abc.abstractmethod
    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        """Record successes; one reply per item, in order."""

    @abc.abstractmethod
    async def fail(self, items: Sequence[FailItem]) -> list[ReportReply]:
        """Record failures; one reply per item, in order."""

    @abc.abstractmethod
    async def snooze(self, items: Sequence[SnoozeItem]) -> list[ReportReply]:
        """Put jobs back to pending for a while, their attempts not used up;
        one reply per item, in order."""

    @abc.abstractmethod
    async def steps_add(self, job_id: str, body: StepsAddRequest) -> Workflow:
        """Add steps to the workflow of the running step *job_id*
        (``POST /api/v1/jobs/{id}/steps``); the server's refusal raises."""


class HttpTransport(Transport):
    """The protocol over HTTP, through a :class:`~qftrio.client.Client`
    carrying a worker token. The client stays the caller's to close.

    Batch reports are split so that each request stays under
    *max_body_bytes*, the server's body cap.
    """

    coalesce_secs = 0.005

    def __init__(self, client: Client, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.client = client
        self.max_body_bytes = max_body_bytes

    async def lease(
        self, queue: str, *, max_jobs: int, lease_secs: int, wait_secs: float, worker_id: str | None
    ) -> list[Lease]:
        return await self.client.lease(
            queue, max_jobs=max_jobs, lease_secs=lease_secs, wait_secs=wait_secs, worker_id=worker_id
        )

    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        return await self.client.heartbeat_many(items)

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        return await self._split(self.client.complete_many, items, lambda i: len(dumps(i.result)))

    async def fail(self, items: Sequence[FailItem]) -> list[ReportReply]:
        return await self._split(self.client.fail_many, items, lambda i: len(i.error.encode()))

    async def snooze(self, items: Sequence[SnoozeItem]) -> list[ReportReply]:
        return await self._split(self.client.snooze_many, items, lambda i: 0)

    async def steps_add(self, job_id: str, body: StepsAddRequest) -> Workflow:
        steps = [step.model_dump() for step in body.steps]
        return await self.client.steps_add(job_id, body.lease_token, steps, collect=body.collect)

    async def _split(
        self,
        send: Callable[[Sequence[I]], Awaitable[list[R]]],
        items: Sequence[I],
        size_of: Callable[[I], int],
    ) -> list[R]:
        """Send *items* in as few requests as fit the body cap, in order."""
        replies: list[R] = []
        chunk: list[I] = []
        room = self.max_body_bytes - _ITEM_OVERHEAD
        used = 0
        for item in items:
            size = size_of(item) + _ITEM_OVERHEAD
            if chunk and used + size > room:
                replies += await send(chunk)
                chunk, used = [], 0
            chunk.append(item)
            used += size
        if chunk:
            replies += await send(chunk)
        return replies

