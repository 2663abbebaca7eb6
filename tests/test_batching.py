"""Concurrent calls of a batch operation run together (qftrio/_batching.py)."""

from __future__ import annotations

import pytest
import trio

from qftrio._batching import Batcher, BatcherClosed


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
    assert await Batcher(op)([1, 2]) == [2, 4]
    assert trio.current_time() - start == 1
    assert op.batches == [[1, 2]]


async def test_calls_that_queue_run_as_one_batch(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    batcher = Batcher(op, limit=1)
    results: dict[int, list[int]] = {}

    async def call(n: int) -> None:
        results[n] = await batcher([n, n + 100])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 1)
        await trio.sleep(0.1)  # the first is in flight
        for n in (2, 3, 4):
            nursery.start_soon(call, n)
            await trio.sleep(0.01)
    assert op.batches == [[1, 101], [2, 102, 3, 103, 4, 104]]
    assert results == {n: [2 * n, 2 * (n + 100)] for n in (1, 2, 3, 4)}
    assert batcher.idle


async def test_a_failing_batch_fails_only_its_bad_call(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    batcher = Batcher(op, limit=1)
    outcomes: dict[int, object] = {}

    async def call(n: int) -> None:
        try:
            outcomes[n] = await batcher([n])
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
    batcher = Batcher(op, limit=1)
    results: dict[int, list[int]] = {}

    async def call(n: int, scope: trio.CancelScope | None = None) -> None:
        with scope or trio.CancelScope():
            results[n] = await batcher([n])

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
    batcher = Batcher(op, limit=1)
    impatient = trio.CancelScope()

    async def call(n: int, scope: trio.CancelScope | None = None) -> None:
        with scope or trio.CancelScope():
            await batcher([n])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 1)
        await trio.sleep(0.1)
        nursery.start_soon(call, 2, impatient)
        nursery.start_soon(call, 3)
        await trio.sleep(0.1)
        impatient.cancel()
    assert op.batches == [[1], [3]]
    assert batcher.idle


@pytest.mark.parametrize("limit", [1, 2])
async def test_every_caller_gets_its_results_under_load(autojump_clock: trio.abc.Clock, limit: int) -> None:
    op = Recorder()
    batcher = Batcher(op, limit=limit)
    results: dict[int, list[int]] = {}

    async def call(n: int) -> None:
        await trio.sleep(n * 0.37)
        results[n] = await batcher(list(range(n, n + n % 3 + 1)))

    async with trio.open_nursery() as nursery:
        for n in range(30):
            nursery.start_soon(call, n)
    assert results == {n: [2 * i for i in range(n, n + n % 3 + 1)] for n in range(30)}
    assert len(op.batches) < 30


async def test_a_lingering_call_gathers_the_calls_made_meanwhile(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    batcher = Batcher(op, linger=0.005)
    results: dict[int, list[int]] = {}
    start = trio.current_time()

    async def call(n: int) -> None:
        await trio.sleep(n * 0.001)
        results[n] = await batcher([n])

    async with trio.open_nursery() as nursery:
        for n in range(4):
            nursery.start_soon(call, n)
    assert op.batches == [[0, 1, 2, 3]]
    assert results == {n: [2 * n] for n in range(4)}
    assert trio.current_time() - start == pytest.approx(1.005)


async def test_a_full_batch_does_not_linger(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    batcher = Batcher(op, linger=10, max_items=3)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(batcher, [n])
    assert [sorted(b) for b in op.batches] == [[0, 1, 2]]
    assert trio.current_time() - start == 1


async def test_batches_hold_at_most_max_items(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    batcher = Batcher(op, limit=1, max_items=4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher, [0])
        await trio.sleep(0.1)
        for n in range(1, 6):
            nursery.start_soon(batcher, [n, n])
            await trio.sleep(0.01)
    assert [len(b) for b in op.batches] == [1, 4, 4, 2]


async def test_an_error_not_split_reaches_every_caller_as_its_own_copy(autojump_clock: trio.abc.Clock) -> None:
    op = Recorder()
    batcher = Batcher(op, linger=0.005, split_on=lambda exc: False)
    raised: list[BaseException] = []

    async def call(n: int) -> None:
        try:
            await batcher([n])
        except ValueError as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        for n in (-1, 1, 2):
            nursery.start_soon(call, n)
    assert [sorted(b) for b in op.batches] == [[-1, 1, 2]]  # not run again one by one
    assert len(raised) == 3 and len({id(e) for e in raised}) == 3
    assert all(str(e) == "bad item" for e in raised)


async def test_close_ends_the_batches_in_flight_and_refuses_new_calls(autojump_clock: trio.abc.Clock) -> None:
    async def never(items: list[int]) -> list[int]:
        await trio.sleep_forever()
        raise AssertionError

    batcher: Batcher[int, int] = Batcher(never, limit=1)
    raised: list[BaseException] = []

    async def call(n: int) -> None:
        try:
            await batcher([n])
        except BatcherClosed as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 1)  # in flight, never answered
        await trio.sleep(0.1)
        nursery.start_soon(call, 2)  # waits for a turn
        await trio.sleep(0.1)
        batcher.close()
    assert len(raised) == 2
    with pytest.raises(BatcherClosed):
        await batcher([3])
