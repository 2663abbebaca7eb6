"""How a worker talks to the server: over HTTP, or to the engine in-process.

A :class:`Transport` offers the four protocol calls, the three reports in
batch form: one call may carry many jobs' heartbeats, completions or failures,
and answers each item with the code the single-job route would have given
(200/204, 404, 409). The worker never sends them one by one: a
:class:`Batcher` gathers the reports its jobs make within
:attr:`Transport.coalesce_secs` into one call. Over HTTP these are the batch
routes, so a worker running hundreds of jobs keeps a couple of connections busy
instead of opening hundreds (httpx does poorly with many concurrent requests).

Errors follow the client's: :class:`~qftrio.errors.TransportError` when the
server cannot be reached, an :class:`~qftrio.errors.ApiError` for an error
answer of the whole call.
"""

from __future__ import annotations

import abc
import collections
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import outcome
import trio

from .. import errors
from ..client import Client, CompleteItem, FailItem, HeartbeatItem, HeartbeatReply, ReportReply
from ..models import MAX_BATCH, Lease

if TYPE_CHECKING:
    from ..server.engine import Engine

__all__ = [
    "Transport",
    "HttpTransport",
    "EngineTransport",
    "Batcher",
    "HeartbeatItem",
    "CompleteItem",
    "FailItem",
    "HeartbeatReply",
    "ReportReply",
]

log = logging.getLogger("qftrio.worker")


class Transport(abc.ABC):
    """The worker protocol, reports in batch form."""

    #: How long the worker lets reports gather before sending them as one
    #: batch. A few milliseconds cost little latency and save a great many
    #: round trips when jobs are short.
    coalesce_secs: float = 0.005

    #: At most this many batch calls of one kind in flight at once.
    max_inflight: int = 2

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


class HttpTransport(Transport):
    """The protocol over HTTP, through a :class:`~qftrio.client.Client`
    carrying a worker token. The client stays the caller's to close."""

    coalesce_secs = 0.005

    def __init__(self, client: Client) -> None:
        self.client = client

    async def lease(
        self, queue: str, *, max_jobs: int, lease_secs: int, wait_secs: float, worker_id: str | None
    ) -> list[Lease]:
        return await self.client.lease(
            queue, max_jobs=max_jobs, lease_secs=lease_secs, wait_secs=wait_secs, worker_id=worker_id
        )

    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        return await self.client.heartbeat_many(items)

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        return await self.client.complete_many(items)

    async def fail(self, items: Sequence[FailItem]) -> list[ReportReply]:
        return await self.client.fail_many(items)


class EngineTransport(Transport):
    """The protocol against an :class:`~qftrio.server.engine.Engine` in the
    same process (``qftrio serve --handlers``): same semantics, no HTTP.
    Batching still pays: one store transaction carries many reports."""

    coalesce_secs = 0.001

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def _call(self, what: str, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except errors.QftrioError:
            raise
        except Exception as exc:
            # The store is the only thing in here that fails for reasons of its
            # own (a locked or vanished database). The runtime retries what it
            # sees as a transport error, which is what this is to it.
            log.warning("engine %s failed: %s: %s", what, type(exc).__name__, exc)
            raise errors.TransportError(f"engine {what}: {type(exc).__name__}: {exc}") from None

    async def lease(
        self, queue: str, *, max_jobs: int, lease_secs: int, wait_secs: float, worker_id: str | None
    ) -> list[Lease]:
        return await self._call(
            "lease",
            self.engine.lease,
            queue,
            max_jobs=max_jobs,
            lease_secs=lease_secs,
            wait_secs=wait_secs,
            worker_id=worker_id,
        )

    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        from ..server.store import base

        results = await self._call(
            "heartbeat",
            self.engine.heartbeat,
            [base.HeartbeatItem(i.job_id, i.lease_token, i.extend_secs) for i in items],
        )
        replies = []
        for item, r in zip(items, results, strict=True):
            if r.outcome is base.Outcome.OK:
                status = r.status.value if r.status is not None else None
                replies.append(HeartbeatReply(job_id=item.job_id, code=200, status=status, locked_until=r.locked_until))
            else:
                replies.append(HeartbeatReply(job_id=item.job_id, code=_CODES[r.outcome.value]))
        return replies

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        from ..server.store import base

        results = await self._call(
            "complete", self.engine.complete, [base.CompleteItem(i.job_id, i.lease_token, i.result) for i in items]
        )
        return [ReportReply(job_id=i.job_id, code=_CODES[r.outcome.value]) for i, r in zip(items, results, strict=True)]

    async def fail(self, items: Sequence[FailItem]) -> list[ReportReply]:
        from ..server.store import base

        results = await self._call(
            "fail",
            self.engine.fail,
            [base.FailItem(i.job_id, i.lease_token, i.error, i.retryable) for i in items],
        )
        return [ReportReply(job_id=i.job_id, code=_CODES[r.outcome.value]) for i, r in zip(items, results, strict=True)]


_CODES = {"ok": 204, "not_found": 404, "conflict": 409}


# --------------------------------------------------------------------------
# Coalescing

I = TypeVar("I")
R = TypeVar("R")


class _Slot(Generic[I, R]):
    """One caller's item, and the task waiting for its reply (``None`` once
    woken, or once it stopped waiting)."""

    __slots__ = ("item", "task")

    def __init__(self, item: I, task: trio.lowlevel.Task) -> None:
        self.item = item
        self.task: trio.lowlevel.Task | None = task

    def wake(self, result: outcome.Outcome[R]) -> None:
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task, result)


def _copy_error(exc: BaseException) -> Exception:
    """A fresh exception like *exc*, one per waiting caller: one exception
    object must not be raised in several tasks at once (tracebacks pile up)."""
    if isinstance(exc, errors.ApiError):
        return errors.error_for_status(exc.status_code, exc.code, exc.message)
    if isinstance(exc, errors.TransportError):
        return errors.TransportError(str(exc))
    return errors.TransportError(f"{type(exc).__name__}: {exc}")


class Batcher(Generic[I, R]):
    """Turns single calls into batch calls.

    :meth:`call` hands one item over and waits for its reply. :meth:`run`
    collects the items that arrive within *linger* seconds of the first (at
    most *max_items*), sends them with one ``send(items)``, and gives each
    caller its reply, or its own copy of the batch's exception. Up to
    *max_inflight* batches are in flight at once; while they all are, new
    items keep gathering, so batches grow under load instead of queueing.

    A caller that is cancelled stops waiting: its item is dropped if it
    was not sent yet, and sent all the same if it was (for reports, that is
    harmless: they are idempotent). Callers still waiting when :meth:`run`
    ends get a :class:`~qftrio.errors.TransportError`, as do later ones.
    """

    def __init__(
        self,
        send: Callable[[list[I]], Awaitable[list[R]]],
        *,
        linger: float = 0.005,
        max_items: int = MAX_BATCH,
        max_inflight: int = 2,
        name: str = "batch",
    ) -> None:
        self._send = send
        self._linger = linger
        self._max_items = max_items
        self._inflight = trio.Semaphore(max_inflight)
        self._name = name
        # Items handed over and not yet sent. No more than one per caller,
        # and every caller waits for its reply: that bounds it.
        self._pending: collections.deque[_Slot[I, R]] = collections.deque()
        self._collector: trio.lowlevel.Task | None = None  # run(), parked until an item comes
        self._linger_scope: trio.CancelScope | None = None  # run(), letting a batch gather
        self._closed = False

    async def call(self, item: I) -> R:
        # One park per call, and no Event or channel: this runs for every
        # report of every job.
        if self._closed:
            raise errors.TransportError(f"{self._name}: the worker is shutting down")
        slot: _Slot[I, R] = _Slot(item, trio.lowlevel.current_task())
        pending = self._pending
        pending.append(slot)
        collector = self._collector
        if collector is not None:
            self._collector = None
            trio.lowlevel.reschedule(collector)
        elif len(pending) >= self._max_items and self._linger_scope is not None:
            self._linger_scope.cancel()  # a full batch need not linger

        def abort(_: Any) -> trio.lowlevel.Abort:
            # Cancelled: stop waiting. An item not yet taken is dropped; one
            # already sent goes on, its reply unread.
            slot.task = None
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Collect and send until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    if not self._pending:
                        await self._wait_for_an_item()
                    # The first item is here: let others join it for a while.
                    if len(self._pending) < self._max_items:
                        with trio.move_on_after(self._linger) as self._linger_scope:
                            await trio.sleep_forever()
                        self._linger_scope = None
                    # Waiting for room in flight, the next batch keeps
                    # growing.
                    await self._inflight.acquire()
                    batch = self._take()
                    if batch:
                        nursery.start_soon(self._flush, batch)
                    else:
                        self._inflight.release()  # every caller stopped waiting
        finally:
            self._closed = True
            self._collector = self._linger_scope = None
            while self._pending:
                self._pending.popleft().wake(
                    outcome.Error(errors.TransportError(f"{self._name}: the worker is shutting down"))
                )

    async def _wait_for_an_item(self) -> None:
        self._collector = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._collector = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _take(self) -> list[_Slot[I, R]]:
        batch = []
        pending, max_items = self._pending, self._max_items
        while pending and len(batch) < max_items:
            slot = pending.popleft()
            if slot.task is not None:
                batch.append(slot)
        return batch

    async def _flush(self, batch: list[_Slot[I, R]]) -> None:
        try:
            replies = await self._send([slot.item for slot in batch])
            if len(replies) != len(batch):
                raise errors.TransportError(f"{self._name}: {len(replies)} replies for {len(batch)} items")
        except Exception as exc:
            if not isinstance(exc, errors.QftrioError):
                log.error("%s call failed unexpectedly", self._name, exc_info=True)
            for slot in batch:
                if slot.task is not None:
                    slot.wake(outcome.Error(_copy_error(exc)))
        else:
            for slot, reply in zip(batch, replies):
                slot.wake(outcome.Value(reply))
        finally:
            self._inflight.release()
            # Cancelled mid-call (the worker is going): nobody is left hanging.
            for slot in batch:
                if slot.task is not None:
                    slot.wake(outcome.Error(errors.TransportError(f"{self._name}: the worker is shutting down")))
