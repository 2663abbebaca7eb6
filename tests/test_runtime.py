"""The worker runtime, on Trio's deterministic clock, against an in-memory
server (:class:`FakeServer`): a small but real implementation of the
protocol's rules, with switches to break its network."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import trio

import qftrio.worker.runtime as runtime_mod
from qftrio import errors
from qftrio.models import Job, Lease, Status
from qftrio.worker import Registry, Worker, WorkerEvent, open_worker
from qftrio.worker.transport import (
    Batcher,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    HeartbeatReply,
    ReportReply,
    Transport,
)

LATENCY = 0.01


@dataclasses.dataclass
class Row:
    id: str
    kind: str
    payload: dict[str, Any]
    status: Status = Status.PENDING
    attempt: int = 0
    max_attempts: int = 5
    token: str | None = None
    locked_until: float | None = None
    result: dict[str, Any] | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    retryable: list[bool] = dataclasses.field(default_factory=list)
    seq: int = 0

    def job(self) -> Job:
        return Job(
            id=self.id,
            tenant="t",
            queue="q",
            kind=self.kind,
            payload=self.payload,
            status=self.status,
            priority=0,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            scheduled_at=0.0,
            created_at=0.0,
            updated_at=0.0,
            locked_until=self.locked_until,
        )


class FakeServer(Transport):
    """The protocol's rules in memory, timed by Trio's clock.

    ``down`` holds the names of calls ("lease", "heartbeat", "complete",
    "fail") that currently fail with a TransportError; ``slow`` maps names
    to seconds each such call takes on top; ``refuse`` makes every call
    answer 401.
    """

    coalesce_secs = 0.005

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.down: set[str] = set()
        self.slow: dict[str, float] = {}
        self.refuse = False
        self.calls: list[tuple[float, str, list[str]]] = []
        self._seq = itertools.count()
        self._new = trio.Event()

    # -- test helpers --------------------------------------------------------

    def add(self, kind: str = "echo", payload: dict[str, Any] | None = None, *, max_attempts: int = 5) -> str:
        row = Row(id=str(uuid.uuid4()), kind=kind, payload=payload or {}, max_attempts=max_attempts)
        row.seq = next(self._seq)
        self.rows[row.id] = row
        self._new.set()
        self._new = trio.Event()
        return row.id

    def cancel(self, job_id: str) -> None:
        self.rows[job_id].status = Status.CANCELLED

    def steal(self, job_id: str) -> None:
        """Another worker reclaimed the job: the token changes."""
        self.rows[job_id].token = str(uuid.uuid4())

    def times(self, name: str, job_id: str | None = None) -> list[float]:
        return [t for t, n, ids in self.calls if n == name and (job_id is None or job_id in ids)]

    def reports(self, job_id: str) -> list[str]:
        return [n for _, n, ids in self.calls if n in ("complete", "fail") and job_id in ids]

    async def _enter(self, name: str, ids: list[str]) -> None:
        self.calls.append((trio.current_time(), name, ids))
        await trio.sleep(LATENCY + self.slow.get(name, 0))
        if self.refuse:
            raise errors.Unauthorized("unknown token")
        if name in self.down:
            raise errors.TransportError(f"{name}: connection refused")

    # -- the protocol --------------------------------------------------------

    async def lease(
        self, queue: str, *, max_jobs: int, lease_secs: int, wait_secs: float, worker_id: str | None
    ) -> list[Lease]:
        await self._enter("lease", [])
        deadline = trio.current_time() + wait_secs
        while True:
            now = trio.current_time()
            ready = sorted(
                (
                    r
                    for r in self.rows.values()
                    if r.status is Status.PENDING
                    or (r.status is Status.RUNNING and r.locked_until is not None and r.locked_until < now)
                ),
                key=lambda r: r.seq,
            )[:max_jobs]
            if ready:
                out = []
                for r in ready:
                    r.status, r.attempt, r.token = Status.RUNNING, r.attempt + 1, str(uuid.uuid4())
                    r.locked_until = now + lease_secs
                    out.append(Lease(job=r.job(), lease_token=r.token))
                return out
            if now >= deadline:
                return []
            with trio.move_on_at(deadline):
                await self._new.wait()

    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        await self._enter("heartbeat", [i.job_id for i in items])
        now = trio.current_time()
        out = []
        for i in items:
            r = self.rows.get(i.job_id)
            if r is None:
                out.append(HeartbeatReply(job_id=i.job_id, code=404))
            elif r.token != i.lease_token:
                out.append(HeartbeatReply(job_id=i.job_id, code=409))
            elif r.status is not Status.RUNNING:
                out.append(HeartbeatReply(job_id=i.job_id, code=200, status=r.status.value))
            else:
                # An expired lease nobody reclaimed yet is still ours.
                r.locked_until = now + i.extend_secs
                out.append(HeartbeatReply(job_id=i.job_id, code=200, status="running", locked_until=r.locked_until))
        return out

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        await self._enter("complete", [i.job_id for i in items])
        out = []
        for i in items:
            r = self.rows.get(i.job_id)
            if r is None:
                code = 404
            elif r.token != i.lease_token or r.status not in (Status.RUNNING, Status.COMPLETED):
                code = 409
            else:
                r.status, r.result, r.locked_until = Status.COMPLETED, i.result, None
                code = 204
            out.append(ReportReply(job_id=i.job_id, code=code))
        return out

    async def fail(self, items: Sequence[FailItem]) -> list[ReportReply]:
        await self._enter("fail", [i.job_id for i in items])
        out = []
        for i in items:
            r = self.rows.get(i.job_id)
            if r is None:
                code = 404
            elif r.token != i.lease_token or r.status is not Status.RUNNING:
                code = 409
            else:
                r.errors.append(i.error)
                r.retryable.append(i.retryable)
                retry = i.retryable and r.attempt < r.max_attempts
                r.status = Status.PENDING if retry else Status.FAILED
                r.locked_until = None
                code = 204
            out.append(ReportReply(job_id=i.job_id, code=code))
        return out


# --------------------------------------------------------------------------


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[float, WorkerEvent]] = []

    def __call__(self, event: WorkerEvent) -> None:
        self.events.append((trio.current_time(), event))

    def of(self, type: str) -> list[WorkerEvent]:
        return [e for _, e in self.events if e.type == type]

    def time_of(self, type: str) -> float:
        return next(t for t, e in self.events if e.type == type)


def make_worker(server: FakeServer, registry: Registry, **kw: Any) -> tuple[Worker, Recorder]:
    rec = Recorder()
    kw.setdefault("lease_secs", 10)
    kw.setdefault("wait_secs", 5)
    kw.setdefault("worker_id", "w1")
    return Worker(server, "q", registry, on_event=rec, **kw), rec


async def wait_for(predicate: Any, timeout: float = 600) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


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


async def test_completes_jobs_with_their_results(server: FakeServer, autojump_clock: Any) -> None:
    ids = [server.add("echo", {"n": n}) for n in range(3)]
    worker, rec = make_worker(server, echo_registry())
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: all(server.rows[i].status is Status.COMPLETED for i in ids))
        worker.stop()
    assert [server.rows[i].result for i in ids] == [{"echo": {"n": n}} for n in range(3)]
    assert {e.job_id for e in rec.of("completed")} == set(ids)
    assert [e.attempt for e in rec.of("claimed")] == [1, 1, 1]
    assert all(e.lane is not None for e in rec.of("completed"))


async def test_reports_made_together_go_in_one_batch(server: FakeServer, autojump_clock: Any) -> None:
    ids = [server.add("echo", {"secs": 1}) for _ in range(4)]
    worker, _ = make_worker(server, echo_registry(), lanes=4, batch=4)
    async with open_worker(server, "q", echo_registry(), lanes=4, batch=4, lease_secs=10, wait_secs=5):
        await wait_for(lambda: all(server.rows[i].status is Status.COMPLETED for i in ids))
    completes = [ids_ for _, n, ids_ in server.calls if n == "complete"]
    assert completes == [completes[0]] and sorted(completes[0]) == sorted(ids)


async def test_none_result_completes_with_empty_object(server: FakeServer, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("nothing")
    async def nothing(job: Job) -> None:
        return None

    job_id = server.add("nothing")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await wait_for(lambda: server.rows[job_id].status is Status.COMPLETED)
    assert server.rows[job_id].result == {}


async def test_sync_handler_runs_in_a_thread(server: FakeServer) -> None:
    # Real clock: a thread's work is invisible to the autojump clock.
    seen: list[tuple[str, bool]] = []
    reg = Registry()

    @reg.handler("sync")
    def sync(job: Job) -> dict[str, Any]:
        seen.append((job.id, threading.current_thread() is threading.main_thread()))
        return {"ok": True}

    job_id = server.add("sync")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=1):
        await wait_for(lambda: server.rows[job_id].status is Status.COMPLETED, timeout=5)
    assert seen == [(job_id, False)]
    assert server.rows[job_id].result == {"ok": True}


# --------------------------------------------------------------------------
# Failures of the handler


async def test_exception_fails_retryably_with_its_text(server: FakeServer, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("boom")
    async def boom(job: Job) -> dict[str, Any]:
        raise ValueError("bad size 0x0")

    job_id = server.add("boom", max_attempts=5)
    worker, rec = make_worker(server, reg)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: server.rows[job_id].errors)
        worker.stop()
    row = server.rows[job_id]
    assert row.retryable[0] is True and "bad size 0x0" in row.errors[0]
    assert rec.of("failed")[0].retryable is True


async def test_permanent_error_fails_without_retry(server: FakeServer, autojump_clock: Any) -> None:
    from qftrio.errors import PermanentError

    reg = Registry()

    @reg.handler("nope")
    async def nope(job: Job) -> dict[str, Any]:
        raise PermanentError("image is not a PNG")

    job_id = server.add("nope")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await wait_for(lambda: server.rows[job_id].status is Status.FAILED)
    assert server.rows[job_id].errors == ["image is not a PNG"]
    assert server.rows[job_id].retryable == [False]


async def test_unknown_kind_fails_without_retry_naming_it(server: FakeServer, autojump_clock: Any) -> None:
    job_id = server.add("paint-fence")
    async with open_worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5):
        await wait_for(lambda: server.rows[job_id].status is Status.FAILED)
    assert server.rows[job_id].retryable == [False]
    assert "'paint-fence'" in server.rows[job_id].errors[0]


async def test_handler_timeout_fails_retryably(server: FakeServer, autojump_clock: Any) -> None:
    reg = Registry()
    cancelled = trio.Event()

    @reg.handler("slow", timeout=3)
    async def slow(job: Job) -> dict[str, Any]:
        try:
            await trio.sleep(100)
        finally:
            cancelled.set()
        return {}

    job_id = server.add("slow")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await wait_for(lambda: server.rows[job_id].errors)
        start = server.times("lease")[0]
        assert trio.current_time() - start < 4
    assert cancelled.is_set()
    assert server.rows[job_id].retryable == [True] and "timed out after 3 s" in server.rows[job_id].errors[0]


async def test_result_that_is_not_an_object_fails(server: FakeServer, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("listy")
    async def listy(job: Job) -> Any:
        return [1, 2]

    job_id = server.add("listy")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await wait_for(lambda: server.rows[job_id].status is Status.FAILED)
    assert "expected a dict" in server.rows[job_id].errors[0]


async def test_result_with_a_number_json_cannot_hold_fails(server: FakeServer, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("nan")
    async def nan(job: Job) -> Any:
        return {"ratio": float("nan")}

    job_id = server.add("nan")
    async with open_worker(server, "q", reg, lease_secs=10, wait_secs=5):
        await wait_for(lambda: server.rows[job_id].status is Status.FAILED)
    assert "handler result is not JSON" in server.rows[job_id].errors[0]
    assert server.rows[job_id].result is None


# --------------------------------------------------------------------------
# Heartbeats


async def test_heartbeats_every_half_lease_keep_a_long_job(server: FakeServer, autojump_clock: Any) -> None:
    job_id = server.add("echo", {"secs": 35})
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: server.rows[job_id].status is Status.COMPLETED)
        worker.stop()
    beats = server.times("heartbeat", job_id)
    claimed = server.times("lease")[0]
    assert len(beats) == 7  # at 5, 10, ... 35 s (the last races the completion)
    gaps = [b - a for a, b in itertools.pairwise([claimed, *beats])]
    assert all(5 - 1e-6 <= g <= 5 + 4 * LATENCY for g in gaps), gaps
    assert server.rows[job_id].attempt == 1
    assert not rec.of("lost")


async def test_conflict_aborts_the_handler_and_reports_nothing(server: FakeServer, autojump_clock: Any) -> None:
    reg, cancelled_at = forever_registry()
    job_id = server.add("forever")
    worker, rec = make_worker(server, reg, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: server.rows[job_id].status is Status.RUNNING)
        await trio.sleep(1)
        server.steal(job_id)
        await wait_for(lambda: bool(rec.of("lost")))
        worker.stop()
    assert len(cancelled_at) == 1 and cancelled_at[0] <= server.times("lease")[0] + 5 + 1
    assert server.reports(job_id) == []
    assert "409" in (rec.of("lost")[0].error or "")


async def test_cancelled_status_aborts_the_handler_within_one_interval(server: FakeServer, autojump_clock: Any) -> None:
    reg, cancelled_at = forever_registry()
    job_id = server.add("forever")
    worker, rec = make_worker(server, reg, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: server.rows[job_id].status is Status.RUNNING)
        await trio.sleep(7)
        t_cancel = trio.current_time()
        server.cancel(job_id)
        await wait_for(lambda: bool(cancelled_at))
        worker.stop()
    assert cancelled_at[0] - t_cancel <= 5 + 0.1
    assert server.reports(job_id) == []
    assert rec.of("lost")[0].error == "the job is cancelled"
    assert server.rows[job_id].status is Status.CANCELLED


async def test_failing_renewals_abort_before_the_lease_ends_with_a_retryable_fail(
    server: FakeServer, autojump_clock: Any
) -> None:
    reg, cancelled_at = forever_registry()
    job_id = server.add("forever")
    worker, rec = make_worker(server, reg, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: server.rows[job_id].status is Status.RUNNING)
        server.down.add("heartbeat")
        await wait_for(lambda: bool(server.rows[job_id].errors))
        worker.stop()
    lease_end = server.times("lease")[0] + 10
    assert lease_end - worker.abort_margin_secs - 0.1 <= cancelled_at[0] < lease_end
    assert len(server.times("heartbeat", job_id)) > 1  # renewals were retried
    row = server.rows[job_id]
    assert row.retryable == [True] and row.errors[0].startswith("lease about to expire")
    assert row.status is Status.PENDING
    assert rec.of("failed")[0].retryable is True


async def test_jobs_waiting_for_a_lane_are_heartbeated(server: FakeServer, autojump_clock: Any) -> None:
    ids = [server.add("echo", {"secs": 12}) for _ in range(3)]
    worker, rec = make_worker(server, echo_registry(), lanes=1, batch=3, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: all(server.rows[i].status is Status.COMPLETED for i in ids))
        worker.stop()
    assert len(server.times("lease")) >= 1
    assert [server.rows[i].attempt for i in ids] == [1, 1, 1]  # nobody's lease ran out
    # The third job started only after ~24 s, and was heartbeated all along.
    beats = server.times("heartbeat", ids[2])
    assert beats[0] < 6 and len([b for b in beats if b < 24]) >= 4
    assert [e.lane for e in rec.of("claimed")] == [1, None, None]
    assert len(rec.of("completed")) == 3


# --------------------------------------------------------------------------
# Reports


async def test_reports_are_retried_until_they_land(server: FakeServer, autojump_clock: Any) -> None:
    job_id = server.add("echo")
    server.down.add("complete")
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: len(server.times("complete")) >= 3)
        server.down.discard("complete")
        await wait_for(lambda: server.rows[job_id].status is Status.COMPLETED)
        worker.stop()
    assert len(rec.of("completed")) == 1 and not rec.of("unreported")


async def test_reports_are_given_up_when_the_lease_ends(server: FakeServer, autojump_clock: Any) -> None:
    job_id = server.add("echo")
    server.down.add("complete")
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: bool(rec.of("unreported")))
        t = trio.current_time()
        worker.stop()
    lease_end = server.times("lease")[0] + 10
    assert lease_end <= t <= lease_end + 0.1
    tries = server.times("complete", job_id)
    assert len(tries) >= 4 and tries[-1] < lease_end
    assert "connection refused" in (rec.of("unreported")[0].error or "")
    assert server.rows[job_id].status is Status.RUNNING


async def test_a_report_call_in_flight_when_the_lease_ends_gets_its_time(
    server: FakeServer, autojump_clock: Any
) -> None:
    # Each complete takes 6 s and fails (a server that times out): the
    # second one is in flight when the lease ends, and is let finish; no
    # call starts after the lease's end.
    job_id = server.add("echo")
    server.down.add("complete")
    server.slow["complete"] = 6
    worker, rec = make_worker(server, echo_registry(), lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: bool(rec.of("unreported")))
        t = trio.current_time()
        worker.stop()
    lease_end = server.times("lease")[0] + 10
    # (the job is leased again once its lease has ended: those reports are not this lease's)
    tries = [at for at in server.times("complete", job_id) if at < lease_end]
    assert len(tries) == 2 and lease_end < tries[-1] + 6
    assert tries[-1] + 6 <= t <= tries[-1] + 6 + 0.1  # (t is polled every 0.05 s)


async def test_late_report_refused_is_lost(server: FakeServer, autojump_clock: Any) -> None:
    reg = Registry()

    @reg.handler("steal-me")
    async def steal_me(job: Job) -> dict[str, Any]:
        server.steal(job.id)  # reclaimed while we worked, no heartbeat in between
        return {}

    job_id = server.add("steal-me")
    worker, rec = make_worker(server, reg)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: bool(rec.of("lost")))
        worker.stop()
    assert server.reports(job_id) == ["complete"]
    assert not rec.of("completed")


# --------------------------------------------------------------------------
# Leasing


async def test_lease_backs_off_with_jitter_and_rides_out_an_outage(
    server: FakeServer, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.down.add("lease")
    worker, rec = make_worker(server, echo_registry())
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(60)
        delays = [e.delay or 0 for e in rec.of("waiting")]
        server.down.discard("lease")
        job_id = server.add("echo")
        await wait_for(lambda: server.rows[job_id].status is Status.COMPLETED, timeout=30)
        worker.stop()
    base, cap = runtime_mod.LEASE_BACKOFF
    assert 5 <= len(delays) <= 20
    for n, d in enumerate(delays, 1):
        assert 0.5 * min(cap, base * 2 ** (n - 1)) <= d <= min(cap, base * 2 ** (n - 1))
    assert max(delays) <= cap
    assert "connection refused" in (rec.of("waiting")[0].error or "")


async def test_unauthorized_stops_the_worker_with_a_clear_error(server: FakeServer, autojump_clock: Any) -> None:
    server.refuse = True
    worker, _ = make_worker(server, echo_registry())
    with pytest.raises(errors.Unauthorized, match="unknown token"):
        await worker.run()


async def test_unauthorized_heartbeat_stops_the_worker(server: FakeServer, autojump_clock: Any) -> None:
    job_id = server.add("echo", {"secs": 100})

    async def revoke() -> None:
        await trio.sleep(1)
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


async def test_stop_drains_held_jobs_and_leases_no_more(server: FakeServer, autojump_clock: Any) -> None:
    ids = [server.add("echo", {"secs": 8}) for _ in range(2)]
    worker, rec = make_worker(server, echo_registry(), lanes=2, batch=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: all(server.rows[i].status is Status.RUNNING for i in ids))
        late = server.add("echo")
        worker.stop()
        stopped_at = trio.current_time()
        assert worker.statistics().stopping
    assert trio.current_time() - stopped_at >= 7
    assert all(server.rows[i].status is Status.COMPLETED for i in ids)
    assert server.rows[late].status is Status.PENDING
    assert rec.of("stopping")


async def test_cancel_stops_at_once_and_reports_nothing(server: FakeServer, autojump_clock: Any) -> None:
    ids = [server.add("echo", {"secs": 100}) for _ in range(2)]
    worker, rec = make_worker(server, echo_registry(), lanes=2, batch=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: all(server.rows[i].status is Status.RUNNING for i in ids))
        worker.cancel()
        t = trio.current_time()
    assert trio.current_time() - t < 0.1
    assert all(server.rows[i].status is Status.RUNNING for i in ids)
    assert all(server.reports(i) == [] for i in ids)


async def test_open_worker_drains_on_exit(server: FakeServer, autojump_clock: Any) -> None:
    job_id = server.add("echo", {"secs": 3})
    async with open_worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5) as worker:
        await wait_for(lambda: server.rows[job_id].status is Status.RUNNING)
        assert worker.statistics().held == 1
    assert server.rows[job_id].status is Status.COMPLETED


async def test_open_worker_cancels_on_error(server: FakeServer, autojump_clock: Any) -> None:
    job_id = server.add("echo", {"secs": 100})
    with pytest.raises(KeyError):
        async with open_worker(server, "q", echo_registry(), lease_secs=10, wait_secs=5):
            await wait_for(lambda: server.rows[job_id].status is Status.RUNNING)
            raise KeyError("x")
    assert server.reports(job_id) == []


def test_bad_options_are_refused() -> None:
    reg = echo_registry()
    for kw in ({"lanes": 0}, {"batch": 101}, {"lease_secs": 0}, {"wait_secs": 61}):
        with pytest.raises(errors.ConfigError):
            Worker(FakeServer.__new__(FakeServer), "q", reg, **kw)
    with pytest.raises(errors.ConfigError):
        Worker(FakeServer.__new__(FakeServer), "bad queue", reg)


def test_default_worker_id_is_host_pid() -> None:
    import os
    import socket

    w = Worker(FakeServer.__new__(FakeServer), "q", echo_registry())
    assert w.worker_id == f"{socket.gethostname()}-{os.getpid()}"


# --------------------------------------------------------------------------
# The batcher alone


async def test_batcher_spreads_a_batch_error_to_each_caller(autojump_clock: Any) -> None:
    async def send(items: list[int]) -> list[int]:
        await trio.sleep(0.01)
        raise errors.Unavailable("db down")

    batcher: Batcher[int, int] = Batcher(send, linger=0.005)
    raised: list[BaseException] = []

    async def call(n: int) -> None:
        try:
            await batcher.call(n)
        except errors.Unavailable as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        async with trio.open_nursery() as callers:
            for n in range(5):
                callers.start_soon(call, n)
        nursery.cancel_scope.cancel()
    assert len(raised) == 5 and len({id(e) for e in raised}) == 5


async def test_lease_is_reckoned_from_the_claim_not_the_long_poll(server: FakeServer, autojump_clock: Any) -> None:
    worker, rec = make_worker(server, echo_registry(), lease_secs=10, wait_secs=20)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(15)  # the long poll has been waiting longer than a lease
        job_id = server.add("echo", {"secs": 3})
        await wait_for(lambda: server.rows[job_id].status is Status.COMPLETED)
        worker.stop()
    assert not rec.of("unreported") and not rec.of("lost")
    assert server.reports(job_id) == ["complete"]


async def test_empty_answers_that_did_not_wait_are_not_spun_on(
    server: FakeServer, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
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
# Heartbeat loops start when the first heartbeat falls due


async def test_a_job_claimed_later_is_heartbeated_from_its_own_claim(server: FakeServer, autojump_clock: Any) -> None:
    first = server.add("echo", {"secs": 12})
    worker, rec = make_worker(server, echo_registry(), lanes=2, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(6)  # the first job heartbeats; nothing else is held
        second = server.add("echo", {"secs": 12})
        added = trio.current_time()  # the long poll answers at once
        await wait_for(lambda: all(server.rows[i].status is Status.COMPLETED for i in (first, second)))
        worker.stop()
    # The worker reckons the second lease from its answer, less CLAIM_SLACK.
    for job_id, claimed in ((first, server.times("lease")[0]), (second, added - runtime_mod.CLAIM_SLACK)):
        beats = server.times("heartbeat", job_id)
        assert len(beats) == 2, beats  # at claim + 5 and claim + 10
        gaps = [b - a for a, b in itertools.pairwise([claimed, *beats])]
        assert all(5 - 1e-6 <= g <= 5 + 4 * LATENCY for g in gaps), (job_id, gaps)
    assert [server.rows[i].attempt for i in (first, second)] == [1, 1]
    assert not rec.of("lost") and len(rec.of("completed")) == 2


async def test_short_jobs_are_never_heartbeated(server: FakeServer, autojump_clock: Any) -> None:
    ids = [server.add("echo", {"secs": 1}) for _ in range(6)]
    worker, rec = make_worker(server, echo_registry(), lanes=2, batch=2, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: all(server.rows[i].status is Status.COMPLETED for i in ids))
        await trio.sleep(20)
        worker.stop()
    assert server.times("heartbeat") == []
    assert len(rec.of("completed")) == 6


async def test_job_cancelled_while_waiting_for_a_lane_never_runs(server: FakeServer, autojump_clock: Any) -> None:
    started: list[str] = []
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> dict[str, Any]:
        started.append(job.id)
        await trio.sleep(job.payload["secs"])
        return {}

    running = server.add("work", {"secs": 20})
    waiting = server.add("work", {"secs": 1})
    worker, rec = make_worker(server, reg, lanes=1, batch=2, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: server.rows[waiting].status is Status.RUNNING)
        await trio.sleep(1)
        server.cancel(waiting)
        await wait_for(lambda: bool(rec.of("lost")))
        assert trio.current_time() <= server.times("lease")[0] + 5 + 0.1  # at its first heartbeat
        assert worker.statistics().held == 1
        await wait_for(lambda: server.rows[running].status is Status.COMPLETED)
        worker.stop()
    assert started == [running]
    assert server.reports(waiting) == []
    lost = rec.of("lost")[0]
    assert lost.job_id == waiting and lost.lane is None and lost.error == "the job is cancelled"


async def test_no_handler_starts_after_a_hard_stop(server: FakeServer, autojump_clock: Any) -> None:
    started: list[str] = []
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> dict[str, Any]:
        started.append(job.id)  # before any checkpoint
        return {}

    ids = [server.add("work") for _ in range(3)]
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


async def test_abort_whose_fail_cannot_land_is_unreported(server: FakeServer, autojump_clock: Any) -> None:
    reg, cancelled_at = forever_registry()
    job_id = server.add("forever")
    server.down.update({"heartbeat", "fail"})
    worker, rec = make_worker(server, reg, lease_secs=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: bool(rec.of("unreported")))
        t = trio.current_time()
        worker.stop()
    lease_end = server.times("lease")[0] + 10
    assert cancelled_at and cancelled_at[0] < lease_end
    assert lease_end <= t <= lease_end + 0.1
    fails = server.times("fail", job_id)
    assert fails and fails[-1] < lease_end
    assert not rec.of("failed") and not rec.of("lost")
    assert "connection refused" in (rec.of("unreported")[0].error or "")
    assert server.rows[job_id].status is Status.RUNNING


# --------------------------------------------------------------------------
# More of the batcher


async def test_batcher_drops_the_item_of_a_caller_cancelled_before_it_was_sent(autojump_clock: Any) -> None:
    sent: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        sent.append(list(items))
        return [n * 10 for n in items]

    batcher: Batcher[int, int] = Batcher(send, linger=0.005)
    replies: list[int] = []

    async def call(n: int) -> None:
        replies.append(await batcher.call(n))

    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        async with trio.open_nursery() as callers:
            callers.start_soon(call, 1)
            callers.start_soon(call, 2)
            with trio.move_on_after(0.001):
                await batcher.call(3)  # handed over; stops waiting while the batch lingers
        nursery.cancel_scope.cancel()
    assert [sorted(items) for items in sent] == [[1, 2]] and sorted(replies) == [10, 20]


async def test_batcher_sends_a_full_batch_without_lingering(autojump_clock: Any) -> None:
    sent: list[tuple[float, list[int]]] = []

    async def send(items: list[int]) -> list[int]:
        sent.append((trio.current_time(), list(items)))
        return list(items)

    batcher: Batcher[int, int] = Batcher(send, linger=10, max_items=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        t0 = trio.current_time()
        async with trio.open_nursery() as callers:
            for n in range(3):
                callers.start_soon(batcher.call, n)
        nursery.cancel_scope.cancel()
    assert [sorted(items) for _, items in sent] == [[0, 1, 2]]
    assert sent[0][0] - t0 < 0.001


async def test_batcher_callers_left_waiting_at_shutdown_get_a_transport_error(autojump_clock: Any) -> None:
    async def send(items: list[int]) -> list[int]:
        await trio.sleep_forever()
        raise AssertionError

    batcher: Batcher[int, int] = Batcher(send, linger=0.005, max_inflight=1)
    raised: list[BaseException] = []

    async def call(n: int) -> None:
        try:
            await batcher.call(n)
        except errors.TransportError as exc:
            raised.append(exc)

    async with trio.open_nursery() as outer, trio.open_nursery() as runner:
        await runner.start(batcher.run)
        outer.start_soon(call, 1)  # sent, never answered
        await trio.sleep(0.01)
        outer.start_soon(call, 2)  # waits for room in flight
        await trio.sleep(0.01)
        runner.cancel_scope.cancel()
    assert len(raised) == 2 and all("shutting down" in str(e) for e in raised)
    with pytest.raises(errors.TransportError, match="shutting down"):
        await batcher.call(3)


class SlowReports(FakeServer):
    """Completions take a second to land."""

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        await trio.sleep(1)
        return await super().complete(items)


async def test_leases_again_while_a_report_is_in_flight(autojump_clock: Any) -> None:
    server = SlowReports()
    first, second = server.add("echo"), server.add("echo")
    worker, rec = make_worker(server, echo_registry(), lanes=1, batch=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_for(lambda: all(server.rows[i].status is Status.COMPLETED for i in (first, second)))
        worker.stop()
    claimed = {e.job_id: t for t, e in rec.events if e.type == "claimed"}
    completed = {e.job_id: t for t, e in rec.events if e.type == "completed"}
    # One lane, and its job's handler is done: the next job is leased while
    # the first one's completion is still on its way.
    assert claimed[second] < completed[first]
