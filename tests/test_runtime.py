"""The worker runtime, on Trio's deterministic clock, against the real engine
on the embedded store (inline, no thread) through :class:`Faults`: the
in-process transport with switches to break the network on demand."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import qftrio
import qftrio.worker.runtime as runtime_mod
from qftrio import errors
from qftrio.models import (
    CompleteItem, EnqueueRequest, FailItem, HeartbeatItem, Job, JobConfig, Lease, SnoozeItem, Status, StepsAddRequest,
    Workflow, WorkflowCreateRequest, WorkflowStatus,
)
from qftrio.server.engine import Engine
from qftrio.server.inprocess import EngineTransport
from qftrio.server.store.sqlite import open_sqlite_store
from qftrio.worker import Registry, Worker, WorkerEvent, open_worker
from qftrio.worker.transport import HeartbeatReply, ReportReply, Transport

from .conftest import EPOCH

#: Seconds each call spends on the network, each way together.
LATENCY = 0.01
TENANT = "t"


class Faults(Transport):
    """The in-process transport to a real engine, with faults on demand.

    ``down`` holds the names of calls ("lease", "heartbeat", "complete",
    "fail") that fail with a TransportError before reaching the server;
    ``lose`` those that reach it and whose answer is lost on the way back;
    ``slow`` maps names to seconds each such call takes on top (before it
    reaches the server), ``slow_answer`` to seconds its answer takes on the
    way back (after the server acted); ``refuse``
    makes every call answer 401. ``calls`` records every call made.
    """

    coalesce_secs = 0.005

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._inner = EngineTransport(engine)
        self.down: set[str] = set()
        self.lose: set[str] = set()
        self.slow: dict[str, float] = {}
        self.slow_answer: dict[str, float] = {}
        self.refuse = False
        self.calls: list[tuple[float, str, Sequence[Any]]] = []
        self.leased: list[Lease] = []  # every lease answered, in order
        self._changed = trio.Event()

    # -- the server's side, for the tests --------------------------------------

    async def add(
        self, kind: str = "echo", payload: dict[str, Any] | None = None, *, max_attempts: int = 5, priority: int = 0,
        **config: Any,
    ) -> str:
        """Enqueue a job on queue ``q``; jobs enqueued at one instant are
        leased in an order only *priority* sets."""
        spec = EnqueueRequest(
            kind=kind, payload=payload or {},
            config=JobConfig(queue="q", max_attempts=max_attempts, priority=priority, **config),
        )  # fmt: skip
        (inserted,) = await self.engine.enqueue(TENANT, [spec])
        return inserted.job.id

    async def job(self, job_id: str) -> Job:
        return await self.engine.job_get(TENANT, job_id)

    async def status(self, job_id: str) -> Status:
        return (await self.job(job_id)).status

    async def cancel(self, job_id: str) -> None:
        await self.engine.job_cancel(TENANT, job_id)
        self.changed()

    async def steal(self, job_id: str) -> None:
        """Another worker holds the job now: its token changes."""
        await self.engine.job_cancel(TENANT, job_id)
        await self.engine.job_retry(TENANT, job_id)
        (lease,) = await self.engine.lease("q", lease_secs=600, worker_id="thief")
        assert lease.job.id == job_id
        self.changed()

    # -- what the worker sent ---------------------------------------------------

    def times(self, name: str, job_id: str | None = None) -> list[float]:
        return [t for t, n, items in self.calls if n == name and (job_id is None or _names(items, job_id))]

    def tries(self, name: str, lease: Lease) -> list[float]:
        """When calls carrying *lease*'s token were made."""
        return [t for t, n, items in self.calls if n == name and any(i.lease_token == lease.lease_token for i in items)]

    def lease_of(self, job_id: str) -> Lease:
        """The first lease of the job."""
        return next(lease for lease in self.leased if lease.job.id == job_id)

    def reports(self, job_id: str) -> list[str]:
        return [n for _, n, items in self.calls if n in ("complete", "fail") and _names(items, job_id)]

    def fails(self, job_id: str) -> list[FailItem]:
        return [i for _, n, items in self.calls if n == "fail" for i in items if i.job_id == job_id]

    # -- waiting for state ------------------------------------------------------

    def changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 600) -> None:
        """Until *predicate* holds, checked after each call and event."""
        with trio.fail_after(timeout):
            while True:
                changed = self._changed
                holds = predicate()
                if not isinstance(holds, bool):
                    holds = await holds
                if holds:
                    return
                await changed.wait()

    async def wait_status(self, status: Status, *job_ids: str) -> None:
        async def all_there() -> bool:
            return all([await self.status(i) is status for i in job_ids])

        await self.wait_for(all_there)

    # -- the protocol -----------------------------------------------------------

    async def _through(self, name: str, items: Sequence[Any], call: Callable[[], Awaitable[Any]]) -> Any:
        self.calls.append((trio.current_time(), name, items))
        try:
            await trio.sleep(LATENCY + self.slow.get(name, 0))
            if self.refuse:
                raise errors.Unauthorized("unknown token")
            if name in self.down:
                raise errors.TransportError(f"{name}: connection refused")
            answer = await call()
            await trio.sleep(self.slow_answer.get(name, 0))
            if name in self.lose:
                raise errors.TransportError(f"{name}: connection reset; the answer was lost")
            return answer
        finally:
            self.changed()

    async def lease(
        self, queue: str, *, max_jobs: int, lease_secs: int, wait_secs: float, worker_id: str | None
    ) -> list[Lease]:
        async def claim() -> list[Lease]:
            leases = await self._inner.lease(
                queue, max_jobs=max_jobs, lease_secs=lease_secs, wait_secs=wait_secs, worker_id=worker_id
            )
            self.leased += leases
            return leases

        return await self._through("lease", [], claim)  # type: ignore[no-any-return]

    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        return await self._through("heartbeat", items, lambda: self._inner.heartbeat(items))  # type: ignore[no-any-return]

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        return await self._through("complete", items, lambda: self._inner.complete(items))  # type: ignore[no-any-return]

    async def fail(self, items: Sequence[FailItem]) -> list[ReportReply]:
        return await self._through("fail", items, lambda: self._inner.fail(items))  # type: ignore[no-any-return]

    async def snooze(self, items: Sequence[SnoozeItem]) -> list[ReportReply]:
        return await self._through("snooze", items, lambda: self._inner.snooze(items))  # type: ignore[no-any-return]

    async def steps_add(self, job_id: str, body: StepsAddRequest) -> Workflow:
        item = CompleteItem(job_id, body.lease_token)  # what the call carries, as times() and tries() read it
        return await self._through(  # type: ignore[no-any-return]
            "steps_add", [item], lambda: self._inner.steps_add(job_id, body)
        )


def _names(items: Sequence[Any], job_id: str) -> bool:
    return any(i.job_id == job_id for i in items)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Faults]:
    async with open_sqlite_store(tmp_path / "qftrio.db", threaded=False) as store:
        yield Faults(Engine(store, clock=lambda: EPOCH + trio.current_time()))


class Recorder:
    def __init__(self, server: Faults) -> None:
        self.server = server
        self.events: list[tuple[float, WorkerEvent]] = []

    def __call__(self, event: WorkerEvent) -> None:
        self.events.append((trio.current_time(), event))
        self.server.changed()

    def of(self, type: str) -> list[WorkerEvent]:
        return [e for _, e in self.events if e.type == type]


def make_worker(server: Faults, registry: Registry, **kw: Any) -> tuple[Worker, Recorder]:
    rec = Recorder(server)
    kw.setdefault("lease_secs", 10)
    kw.setdefault("wait_secs", 5)
    kw.setdefault("worker_id", "w1")
    kw.setdefault("lanes", 4)
    return Worker(server, "q", registry, on_event=rec, **kw), rec


def count_leases(server: Faults) -> list[int]:
    """The *max_jobs* of every lease call made through *server* from now on."""
    asked: list[int] = []
    lease = server.lease

    async def counting_lease(queue: str, *, max_jobs: int, **kw: Any) -> list[Lease]:
        asked.append(max_jobs)
        return await lease(queue, max_jobs=max_jobs, **kw)

    server.lease = counting_lease  # type: ignore[method-assign]
    return asked


def echo_registry() -> Registry:
    reg = Registry()

    @reg.handler("echo")
    async def echo(job: Job) -> dict[str, Any]:
        await trio.sleep(job.payload.get("secs", 0))
        return {"echo": job.payload}

    return reg


def forever_registry() -> tuple[Registry, list[float]]:
    """A registry whose ``forever`` handler runs until cancelled, and the
    times at which it was."""
    reg = Registry()
    cancelled_at: list[float] = []

    @reg.handler("forever")
    async def forever(job: Job) -> dict[str, Any]:
        try:
            await trio.sleep_forever()
        finally:
            cancelled_at.append(trio.current_time())

    return reg, cancelled_at


# --------------------------------------------------------------------------
# The happy path


async def test_completes_jobs_with_their_results(server: Faults, autojump_clock: Any) -> None:
    ids = [await server.add("echo", {"n": n}) for n in range(3)]
    worker, rec = make_worker(server, echo_registry())
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, *ids)
        worker.stop()
    assert [(await server.job(i)).result for i in ids] == [{"echo": {"n": n}} for n in range(3)]
    assert {e.job_id for e in rec.of("completed")} == set(ids)
    assert [e.attempt for e in rec.of("claimed")] == [1, 1, 1]
    assert all(e.lane is not None for e in rec.of("completed"))


async def test_reports_made_together_go_in_one_batch(server: Faults, autojump_clock: Any) -> None:
    ids = [await server.add("echo", {"secs": 1}) for _ in range(4)]
    async with open_worker(server, "q", echo_registry(), lanes=4, batch=4, lease_secs=10, wait_secs=5):
        await server.wait_status(Status.COMPLETED, *ids)
    completes = [[i.job_id for i in items] for _, n, items in server.calls if n == "complete"]
    assert completes == [completes[0]] and sorted(completes[0]) == sorted(ids)


async def test_a_lease_asks_for_the_free_lanes(server: Faults, autojump_clock: Any) -> None:
    asked = count_leases(server)
    long = [await server.add("echo", {"secs": 30}, priority=1) for _ in range(3)]
    short = await server.add("echo", {"secs": 1})
    worker, _ = make_worker(server, echo_registry(), lanes=8)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, short)
        await server.wait_for(lambda: len(asked) >= 3)
        assert [await server.status(i) for i in long] == [Status.RUNNING] * 3
        worker.stop()
    # 8 lanes free, 4 jobs come; then 4 free (none of the 30 s jobs is
    # done), then 5 once the short one has finished.
    assert asked[:3] == [8, 4, 5]


async def test_by_default_a_worker_leases_again_while_a_full_lease_runs(server: Faults, autojump_clock: Any) -> None:
    # A lease carries at most 100 jobs; a worker with its default lanes
    # asks for the next 100 while those run, so short jobs keep it busy
    # and every lease and report carries a full batch.
    asked = count_leases(server)
    ids = [await server.add("echo", {"secs": 5}) for _ in range(120)]
    worker = Worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: worker.statistics().running == 120)
        await server.wait_status(Status.COMPLETED, *ids)
        worker.stop()
    assert asked[:2] == [100, 100]


async def test_with_a_backlog_a_worker_leases_ahead_within_its_free_lanes(
    server: Faults, autojump_clock: Any
) -> None:
    # Leases take a second: with one call at a time the lanes would idle
    # for a round trip per batch. Once an answer comes full, a second call
    # goes while the first is on its way; the calls never ask for more jobs
    # than there are free lanes, and once the queue is drained a single
    # long poll waits.
    server.slow["lease"] = 1
    ids = [await server.add("echo") for _ in range(450)]
    worker = Worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5)
    in_flight: list[int] = []  # max_jobs of the calls on their way
    most_in_flight = 0
    lease = server.lease

    async def watched_lease(queue: str, *, max_jobs: int, **kw: Any) -> list[Lease]:
        nonlocal most_in_flight
        assert sum(in_flight) + max_jobs + worker.statistics().running <= worker.lanes
        in_flight.append(max_jobs)
        most_in_flight = max(most_in_flight, len(in_flight))
        try:
            return await lease(queue, max_jobs=max_jobs, **kw)
        finally:
            in_flight.remove(max_jobs)

    server.lease = watched_lease  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, *ids)
        assert most_in_flight == 2
        await trio.sleep(3)
        assert len(in_flight) == 1  # the long poll
        worker.stop()
    first = server.times("lease")[:3]
    # The first answer (100 jobs, full) comes at 1 s; the next two go then.
    assert first[1] == first[2] and first[1] - first[0] >= 1


async def test_stop_lets_a_lease_call_made_ahead_land_and_runs_its_jobs(
    server: Faults, autojump_clock: Any
) -> None:
    # A call made ahead does not long-poll: the server claims its jobs at
    # once, and abandoning it at stop would leave them stranded until their
    # leases ran out. The long poll in flight is abandoned, as ever.
    server.slow_answer["lease"] = 1
    ids = [await server.add("echo") for _ in range(250)]
    worker = Worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5)
    asked: list[float] = []
    ahead: list[str] = []  # the jobs of the call that did not wait
    lease = server.lease

    async def watched_lease(queue: str, *, max_jobs: int, wait_secs: float, **kw: Any) -> list[Lease]:
        asked.append(wait_secs)
        leases = await lease(queue, max_jobs=max_jobs, wait_secs=wait_secs, **kw)
        if wait_secs == 0:
            ahead.extend(lease.job.id for lease in leases)
        return leases

    server.lease = watched_lease  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: len(asked) == 3)  # the first answer came full
        worker.stop()
    assert asked == [5, 5, 0]
    assert ahead and [await server.status(i) for i in ahead] == [Status.COMPLETED] * len(ahead)
    statuses = [await server.status(i) for i in ids]
    assert statuses.count(Status.COMPLETED) == 100 + len(ahead)  # the first answer's and the call made ahead's


async def test_none_result_completes_with_empty_object(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("nothing")
    async def nothing(job: Job) -> None:
        return None

    job_id = await server.add("nothing")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await server.wait_status(Status.COMPLETED, job_id)
    assert (await server.job(job_id)).result == {}


async def test_sync_handler_runs_in_a_thread(server: Faults) -> None:
    # Real clock: a thread's work is invisible to the autojump clock.
    seen: list[tuple[str, bool]] = []
    reg = Registry()

    @reg.handler("sync")
    def sync(job: Job) -> dict[str, Any]:
        seen.append((job.id, threading.current_thread() is threading.main_thread()))
        return {"ok": True}

    job_id = await server.add("sync")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=1):
        await server.wait_for(lambda: _is(server, job_id, Status.COMPLETED), timeout=5)
    assert seen == [(job_id, False)]
    assert (await server.job(job_id)).result == {"ok": True}


async def _is(server: Faults, job_id: str, status: Status) -> bool:
    return await server.status(job_id) is status


# --------------------------------------------------------------------------
# Failures of the handler


async def _first_error(server: Faults, job_id: str) -> bool:
    return bool((await server.job(job_id)).errors)


async def test_exception_fails_retryably_with_its_text(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("boom")
    async def boom(job: Job) -> dict[str, Any]:
        raise ValueError("bad size 0x0")

    job_id = await server.add("boom", max_attempts=5)
    worker, rec = make_worker(server, reg)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: _first_error(server, job_id))
        worker.stop()
    (entry, *_) = (await server.job(job_id)).errors
    assert "bad size 0x0" in entry.error and entry.attempt == 1
    assert server.fails(job_id)[0].retryable is True
    assert rec.of("failed")[0].retryable is True


async def test_the_last_attempts_failure_is_logged_as_dead_lettered(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("boom")
    async def boom(job: Job) -> dict[str, Any]:
        raise ValueError("bad size 0x0")

    job_id = await server.add("boom", max_attempts=2)
    worker, rec = make_worker(server, reg)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.FAILED, job_id)
        await server.wait_for(lambda: len(rec.of("failed")) == 2)
        worker.stop()
    first, last = rec.of("failed")
    assert (first.attempt, first.final, last.attempt, last.final) == (1, False, 2, True)
    assert "retryable" in str(first) and "dead-lettered" not in str(first)
    assert "its last attempt: dead-lettered" in str(last) and "retryable" not in str(last)


async def test_permanent_error_fails_without_retry(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("nope")
    async def nope(job: Job) -> dict[str, Any]:
        raise errors.PermanentError("image is not a PNG")

    job_id = await server.add("nope")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await server.wait_status(Status.FAILED, job_id)
    job = await server.job(job_id)
    assert [e.error for e in job.errors] == ["image is not a PNG"] and job.attempt == 1
    assert [i.retryable for i in server.fails(job_id)] == [False]


async def test_unknown_kind_fails_without_retry_naming_it(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("paint-fence")
    async with open_worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5):
        await server.wait_status(Status.FAILED, job_id)
    job = await server.job(job_id)
    assert job.attempt == 1 and "'paint-fence'" in (job.error or "")


async def test_handler_timeout_fails_retryably(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()
    cancelled = trio.Event()

    @reg.handler("slow", timeout=3)
    async def slow(job: Job) -> dict[str, Any]:
        try:
            await trio.sleep(100)
        finally:
            cancelled.set()
        return {}

    job_id = await server.add("slow")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await server.wait_for(lambda: _first_error(server, job_id))
        start = server.times("lease")[0]
        assert trio.current_time() - start < 4
    assert cancelled.is_set()
    assert server.fails(job_id)[0].retryable is True
    assert "timed out after 3 s" in (await server.job(job_id)).errors[0].error


async def test_a_jobs_timeout_cancels_its_handler_and_fails_it_with_the_servers_text(
    server: Faults, autojump_clock: Any
) -> None:
    reg = Registry()
    cancelled = trio.Event()

    @reg.handler("hang", timeout=100)  # the job's own timeout comes first
    async def hang(job: Job) -> dict[str, Any]:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    job_id = await server.add("hang", timeout_secs=4)
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await server.wait_for(lambda: _first_error(server, job_id))
        assert trio.current_time() - server.times("lease")[0] < 5
    assert cancelled.is_set()
    (fail,) = server.fails(job_id)[:1]
    assert (fail.error, fail.retryable) == ("timed out after 4 s", True)
    assert (await server.job(job_id)).errors[0].error == "timed out after 4 s"


async def test_snooze_puts_the_job_back_without_using_the_attempt(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()
    runs: list[float] = []

    @reg.handler("later")
    async def later(job: Job) -> dict[str, Any]:
        runs.append(trio.current_time())
        if len(runs) < 3:
            raise qftrio.Snooze(30)
        return {"runs": len(runs)}

    job_id = await server.add("later", max_attempts=1)
    rec_events: list[WorkerEvent] = []
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5, on_event=rec_events.append):
        await server.wait_status(Status.COMPLETED, job_id)
    job = await server.job(job_id)
    assert job.result == {"runs": 3} and job.attempt == 3 and job.max_attempts == 3 and job.errors == ()
    assert runs[1] - runs[0] >= 30 and runs[2] - runs[1] >= 30
    assert [e.delay for e in rec_events if e.type == "snoozed"] == [30, 30]


async def test_retry_in_fails_with_the_delay_asked_for(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()
    runs: list[float] = []

    @reg.handler("upstream")
    async def upstream(job: Job) -> dict[str, Any]:
        runs.append(trio.current_time())
        if len(runs) == 1:
            raise qftrio.RetryIn(120, "upstream said 429, Retry-After: 120")
        return {}

    job_id = await server.add("upstream", backoff={"initial_secs": 1, "jitter": 0})
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await server.wait_status(Status.COMPLETED, job_id)
    (fail,) = server.fails(job_id)
    assert (fail.error, fail.retry_in_secs) == ("upstream said 429, Retry-After: 120", 120)
    assert runs[1] - runs[0] >= 120
    assert (await server.job(job_id)).errors[0].error == "upstream said 429, Retry-After: 120"


async def test_result_that_is_not_an_object_fails(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("listy")
    async def listy(job: Job) -> Any:
        return [1, 2]

    job_id = await server.add("listy")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await server.wait_status(Status.FAILED, job_id)
    assert "expected a dict" in ((await server.job(job_id)).error or "")


async def test_result_with_a_number_json_cannot_hold_fails(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("nan")
    async def nan(job: Job) -> Any:
        return {"ratio": float("nan")}

    job_id = await server.add("nan")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await server.wait_status(Status.FAILED, job_id)
    job = await server.job(job_id)
    assert "handler result is not JSON" in (job.error or "") and job.result is None


# --------------------------------------------------------------------------
# Heartbeats


async def test_heartbeats_every_half_lease_keep_a_long_job(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo", {"secs": 35})
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, job_id)
        worker.stop()
    beats = server.times("heartbeat", job_id)
    claimed = server.times("lease")[0]
    assert len(beats) == 7  # at 5, 10, ... 35 s (the last races the completion)
    gaps = [b - a for a, b in itertools.pairwise([claimed, *beats])]
    assert all(5 - 1e-6 <= g <= 5 + 4 * LATENCY for g in gaps), gaps
    assert (await server.job(job_id)).attempt == 1
    assert not rec.of("lost")


async def test_a_slow_heartbeat_does_not_hold_back_a_finished_jobs_report(server: Faults, autojump_clock: Any) -> None:
    # The renewal at 5 s takes 3 s; the handler is done at 6 s, while it is
    # still on its way: the completion goes at once all the same.
    server.slow["heartbeat"] = 3
    job_id = await server.add("echo", {"secs": 6})
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, job_id)
        worker.stop()
    claimed = server.times("lease")[0]
    (beat,) = server.times("heartbeat", job_id)
    (report,) = server.times("complete", job_id)
    assert beat < claimed + 6 < report < claimed + 6 + 2 * LATENCY < beat + 3
    assert trio.current_time() < beat + 3  # nor does the stop wait for that renewal
    assert len(rec.of("completed")) == 1 and not rec.of("lost")


async def test_conflict_aborts_the_handler_and_reports_nothing(server: Faults, autojump_clock: Any) -> None:
    reg, cancelled_at = forever_registry()
    job_id = await server.add("forever")
    worker, rec = make_worker(server, reg, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: bool(rec.of("claimed")))
        await trio.sleep(1)
        await server.steal(job_id)
        await server.wait_for(lambda: bool(rec.of("lost")))
        worker.stop()
    assert len(cancelled_at) == 1 and cancelled_at[0] <= server.times("lease")[0] + 5 + 1
    assert server.reports(job_id) == []
    assert "409" in (rec.of("lost")[0].error or "")
    assert (await server.job(job_id)).worker_id == "thief"


async def test_cancelled_status_aborts_the_handler_within_one_interval(server: Faults, autojump_clock: Any) -> None:
    reg, cancelled_at = forever_registry()
    job_id = await server.add("forever")
    worker, rec = make_worker(server, reg, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: bool(rec.of("claimed")))
        await trio.sleep(7)
        t_cancel = trio.current_time()
        await server.cancel(job_id)
        await server.wait_for(lambda: bool(rec.of("lost")))
        worker.stop()
    assert cancelled_at[0] - t_cancel <= 5 + 0.1
    assert server.reports(job_id) == []
    assert rec.of("lost")[0].error == "the job is cancelled"
    assert await server.status(job_id) is Status.CANCELLED


async def test_failing_renewals_abort_before_the_lease_ends_with_a_retryable_fail(
    server: Faults, autojump_clock: Any
) -> None:
    reg, cancelled_at = forever_registry()
    job_id = await server.add("forever")
    worker, rec = make_worker(server, reg, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: bool(rec.of("claimed")))
        server.down.add("heartbeat")
        await server.wait_for(lambda: bool(rec.of("failed")))
        job = await server.job(job_id)
        worker.stop()
    lease_end = server.times("lease")[0] + 10
    assert lease_end - worker.abort_margin_secs - 0.1 <= cancelled_at[0] < lease_end
    assert len(server.times("heartbeat", job_id)) > 1  # renewals were retried
    assert server.fails(job_id)[0].retryable is True
    assert job.errors[0].error.startswith("lease about to expire") and job.status is Status.PENDING
    assert rec.of("failed")[0].retryable is True


async def test_jobs_waiting_for_a_lane_are_heartbeated(server: Faults, autojump_clock: Any) -> None:
    ids = [await server.add("echo", {"secs": 12}, priority=3 - n) for n in range(3)]
    worker, rec = make_worker(server, echo_registry(), lanes=1, batch=3, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, *ids)
        worker.stop()
    assert [(await server.job(i)).attempt for i in ids] == [1, 1, 1]  # nobody's lease ran out
    # The third job started only after ~24 s, and was heartbeated all along.
    beats = server.times("heartbeat", ids[2])
    assert beats[0] < 6 and len([b for b in beats if b < 24]) >= 4
    assert [(e.job_id, e.lane) for e in rec.of("claimed")] == [(ids[0], 1), (ids[1], None), (ids[2], None)]
    assert len(rec.of("completed")) == 3


# --------------------------------------------------------------------------
# Reports


async def test_reports_are_retried_until_they_land(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo")
    server.down.add("complete")
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: len(server.times("complete")) >= 3)
        server.down.discard("complete")
        await server.wait_status(Status.COMPLETED, job_id)
        worker.stop()
    assert len(rec.of("completed")) == 1 and not rec.of("unreported")


async def test_a_report_whose_answer_is_lost_is_sent_again_and_lands_once(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo")
    server.lose.add("complete")
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: len(server.times("complete")) >= 2)
        server.lose.discard("complete")
        await server.wait_for(lambda: bool(rec.of("completed")))
        worker.stop()
    job = await server.job(job_id)
    assert job.status is Status.COMPLETED and job.attempt == 1 and job.result == {"echo": {}}
    assert len(rec.of("completed")) == 1 and not rec.of("lost")


async def test_reports_are_given_up_when_the_lease_ends(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo")
    server.down.add("complete")
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: bool(rec.of("unreported")))
        worker.stop()
    (t,) = [t for t, e in rec.events if e.type == "unreported"]
    lease = server.lease_of(job_id)
    lease_end = server.times("lease")[0] + 10
    assert lease_end <= t <= lease_end + 0.1
    tries = server.tries("complete", lease)
    assert len(tries) >= 4 and tries[-1] < lease_end
    assert "connection refused" in (rec.of("unreported")[0].error or "")
    assert await server.status(job_id) is Status.RUNNING


async def test_a_report_call_in_flight_when_the_lease_ends_gets_its_time(server: Faults, autojump_clock: Any) -> None:
    # Each complete takes 6 s and fails (a server that times out): the
    # second one is in flight when the lease ends, and is let finish; no
    # call starts after the lease's end.
    job_id = await server.add("echo")
    server.down.add("complete")
    server.slow["complete"] = 6
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: bool(rec.of("unreported")))
        worker.stop()
    t = next(t for t, e in rec.events if e.type == "unreported")
    lease_end = server.times("lease")[0] + 10
    tries = server.tries("complete", server.lease_of(job_id))
    assert len(tries) == 2 and lease_end < tries[-1] + 6
    assert tries[-1] + 6 <= t <= tries[-1] + 6 + 2 * LATENCY


async def test_late_report_refused_is_lost(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("steal-me")
    async def steal_me(job: Job) -> dict[str, Any]:
        await server.steal(job.id)  # reclaimed while we worked, no heartbeat in between
        return {}

    job_id = await server.add("steal-me")
    worker, rec = make_worker(server, reg)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: bool(rec.of("lost")))
        worker.stop()
    assert server.reports(job_id) == ["complete"]
    assert not rec.of("completed")
    assert await server.status(job_id) is Status.RUNNING  # the thief's


# --------------------------------------------------------------------------
# Leasing


async def test_lease_backs_off_with_jitter_and_rides_out_an_outage(server: Faults, autojump_clock: Any) -> None:
    server.down.add("lease")
    worker, rec = make_worker(server, echo_registry())
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(60)
        delays = [e.delay or 0 for e in rec.of("waiting")]
        server.down.discard("lease")
        job_id = await server.add("echo")
        await server.wait_status(Status.COMPLETED, job_id)
        worker.stop()
    base, cap = runtime_mod.LEASE_BACKOFF["base"], runtime_mod.LEASE_BACKOFF["cap"]
    assert 5 <= len(delays) <= 20
    for n, d in enumerate(delays, 1):
        assert 0.5 * min(cap, base * 2 ** (n - 1)) <= d <= min(cap, base * 2 ** (n - 1))
    assert max(delays) <= cap
    assert "connection refused" in (rec.of("waiting")[0].error or "")


async def test_unauthorized_stops_the_worker_with_a_clear_error(server: Faults, autojump_clock: Any) -> None:
    server.refuse = True
    worker, _ = make_worker(server, echo_registry())
    with pytest.raises(errors.Unauthorized, match="unknown token"):
        await worker.run()


@pytest.mark.parametrize(
    "refusal",
    [
        errors.InvalidInput("worker_id: String should have at most 200 characters"),
        errors.NotFound("<html>Not Found"),
        # what a plain web server at the URL answers: it would answer the same for ever
        errors.error_for_status(405, None, "the answer is not qftrio's (text/html): is the URL a qftrio server?"),
        errors.error_for_status(501, None, "the answer is not qftrio's (text/html): is the URL a qftrio server?"),
    ],
)
async def test_a_lease_request_refused_stops_the_worker(
    server: Faults, autojump_clock: Any, refusal: errors.ApiError
) -> None:
    async def refuse(queue: str, **kw: Any) -> list[Lease]:
        raise refusal

    server.lease = refuse  # type: ignore[method-assign]
    worker, rec = make_worker(server, echo_registry())
    with trio.fail_after(60), pytest.raises(type(refusal)):
        await worker.run()
    assert not rec.of("waiting")


@pytest.mark.parametrize("status", [502, 503, 504, 429, 500])
async def test_answers_that_may_change_are_ridden_out(server: Faults, autojump_clock: Any, status: int) -> None:
    answers = [errors.error_for_status(status, None, "<html>Bad Gateway</html>")] * 3
    real_lease = server.lease

    async def flaky(queue: str, **kw: Any) -> list[Lease]:
        if answers:
            raise answers.pop()
        return await real_lease(queue, **kw)

    server.lease = flaky  # type: ignore[method-assign]
    job_id = await server.add("echo")
    worker, rec = make_worker(server, echo_registry())
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, job_id)
        worker.stop()
    assert len(rec.of("waiting")) == 3


async def test_a_heartbeat_answered_by_something_else_stops_the_worker(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo", {"secs": 100})

    async def not_qftrio(items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        raise errors.error_for_status(501, None, "the answer is not qftrio's (text/html)")

    server.heartbeat = not_qftrio  # type: ignore[method-assign]
    worker, _ = make_worker(server, echo_registry())
    with trio.fail_after(60), pytest.raises(errors.ApiError) as raised:
        await worker.run()
    assert raised.value.status_code == 501
    assert trio.current_time() < 6  # at the first heartbeat
    assert server.reports(job_id) == []


async def test_unauthorized_heartbeat_stops_the_worker(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo", {"secs": 100})

    async def revoke() -> None:
        await server.wait_for(lambda: bool(server.leased))
        server.refuse = True

    worker, _ = make_worker(server, echo_registry())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(revoke)
        with pytest.raises(errors.Unauthorized):
            await worker.run()
    assert trio.current_time() < 6  # at the first heartbeat
    assert server.reports(job_id) == []


# --------------------------------------------------------------------------
# Stopping


async def test_stop_drains_held_jobs_and_leases_no_more(server: Faults, autojump_clock: Any) -> None:
    ids = [await server.add("echo", {"secs": 8}) for _ in range(2)]
    worker, rec = make_worker(server, echo_registry(), lanes=2, batch=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.RUNNING, *ids)
        late = await server.add("echo")
        worker.stop()
        stopped_at = trio.current_time()
        assert worker.statistics().stopping
    assert trio.current_time() - stopped_at >= 7
    assert all([await server.status(i) is Status.COMPLETED for i in ids])
    assert await server.status(late) is Status.PENDING
    assert rec.of("stopping")


async def test_shutdown_timeout_cancels_held_jobs_that_outlast_it(server: Faults, autojump_clock: Any) -> None:
    reg, cancelled_at = forever_registry()
    job_id = await server.add("forever")
    worker, rec = make_worker(server, reg, shutdown_timeout=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.RUNNING, job_id)
        worker.stop()
        stopped_at = trio.current_time()
    assert cancelled_at == [pytest.approx(stopped_at + 5)]
    assert trio.current_time() == pytest.approx(stopped_at + 5)
    assert worker.statistics().cancelled
    # nothing reported: the lease expires and another worker runs the job
    assert server.reports(job_id) == [] and await server.status(job_id) is Status.RUNNING


async def test_jobs_done_within_the_shutdown_timeout_report_as_usual(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo", {"secs": 3})
    worker, rec = make_worker(server, echo_registry(), shutdown_timeout=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.RUNNING, job_id)
        worker.stop()
    assert await server.status(job_id) is Status.COMPLETED
    assert not worker.statistics().cancelled


async def test_cancel_stops_at_once_and_reports_nothing(server: Faults, autojump_clock: Any) -> None:
    ids = [await server.add("echo", {"secs": 100}) for _ in range(2)]
    worker, rec = make_worker(server, echo_registry(), lanes=2, batch=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.RUNNING, *ids)
        worker.cancel()
        t = trio.current_time()
    assert trio.current_time() - t < 0.1
    assert all([await server.status(i) is Status.RUNNING for i in ids])
    assert all(server.reports(i) == [] for i in ids)


async def test_cancel_ends_a_heartbeat_batch_in_flight(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo", {"secs": 100})
    server.slow["heartbeat"] = 30
    worker, rec = make_worker(server, echo_registry())
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: bool(server.times("heartbeat", job_id)))
        worker.cancel()
        t = trio.current_time()
    assert trio.current_time() - t < 0.1


async def test_open_worker_drains_on_exit(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo", {"secs": 3})
    async with open_worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5) as worker:
        await server.wait_status(Status.RUNNING, job_id)
        assert worker.statistics().held == 1
    assert await server.status(job_id) is Status.COMPLETED


async def test_open_worker_cancels_on_error(server: Faults, autojump_clock: Any) -> None:
    job_id = await server.add("echo", {"secs": 100})
    with pytest.raises(KeyError):
        async with open_worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5):
            await server.wait_status(Status.RUNNING, job_id)
            raise KeyError("x")
    assert server.reports(job_id) == []


def test_bad_options_are_refused() -> None:
    reg = echo_registry()
    transport = Faults.__new__(Faults)
    for kw in ({"lanes": 0}, {"batch": 101}, {"lease_secs": 0}, {"wait_secs": 61}, {"worker_id": "w" * 201},
               {"shutdown_timeout": 0}, {"warn_blocked_secs": -1}, {"shutdown_timeout": float("nan")}):  # fmt: skip
        with pytest.raises(errors.ConfigError):
            Worker(transport, "q", reg, **kw)
    with pytest.raises(errors.ConfigError):
        Worker(transport, "bad queue", reg)


def test_lanes_not_given_or_none_are_the_default() -> None:
    # The command line and serve --handlers pass what their --lanes was: None
    # when it was not given.
    transport = Faults.__new__(Faults)
    assert Worker(transport, "q", echo_registry()).lanes == 200
    assert Worker(transport, "q", echo_registry(), lanes=None).lanes == 200
    assert Worker(transport, "q", echo_registry(), lanes=7).lanes == 7


def test_a_registry_with_no_handler_is_refused() -> None:
    with pytest.raises(errors.ConfigError, match="no handlers"):
        Worker(Faults.__new__(Faults), "q", Registry())


def test_default_worker_id_is_host_pid() -> None:
    import os
    import socket

    w = Worker(Faults.__new__(Faults), "q", echo_registry())
    assert w.worker_id == f"{socket.gethostname()}-{os.getpid()}"


async def test_lease_is_reckoned_from_the_claim_not_the_long_poll(server: Faults, autojump_clock: Any) -> None:
    worker, rec = make_worker(server, echo_registry(), lease_secs=10, wait_secs=20)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(15)  # the long poll has been waiting longer than a lease
        job_id = await server.add("echo", {"secs": 3})
        await server.wait_status(Status.COMPLETED, job_id)
        worker.stop()
    assert not rec.of("unreported") and not rec.of("lost")
    assert server.reports(job_id) == ["complete"]


async def test_empty_answers_that_did_not_wait_are_not_spun_on(
    server: Faults, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def impatient_lease(queue: str, **kw: Any) -> list[Lease]:
        server.calls.append((trio.current_time(), "lease", []))
        await trio.sleep(LATENCY)
        return []  # like a server shutting down: no wait

    monkeypatch.setattr(server, "lease", impatient_lease)
    worker, _ = make_worker(server, echo_registry(), wait_secs=20)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(10)
        worker.stop()
    assert 10 <= len(server.times("lease")) <= 45


# --------------------------------------------------------------------------
# Heartbeats follow each job's own claim


async def test_a_job_claimed_later_is_heartbeated_from_its_own_claim(server: Faults, autojump_clock: Any) -> None:
    first = await server.add("echo", {"secs": 12})
    worker, rec = make_worker(server, echo_registry(), lanes=2, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(6)  # the first job heartbeats; nothing else is held
        second = await server.add("echo", {"secs": 12})
        added = trio.current_time()  # the long poll answers at once
        await server.wait_status(Status.COMPLETED, first, second)
        worker.stop()
    # The worker reckons the second lease from its answer, less CLAIM_SLACK.
    for job_id, claimed in ((first, server.times("lease")[0]), (second, added - runtime_mod.CLAIM_SLACK)):
        beats = server.times("heartbeat", job_id)
        assert len(beats) == 2, beats  # at claim + 5 and claim + 10
        gaps = [b - a for a, b in itertools.pairwise([claimed, *beats])]
        assert all(5 - 1e-6 <= g <= 5 + 4 * LATENCY for g in gaps), (job_id, gaps)
    assert [(await server.job(i)).attempt for i in (first, second)] == [1, 1]
    assert not rec.of("lost") and len(rec.of("completed")) == 2


async def test_short_jobs_are_never_heartbeated(server: Faults, autojump_clock: Any) -> None:
    ids = [await server.add("echo", {"secs": 1}) for _ in range(6)]
    worker, rec = make_worker(server, echo_registry(), lanes=2, batch=2, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, *ids)
        await trio.sleep(20)
        worker.stop()
    assert server.times("heartbeat") == []
    assert len(rec.of("completed")) == 6


async def test_job_cancelled_while_waiting_for_a_lane_never_runs(server: Faults, autojump_clock: Any) -> None:
    started: list[str] = []
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> dict[str, Any]:
        started.append(job.id)
        await trio.sleep(job.payload["secs"])
        return {}

    running = await server.add("work", {"secs": 20}, priority=1)
    waiting = await server.add("work", {"secs": 1})
    worker, rec = make_worker(server, reg, lanes=1, batch=2, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.RUNNING, waiting)
        await trio.sleep(1)
        await server.cancel(waiting)
        await server.wait_for(lambda: bool(rec.of("lost")))
        (t_lost,) = [t for t, e in rec.events if e.type == "lost"]
        assert t_lost <= server.times("lease")[0] + 5 + 0.1  # at its first heartbeat
        assert worker.statistics().held == 1
        await server.wait_status(Status.COMPLETED, running)
        worker.stop()
    assert started == [running]
    assert server.reports(waiting) == []
    lost = rec.of("lost")[0]
    assert lost.job_id == waiting and lost.lane is None and lost.error == "the job is cancelled"


async def test_no_handler_starts_after_a_hard_stop(server: Faults, autojump_clock: Any) -> None:
    started: list[str] = []
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> dict[str, Any]:
        started.append(job.id)  # before any checkpoint
        return {}

    ids = [await server.add("work") for _ in range(3)]
    worker: Worker

    def on_event(event: WorkerEvent) -> None:
        if event.type == "claimed":
            worker.cancel()  # while the lease loop hands the jobs out

    worker = Worker(server, "q", reg, lanes=4, batch=3, lease_secs=10, wait_secs=5, worker_id="w1", on_event=on_event)
    with trio.fail_after(5):
        await worker.run()
    assert started == []
    assert all(server.reports(i) == [] for i in ids)
    assert worker.statistics().held == 0


async def test_abort_whose_fail_cannot_land_is_unreported(server: Faults, autojump_clock: Any) -> None:
    reg, cancelled_at = forever_registry()
    job_id = await server.add("forever")
    server.down.update({"heartbeat", "fail"})
    worker, rec = make_worker(server, reg, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_for(lambda: bool(rec.of("unreported")))
        worker.stop()
    (t,) = [t for t, e in rec.events if e.type == "unreported"]
    lease_end = server.times("lease")[0] + 10
    assert cancelled_at and cancelled_at[0] < lease_end
    assert lease_end <= t <= lease_end + 0.1
    fails = server.tries("fail", server.lease_of(job_id))
    assert fails and fails[-1] < lease_end
    assert not rec.of("failed") and not rec.of("lost")
    assert "connection refused" in (rec.of("unreported")[0].error or "")
    assert await server.status(job_id) is Status.RUNNING


async def test_leases_again_while_a_report_is_in_flight(server: Faults, autojump_clock: Any) -> None:
    server.slow["complete"] = 1  # completions take a second to land
    first, second = await server.add("echo", priority=1), await server.add("echo")
    worker, rec = make_worker(server, echo_registry(), lanes=1, batch=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await server.wait_status(Status.COMPLETED, first, second)
        worker.stop()
    claimed = {e.job_id: t for t, e in rec.events if e.type == "claimed"}
    completed = {e.job_id: t for t, e in rec.events if e.type == "completed"}
    # One lane, and its job's handler is done: the next job is leased while
    # the first one's completion is still on its way.
    assert claimed[second] < completed[first]


# --------------------------------------------------------------------------
# A blocked event loop


async def test_a_blocking_call_in_an_async_handler_is_named_in_a_warning(
    server: Faults, caplog: pytest.LogCaptureFixture
) -> None:
    """On the real clock: ``time.sleep`` blocks the loop for real, which
    Trio's mock clock does not see. The lease (1 s) runs out meanwhile, so
    the job's report is lost, as the warning says it may be."""
    reg = Registry()

    @reg.handler("blocks")
    async def blocks(job: Job) -> dict[str, Any]:
        time.sleep(1.5)  # the mistake: a blocking call in an async handler
        return {}

    job_id = await server.add("blocks")
    worker, rec = make_worker(server, reg, lease_secs=1, warn_blocked_secs=0.5)
    with caplog.at_level(logging.WARNING, logger="qftrio.worker"):
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await server.wait_for(lambda: bool(rec.of("completed") or rec.of("lost") or rec.of("unreported")))
            worker.stop()
    # (a machine busy enough to starve the process may add warnings of its own)
    (warning, *_) = [w for r in caplog.records if f"job {job_id} (blocks)" in (w := r.getMessage()) and "blocked" in w]
    assert warning.startswith("the Trio loop was blocked for ")
    assert "blocking call in an async handler" in warning and "trio.to_thread.run_sync" in warning


async def test_an_add_of_steps_whose_answer_was_lost_is_sent_again_and_lands_once(
    server: Faults, autojump_clock: Any
) -> None:
    reg = Registry()
    grown: list[Workflow] = []

    @reg.handler("split")
    async def split(job: Job) -> dict[str, Any]:
        steps = [{"name": f"page-{i}", "kind": "page", "payload": {"page": i}} for i in range(3)]
        grown.append(await job.add_steps(steps, collect="pages"))
        return {}

    @reg.handler("page")
    async def page(job: Job) -> dict[str, Any]:
        return {"page": job.payload["page"]}

    @reg.handler("join")
    async def join(job: Job) -> dict[str, Any]:
        return {"joined": len(job.context["pages"])}

    body = WorkflowCreateRequest(
        name="pdf",
        steps=[{"name": "split", "kind": "split"}, {"name": "join", "kind": "join", "depends_on": ["split"]}],
    )
    workflow = await server.engine.workflow_create(TENANT, body)
    server.lose.add("steps_add")

    async def finished() -> bool:
        return (await server.engine.workflow_get(TENANT, workflow.id)).status is WorkflowStatus.COMPLETED

    async with open_worker(server, "default", reg, lease_secs=10, wait_secs=5):
        await server.wait_for(lambda: len(server.times("steps_add")) == 2)
        server.lose.clear()
        await server.wait_for(finished)
    done = await server.engine.workflow_get(TENANT, workflow.id)
    assert len(server.times("steps_add")) == 3 and len(grown) == 1
    assert [s.added_by for s in done.steps] == [None, None, "split", "split", "split"]
    # each result is merged too, as any step's (the last completed wins "page")
    assert (done.context["pages"], done.context["joined"]) == ([{"page": 0}, {"page": 1}, {"page": 2}], 3)


async def test_add_steps_outside_a_handler_or_with_bad_steps_fails_at_once(server: Faults, autojump_clock: Any) -> None:
    reg = Registry()
    raised: list[BaseException] = []

    @reg.handler("split")
    async def split(job: Job) -> dict[str, Any]:
        with pytest.raises(errors.InvalidInput, match=r"steps\.0\.kind"):
            await job.add_steps([{"name": "x", "kind": "bad kind!"}])
        with pytest.raises(errors.InvalidInput, match="not a workflow step"):
            await job.add_steps([{"name": "x", "kind": "k"}])
        raised.append(RuntimeError())
        return {}

    job_id = await server.add("split")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await server.wait_status(Status.COMPLETED, job_id)
    assert raised and server.times("steps_add")  # the second reached the server
    with pytest.raises(RuntimeError, match="inside a handler"):
        await (await server.job(job_id)).add_steps([{"name": "x", "kind": "k"}])
