"""Concurrent calls of a batch operation share store calls (server/coalesce.py)."""

from __future__ import annotations

import pytest
import trio

from qftrio.server.coalesce import Coalescer


class Recorder:
    """A batch operation that doubles its items, slowly, and remembers each
    batch it was given. An item of -1 makes the whole batch fail."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        await trio.sleep(1)
        if -1 in items:
            raise ValueError("bad item")
        return [2 * i for i in items]


async def test_an_idle_call_runs_at_once(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    start = trio.current_time()
    assert await Coalescer(op)([1, 2]) == [2, 4]
    assert trio.current_time() - start == 1
    assert op.batches == [[1, 2]]


async def test_calls_that_queue_run_as_one_batch(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    coalescer = Coalescer(op, limit=1)
    results: dict[int, list[int]] = {}

    async def call(n: int) -> None:
        results[n] = await coalescer([n, n + 100])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 1)
        await trio.sleep(0.1)  # the first is in flight
        for n in (2, 3, 4):
            nursery.start_soon(call, n)
            await trio.sleep(0.01)
    assert op.batches == [[1, 101], [2, 102, 3, 103, 4, 104]]
    assert results == {n: [2 * n, 2 * (n + 100)] for n in (1, 2, 3, 4)}
    assert coalescer.idle


async def test_a_failing_batch_fails_only_its_bad_call(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    coalescer = Coalescer(op, limit=1)
    outcomes: dict[int, object] = {}

    async def call(n: int) -> None:
        try:
            outcomes[n] = await coalescer([n])
        except ValueError as exc:
            outcomes[n] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 0)
        await trio.sleep(0.1)
        for n in (5, -1, 7):
            nursery.start_soon(call, n)
            await trio.sleep(0.01)
    assert outcomes[0] == [0] and outcomes[5] == [10] and outcomes[7] == [14]
    assert isinstance(outcomes[-1], ValueError)
    # the batch, then each of its calls on its own
    assert op.batches == [[0], [5, -1, 7], [5], [-1], [7]]


async def test_a_cancelled_caller_does_not_cancel_the_batch_it_runs(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    coalescer = Coalescer(op, limit=1)
    results: dict[int, list[int]] = {}

    async def call(n: int, scope: trio.CancelScope | None = None) -> None:
        with scope or trio.CancelScope():
            results[n] = await coalescer([n])

    impatient = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 1)
        await trio.sleep(0.1)
        nursery.start_soon(call, 2, impatient)  # runs the next batch...
        await trio.sleep(0)
        nursery.start_soon(call, 3)  # ...which takes this call too
        await trio.sleep(1.5)  # the second batch is in flight
        impatient.cancel()
    assert op.batches == [[1], [2, 3]]
    assert results == {1: [2], 3: [6]}


async def test_a_caller_cancelled_while_queued_leaves_the_batch(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    coalescer = Coalescer(op, limit=1)
    impatient = trio.CancelScope()

    async def call(n: int, scope: trio.CancelScope | None = None) -> None:
        with scope or trio.CancelScope():
            await coalescer([n])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 1)
        await trio.sleep(0.1)
        nursery.start_soon(call, 2, impatient)
        nursery.start_soon(call, 3)
        await trio.sleep(0.1)
        impatient.cancel()
    assert op.batches == [[1], [3]]
    assert coalescer.idle


@pytest.mark.parametrize("limit", [1, 2])
async def test_every_caller_gets_its_results_under_load(autojump_clock: trio.abc.Clock, limit: int) -> None:
    op = Recorder()
    coalescer = Coalescer(op, limit=limit)
    results: dict[int, list[int]] = {}

    async def call(n: int) -> None:
        await trio.sleep(n * 0.37)
        results[n] = await coalescer(list(range(n, n + n % 3 + 1)))

    async with trio.open_nursery() as nursery:
        for n in range(30):
            nursery.start_soon(call, n)
    assert results == {n: [2 * i for i in range(n, n + n % 3 + 1)] for n in range(30)}
    assert len(op.batches) < 30
