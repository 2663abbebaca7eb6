"""Concurrent calls of a batch operation, run together.

Many workers report and lease at once, each request a handful of items. A
store call has a fixed cost (a transaction, a round trip to PostgreSQL, a
hop to SQLite's thread) that one call with many items pays once.
:class:`Coalescer` makes that happen without adding a wait: when the store
is idle a call goes through at once; calls that arrive while ``limit``
calls are in flight queue up, and the next caller to get a turn runs every
queued call as one batch. Each caller gets the results of its own items.

The batch runs shielded from the cancellation of whichever caller runs it:
the other callers' items are in it too. A batch that raises is run again one
call at a time, so one caller's bad input fails only that caller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import trio

__all__ = ["Coalescer"]

T = TypeVar("T")
R = TypeVar("R")


class _Call(Generic[T, R]):
    __slots__ = ("items", "taken", "done", "results", "error")

    def __init__(self, items: list[T]) -> None:
        self.items = items
        self.taken = False
        self.done = trio.Event()
        self.results: list[R] = []
        self.error: BaseException | None = None


class Coalescer(Generic[T, R]):
    """Run ``operation(items)`` (one result per item, in order) for
    concurrent callers, batching the callers that queue up.

    Args:
        operation: the batch operation.
        limit: batches in flight at once.
    """

    def __init__(self, operation: Callable[[list[T]], Awaitable[list[R]]], *, limit: int = 2) -> None:
        self._operation = operation
        self._limit = limit
        self._turns = trio.Semaphore(limit)
        self._queued: list[_Call[T, R]] = []

    @property
    def idle(self) -> bool:
        """Nothing queued or in flight."""
        return not self._queued and self._turns.value == self._limit

    async def __call__(self, items: Sequence[T]) -> list[R]:
        call: _Call[T, R] = _Call(list(items))
        self._queued.append(call)
        try:
            async with self._turns:
                if not call.taken:
                    batch, self._queued = self._queued, []
                    for queued in batch:
                        queued.taken = True
                    with trio.CancelScope(shield=True):
                        await self._run(batch)
        finally:
            if not call.taken:
                self._queued.remove(call)
        # Taken into a batch that another caller runs: wait for it.
        await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.results

    async def _run(self, batch: list[_Call[T, R]]) -> None:
        try:
            if len(batch) == 1:
                await self._run_one(batch[0])
                return
            try:
                results = await self._operation([item for call in batch for item in call.items])
            except Exception:
                for call in batch:
                    await self._run_one(call)
                return
            start = 0
            for call in batch:
                call.results = results[start : start + len(call.items)]
                start += len(call.items)
        finally:
            for call in batch:
                call.done.set()

    async def _run_one(self, call: _Call[T, R]) -> None:
        try:
            call.results = await self._operation(call.items)
        except Exception as exc:
            call.error = exc
