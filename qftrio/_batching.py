"""One batching primitive: concurrent calls of a batch operation, run together.

A batch operation (``operation(items) -> one result per item, in order``)
has a fixed cost per call: a store transaction, a round trip to PostgreSQL,
an HTTP request. :class:`Batcher` lets many tasks call it at once and pay
that cost once. There is no background task: a caller runs the batch.

* A call goes out at once when fewer than *limit* batches are in flight
  (after *linger* seconds, when one is given, for others to join it).
* Calls made while *limit* batches are in flight queue up; the next caller
  to get a turn runs every queued call (up to *max_items* items) as one
  batch, so batches grow with the load instead of queueing.
* Each caller gets the results of its own items, or the batch's exception
  (its own copy: one exception object must not be raised in several tasks).
* A batch of several calls that raises an exception *split_on* accepts is
  run again one call at a time, so that one caller's bad input fails only
  that caller.
* The batch runs shielded from the cancellation of whichever caller runs it:
  the other callers' items are in it too. A caller cancelled before its
  items were taken drops them; one cancelled later stops waiting, and its
  items go out all the same. :meth:`close` cancels the batches in flight and
  refuses later calls.

The engine batches the reports and claims of concurrent requests with it,
the embedded store its group commit, and the worker runtime its jobs'
heartbeats. The worker's reports are not callers of it: a job's task ends
with its handler and hands the outcome to one reporter task, which sends
what has gathered (a call here would keep a task per job waiting for its
batch).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import trio

__all__ = ["Batcher", "BatcherClosed"]

T = TypeVar("T")
R = TypeVar("R")


class BatcherClosed(Exception):
    """The batcher was closed before the call's batch landed."""


def _always(exc: BaseException) -> bool:
    return True


class _Call(Generic[T, R]):
    __slots__ = ("items", "taken", "runs", "woken", "results", "error")

    def __init__(self, items: list[T]) -> None:
        self.items = items
        self.taken = False  # in a batch (sent, or being sent)
        self.runs = False  # this call's caller gathers and sends the next batch
        self.woken = trio.Event()  # its batch is done, or it runs the next one
        self.results: list[R] = []
        self.error: BaseException | None = None


class Batcher(Generic[T, R]):
    """Run ``operation(items)`` for concurrent callers, batching the callers
    that queue up.

    One caller at a time gathers the next batch (it lingers, then waits for
    a turn in flight) and sends it; the others wait for their results.

    Args:
        operation: the batch operation: one result per item, in order.
        limit: batches in flight at once.
        linger: seconds the first call of a batch waits for others to join
            it (0: none).
        max_items: items per batch at most (a single call larger than that
            goes out alone).
        split_on: which exceptions of a batch of several calls make it run
            again one call at a time (default: every exception).
    """

    def __init__(
        self,
        operation: Callable[[list[T]], Awaitable[list[R]]],
        *,
        limit: int = 2,
        linger: float = 0.0,
        max_items: int | None = None,
        split_on: Callable[[BaseException], bool] = _always,
    ) -> None:
        self._operation = operation
        self._limit = limit
        self._linger = linger
        self._max_items = max_items
        self._split_on = split_on
        self._turns = trio.Semaphore(limit)
        self._queued: list[_Call[T, R]] = []
        self._queued_items = 0
        self._gathering = False  # a caller gathers the next batch
        self._lingering: trio.CancelScope | None = None
        self._in_flight: set[trio.CancelScope] = set()
        self._closed = False

    @property
    def idle(self) -> bool:
        """Nothing queued or in flight."""
        return not self._queued and self._turns.value == self._limit

    def close(self) -> None:
        """Cancel the batches in flight (their callers get
        :class:`BatcherClosed`) and refuse every later call."""
        self._closed = True
        for scope in self._in_flight:
            scope.cancel()

    async def __call__(self, items: Sequence[T]) -> list[R]:
        if self._closed:
            raise BatcherClosed("closed")
        if not self._gathering and not self._linger and self._turns.value:
            return await self._run_alone(list(items))
        call: _Call[T, R] = _Call(list(items))
        self._queued.append(call)
        self._queued_items += len(call.items)
        if not self._gathering:
            self._gathering = call.runs = True
        elif self._lingering is not None and self._max_items is not None and self._queued_items >= self._max_items:
            self._lingering.cancel()  # a full batch need not linger
        if not call.runs:
            try:
                await call.woken.wait()  # one park per call that joins a batch
            except BaseException:
                if not call.taken:  # cancelled before it was sent
                    self._drop(call)
                raise
            if not call.taken:
                call.woken = trio.Event()  # handed over: it gathers the next batch
        if not call.taken:
            await self._gather_and_send(call)
            # Like every caller, it raises Cancelled if it was cancelled
            # meanwhile (its batch ran all the same).
            await trio.lowlevel.checkpoint_if_cancelled()
        if call.error is not None:
            try:
                error = copy.copy(call.error)
            except Exception:
                error = call.error
            raise error
        return call.results

    async def _run_alone(self, items: list[T]) -> list[R]:
        """A call with nobody to join and a turn free: it is its own batch,
        sent at once, without the queue, the hand-over or a wait for the
        turn (each a yield to the scheduler on the path of a lone call)."""
        self._turns.acquire_nowait()
        try:
            with trio.CancelScope(shield=True) as scope:
                self._in_flight.add(scope)
                try:
                    results = await self._operation(items)
                finally:
                    self._in_flight.discard(scope)
        finally:
            self._turns.release()
        if scope.cancelled_caught:
            raise BatcherClosed("closed while the batch was in flight")
        await trio.lowlevel.checkpoint_if_cancelled()
        return results

    async def _gather_and_send(self, call: _Call[T, R]) -> None:
        try:
            if self._linger > 0 and (self._max_items is None or self._queued_items < self._max_items):
                try:
                    with trio.move_on_after(self._linger) as self._lingering:
                        await trio.sleep_forever()
                finally:
                    self._lingering = None
            # Waiting for a turn in flight, the batch keeps growing.
            async with self._turns:
                batch = self._take()
                with trio.CancelScope(shield=True) as scope:
                    if self._closed:
                        scope.cancel()
                    self._in_flight.add(scope)
                    try:
                        await self._run(batch)
                    finally:
                        self._in_flight.discard(scope)
        finally:
            if not call.taken:  # cancelled before it was sent
                self._drop(call)

    def _drop(self, call: _Call[T, R]) -> None:
        self._queued.remove(call)
        self._queued_items -= len(call.items)
        if call.runs:
            self._hand_over()

    def _hand_over(self) -> None:
        """The next queued call, if any, gathers the next batch."""
        self._gathering = bool(self._queued)
        if self._queued:
            nxt = self._queued[0]
            nxt.runs = True
            nxt.woken.set()

    def _take(self) -> list[_Call[T, R]]:
        queued, max_items = self._queued, self._max_items
        count = n = 0
        while n < len(queued) and (max_items is None or n == 0 or count + len(queued[n].items) <= max_items):
            count += len(queued[n].items)
            n += 1
        batch, self._queued = queued[:n], queued[n:]
        self._queued_items -= count
        for call in batch:
            call.taken = True
        self._hand_over()
        return batch

    async def _run(self, batch: list[_Call[T, R]]) -> None:
        try:
            if len(batch) == 1:
                await self._run_one(batch[0])
                return
            try:
                results = await self._operation([item for call in batch for item in call.items])
                if len(results) != sum(len(call.items) for call in batch):
                    raise RuntimeError(f"{len(results)} results for {sum(len(c.items) for c in batch)} items")
            except Exception as exc:
                if self._split_on(exc):
                    for call in batch:
                        await self._run_one(call)
                else:
                    for call in batch:
                        call.error = exc
                return
            start = 0
            for call in batch:
                call.results = results[start : start + len(call.items)]
                start += len(call.items)
        except trio.Cancelled:
            # Only close() cancels a batch in flight (it is shielded).
            for call in batch:
                if call.error is None and not call.results:
                    call.error = BatcherClosed("closed while the batch was in flight")
            raise
        finally:
            for call in batch:
                call.woken.set()

    async def _run_one(self, call: _Call[T, R]) -> None:
        try:
            call.results = await self._operation(call.items)
        except Exception as exc:
            call.error = exc
