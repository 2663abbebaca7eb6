"""``job.progress(obj)`` in the worker runtime (DESIGN §7): sent with a
heartbeat batch within a second, the latest winning, from async handlers on
Trio's deterministic clock and from synchronous ones in their thread."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from qftrio import Registry
from qftrio.models import Job, Status
from qftrio.worker import open_worker
from qftrio.worker.runtime import PROGRESS_SECS

from .test_runtime import LATENCY, Faults, server  # noqa: F401  (the fixture)


def _progress_beats(server: Faults, job_id: str) -> list[tuple[float, dict[str, Any] | None]]:
    return [(at, item.progress) for at, name, items in server.calls if name == "heartbeat" for item in items if item.job_id == job_id]


async def test_progress_goes_with_a_heartbeat_within_a_second_latest_winning(server: Faults, autojump_clock: Any) -> None:
    reported_at: list[float] = []
    reg = Registry()

    @reg.handler("steps")
    async def steps(job: Job) -> dict[str, Any]:
        job.progress({"done": 1})
        job.progress({"done": 2})  # before anything is sent: only this one goes
        reported_at.append(trio.current_time())
        await trio.sleep(3)
        job.progress({"done": 3})
        reported_at.append(trio.current_time())
        await trio.sleep(3)
        return {}

    job_id = await server.add("steps")
    async with open_worker(server, "q", reg, lease_secs=60, wait_secs=1):
        await server.wait_status(Status.COMPLETED, job_id)
    carried = [(at, progress) for at, progress in _progress_beats(server, job_id) if progress is not None]
    assert [progress for _, progress in carried] == [{"done": 2}, {"done": 3}]
    for (at, _), reported in zip(carried, reported_at, strict=True):
        assert reported <= at <= reported + PROGRESS_SECS + 2 * LATENCY
    job = await server.job(job_id)
    assert job.last_progress == {"done": 3} and job.progress_at is not None


async def test_progress_is_sent_again_when_its_heartbeat_fails(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()
    sent = trio.Event()

    @reg.handler("once")
    async def once(job: Job) -> dict[str, Any]:
        job.progress({"half": True})
        await sent.wait()
        return {}

    job_id = await server.add("once")
    server.down.add("heartbeat")
    async with open_worker(server, "q", reg, lease_secs=60, wait_secs=1):
        await server.wait_for(lambda: len(_progress_beats(server, job_id)) >= 2)
        server.down.discard("heartbeat")

        async def landed() -> bool:
            return (await server.job(job_id)).last_progress == {"half": True}

        await server.wait_for(landed)
        sent.set()
        await server.wait_status(Status.COMPLETED, job_id)


async def test_progress_from_a_synchronous_handler(server: Faults) -> None:
    # Real clock: a thread's work is invisible to the autojump clock.
    reg = Registry()
    go_on = trio.Event()
    token = trio.lowlevel.current_trio_token()

    @reg.handler("sync")
    def sync(job: Job) -> dict[str, Any]:
        job.progress({"from": "thread"})
        trio.from_thread.run(go_on.wait, trio_token=token)
        return {}

    job_id = await server.add("sync")
    async with open_worker(server, "q", reg, lease_secs=60, wait_secs=1):

        async def landed() -> bool:
            return (await server.job(job_id)).last_progress == {"from": "thread"}

        await server.wait_for(landed, timeout=30)
        go_on.set()
        await server.wait_status(Status.COMPLETED, job_id)


async def test_bad_progress_raises_in_the_handler(server: Faults, autojump_clock: Any) -> None:
    seen: list[str] = []
    reg = Registry()

    @reg.handler("bad")
    async def bad(job: Job) -> dict[str, Any]:
        for value in ({"blob": "x" * 9000}, ["not", "an", "object"], {"n": float("nan")}):
            try:
                job.progress(value)  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                seen.append(type(exc).__name__)
        return {}

    job_id = await server.add("bad")
    async with open_worker(server, "q", reg, lease_secs=60, wait_secs=1):
        await server.wait_status(Status.COMPLETED, job_id)
    assert seen == ["ValueError", "TypeError", "ValueError"]
    assert (await server.job(job_id)).last_progress is None


async def test_progress_outside_a_handler_says_where_it_works(server: Faults) -> None:
    job_id = await server.add("echo")
    job = await server.job(job_id)
    with pytest.raises(RuntimeError, match="inside a handler"):
        job.progress({"n": 1})
