"""The asyncio loop thread that asyncpg runs on (``pgasync.LoopThread``):
results and exceptions come back to the calling Trio task, cancellation
waits for the coroutine, and the thread ends with its context."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from qftrio.server.store.pgasync import open_loop_thread


async def test_a_coroutine_runs_on_the_loop_thread_and_its_result_comes_back() -> None:
    async def where(x: int) -> tuple[int, str, bool]:
        await asyncio.sleep(0)
        return x * 2, threading.current_thread().name, asyncio.get_running_loop().is_running()

    async with open_loop_thread("test-loop") as loop:
        assert await loop.run(where, 21) == (42, "test-loop", True)


async def test_an_exception_is_raised_in_the_calling_task() -> None:
    async def fails() -> None:
        raise LookupError("from the loop")

    async with open_loop_thread() as loop:
        with pytest.raises(LookupError, match="from the loop"):
            await loop.run(fails)
        # the loop goes on serving
        assert await loop.run(asyncio.sleep, 0, "still") == "still"


async def test_many_tasks_share_one_loop() -> None:
    async def square(x: int) -> int:
        await asyncio.sleep(0.001)
        return x * x

    results: dict[int, int] = {}
    async with open_loop_thread() as loop:

        async def one(x: int) -> None:
            results[x] = await loop.run(square, x)

        async with trio.open_nursery() as nursery:
            for x in range(50):
                nursery.start_soon(one, x)
    assert results == {x: x * x for x in range(50)}


async def test_a_cancelled_caller_waits_for_the_coroutine_then_sees_cancelled() -> None:
    release = threading.Event()
    finished: list[str] = []

    async def slow() -> str:
        while not release.is_set():
            await asyncio.sleep(0.001)
        finished.append("done")
        return "done"

    async with open_loop_thread() as loop, trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:

            async def cancel_then_release() -> None:
                await trio.sleep(0.05)
                scope.cancel()
                await trio.sleep(0.05)
                # the caller is still waiting: the coroutine has not ended
                assert finished == []
                release.set()

            nursery.start_soon(cancel_then_release)
            await loop.run(slow)
            pytest.fail("a cancelled call returned")
        assert scope.cancelled_caught
        assert finished == ["done"]


async def test_the_thread_ends_with_its_context_and_tasks_left_are_cancelled() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def leave_a_task() -> None:
        asyncio.ensure_future(forever())
        await asyncio.sleep(0)

    async with open_loop_thread("test-ends") as loop:
        await loop.run(leave_a_task)
    assert cancelled.is_set()
    assert "test-ends" not in {t.name for t in threading.enumerate()}


async def test_callbacks_reach_trio_from_the_loop_thread() -> None:
    got = trio.Event()
    seen: list[str] = []

    def in_trio(value: str) -> None:
        seen.append(value)
        got.set()

    async with open_loop_thread() as loop:

        async def call_back() -> None:
            loop.in_trio(in_trio, "hello")

        await loop.run(call_back)
        with trio.fail_after(10):
            await got.wait()
    assert seen == ["hello"]
