"""The hand-off of enqueued jobs to parked long-polls, at the engine, with
Trio's clock: what happens when the hand-off's transaction is slow or fails
while a poll waits for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from qftrio import errors
from qftrio.models import EnqueueRequest, JobConfig, Lease, Status
from qftrio.server.engine import Engine
from qftrio.server.store.base import ClaimRequest, Inserted, NewJob, Store
from qftrio.server.store.sqlite import SqliteStore

EPOCH = 1_800_000_000.0


class SlowHandOff:
    """A store whose ``jobs_insert_claiming`` takes ``delay`` seconds of
    Trio time (then runs, or raises when ``fail`` is set); everything else
    is the real embedded store's."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.delay = 1.0
        self.fail = False
        self.calls = 0
        self.claims = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def jobs_claim(self, queue: str, **kw: Any) -> list[Lease]:
        self.claims += 1
        return await self._store.jobs_claim(queue, **kw)

    async def jobs_insert_claiming(
        self, jobs: Sequence[NewJob], *, now: float, claims: Sequence[ClaimRequest]
    ) -> tuple[list[Inserted], list[list[Lease]]]:
        self.calls += 1
        await trio.sleep(self.delay)
        if self.fail:
            raise errors.Unavailable("the database failed")
        return await self._store.jobs_insert_claiming(jobs, now=now, claims=claims)


@pytest.fixture
async def slow(tmp_path: Path) -> AsyncIterator[SlowHandOff]:
    # Inline SQLite calls: a worker thread would let the autojump clock run ahead.
    store = SqliteStore(str(tmp_path / "qftrio.db"), threaded=False)
    try:
        yield SlowHandOff(store)
    finally:
        await store.aclose()


def make_engine(store: SlowHandOff) -> Engine:
    return Engine(store, clock=lambda: EPOCH + trio.current_time())  # type: ignore[arg-type]


SPEC = EnqueueRequest(kind="k", payload={}, config=JobConfig(queue="q"))


async def poll(engine: Engine, got: list[list[Lease]], wait_secs: float) -> None:
    """A long-poll for one job of queue ``q``; appends what it got."""
    got.append(await engine.lease("q", max_jobs=1, lease_secs=30, wait_secs=wait_secs))


async def test_a_poll_whose_wait_ends_during_the_hand_off_still_gets_its_job(
    slow: SlowHandOff, autojump_clock: trio.abc.Clock
) -> None:
    engine = make_engine(slow)
    got: list[list[Lease]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll, engine, got, 0.5)
        await trio.sleep(0.2)
        (inserted,) = await engine.enqueue("t", [SPEC])  # takes the poll; lands at t=1.2
    assert slow.calls == 1
    (lease,) = got[0]
    assert lease.job.id == inserted.job.id and lease.job.status is Status.RUNNING and lease.job.attempt == 1


async def test_a_failed_hand_off_leaves_the_poll_to_claim_for_itself(
    slow: SlowHandOff, autojump_clock: trio.abc.Clock
) -> None:
    engine = make_engine(slow)
    slow.fail = True
    got: list[list[Lease]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll, engine, got, 10)
        await trio.sleep(0.2)
        with pytest.raises(errors.Unavailable):
            await engine.enqueue("t", [SPEC])
        # Nothing was stored; the poll parks again and takes the next job.
        slow.fail = False
        slow.delay = 0
        (inserted,) = await engine.enqueue("t", [SPEC])
    (lease,) = got[0]
    assert lease.job.id == inserted.job.id
    assert [j.id for j in await slow.jobs_list(tenant="t")] == [inserted.job.id]


async def test_a_poll_cancelled_during_the_hand_off_loses_its_job_to_the_lease(
    slow: SlowHandOff, autojump_clock: trio.abc.Clock
) -> None:
    # As with any answer lost on the way: the job is claimed, and claimable
    # again once its lease runs out.
    engine = make_engine(slow)
    async with trio.open_nursery() as nursery:
        poll_scope = trio.CancelScope()

        async def poll() -> None:
            with poll_scope:
                await engine.lease("q", max_jobs=1, lease_secs=30, wait_secs=10)

        nursery.start_soon(poll)
        await trio.sleep(0.2)

        async def cancel_soon() -> None:
            await trio.sleep(0.5)
            poll_scope.cancel()

        nursery.start_soon(cancel_soon)
        (inserted,) = await engine.enqueue("t", [SPEC])
    job = await slow.job_get(inserted.job.id)
    assert job is not None and job.status is Status.RUNNING
    assert await engine.lease("q", max_jobs=1, lease_secs=30) == []
    await trio.sleep(31)
    (again,) = await engine.lease("q", max_jobs=1, lease_secs=30)
    assert again.job.id == inserted.job.id and again.job.attempt == 2


async def test_a_hand_off_that_drains_the_queue_does_not_wake_the_other_polls(
    slow: SlowHandOff, autojump_clock: trio.abc.Clock
) -> None:
    engine = make_engine(slow)
    slow.delay = 0
    returned: list[tuple[float, int]] = []

    async def poll() -> None:
        leases = await engine.lease("q", max_jobs=2, lease_secs=30, wait_secs=3)
        returned.append((trio.current_time(), len(leases)))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(poll)
        await trio.sleep(1)
        start = trio.current_time()
        claims = slow.claims  # the polls' own, before parking (coalesced)
        await engine.enqueue("t", [SPEC, SPEC, SPEC])  # the two oldest polls: 2 + 1
        await trio.sleep(1)
        assert slow.claims == claims  # the third poll was not woken to look again
    ends = sorted((round(at - start, 3), n) for at, n in returned)
    assert ends == [(0, 1), (0, 2), (2, 0)]  # the third waited out its wait


async def test_an_enqueue_cancelled_during_the_hand_off_still_hands_the_job_over(
    slow: SlowHandOff, autojump_clock: trio.abc.Clock
) -> None:
    engine = make_engine(slow)
    got: list[list[Lease]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll, engine, got, 10)
        await trio.sleep(0.2)
        with trio.move_on_after(0.5):  # the enqueue's caller goes away mid-transaction
            await engine.enqueue("t", [SPEC])
    ((lease,),) = got
    assert lease.job.status is Status.RUNNING and lease.job.attempt == 1


async def test_a_poll_handed_a_job_returns_before_the_enqueue_that_handed_it(engine: Engine) -> None:
    # On both stores. The worker waits on the poll's answer, the enqueuer
    # only on a receipt: the poll's answer goes first, whatever order
    # Trio's scheduler runs the two tasks in (it varies from run to run).
    for _ in range(20):
        order: list[str] = []

        async def poll() -> None:
            (lease,) = await engine.lease("q", max_jobs=1, lease_secs=30, wait_secs=30)
            order.append("poll")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            # until the poll waits on its wake-up (before that, it reads
            # when the queue's next job falls due: the store's time)
            while not any(p.event.statistics().tasks_waiting for p in engine.waker._parked.get("q", ())):
                await trio.sleep(0.001)
            await engine.enqueue("t", [SPEC])
            order.append("enqueue")
        assert order == ["poll", "enqueue"]



class LateClaim:
    """A store whose next claim reads the queue, then answers only once
    ``answer`` is set: work enqueued meanwhile is not in what it read."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.read = trio.Event()
        self.answer = trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def jobs_claim(self, queue: str, **kw: Any) -> list[Lease]:
        leases = await self._store.jobs_claim(queue, **kw)
        if not self.read.is_set():
            self.read.set()
            await self.answer.wait()
        return leases


async def test_work_enqueued_while_a_poll_claims_wakes_it_once_its_claim_ends(storage: Store) -> None:
    # The poll's claim found nothing; the enqueue's wake-up came before the
    # claim ended. The poll claims again at once, not at its safety poll
    # (an hour here).
    store = LateClaim(storage)
    engine = Engine(store, clock=lambda: EPOCH + trio.current_time(), safety_poll_secs=3600)  # type: ignore[arg-type]
    got: list[list[Lease]] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll, engine, got, 3600)
            await store.read.wait()
            (inserted,) = await engine.enqueue("t", [SPEC])
            store.answer.set()
    (lease,) = got[0]
    assert lease.job.id == inserted.job.id


async def test_an_enqueue_does_not_claim_for_a_poll_whose_own_claim_is_under_way(storage: Store) -> None:
    # The poll's claim may bring jobs of its own: jobs claimed for it as
    # well would be held by no one until their lease ran out.
    store = LateClaim(storage)
    engine = Engine(store, clock=lambda: EPOCH + trio.current_time())  # type: ignore[arg-type]
    (first,) = await engine.enqueue("t", [SPEC])
    got: list[list[Lease]] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll, engine, got, 3600)
            await store.read.wait()  # its claim took the first job
            (second,) = await engine.enqueue("t", [SPEC])
            store.answer.set()
    assert [lease.job.id for lease in got[0]] == [first.job.id]
    (lease,) = await engine.lease("q", max_jobs=1, lease_secs=30)
    assert lease.job.id == second.job.id and lease.job.attempt == 1
