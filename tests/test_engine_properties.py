"""Property tests of the engine: random sequences of operations against a
simple model, on every store.

Hypothesis draws a list of operations (enqueue, lease, heartbeat, complete,
fail, cancel, retry, time passing, janitor rounds); the test runs them
through the engine's public methods on a fresh store and, after each one,
checks the store's jobs against the model and the guarantees of docs/reliability.md:

* a stale token never changes a job, and a report is answered as the table
  in :mod:`qftrio.server.store.base` says;
* a cancelled job's outcome is never overwritten;
* no job is held by two live leases (one current token per job);
* attempts never exceed ``max_attempts``; ``failed`` means dead-lettered;
* ``status``, ``locked_until`` and ``attempt`` agree with each other;
* once every worker has finished, every job has ended in exactly one
  terminal state, which no later report changes.

Time is the engine's ``clock``, advanced by the operations; nothing sleeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from qftrio import errors
from qftrio.models import CompleteItem, EnqueueRequest, FailItem, HeartbeatItem, Job, JobConfig, Lease, Status
from qftrio.models import to_datetime as when
from qftrio.server.engine import Engine, RetryPolicy
from qftrio.server.store.base import Outcome, Store
from qftrio.server.store.sqlite import open_sqlite_store

from .conftest import BACKENDS, EPOCH
from .pg import open_test_postgres_store, pg_url

TENANT = "acme"
QUEUE = "q"
#: The default policy: 1 s, 2 s, 4 s... with jitter down to half.
POLICY = RetryPolicy()
TERMINAL = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)

# -- operations ---------------------------------------------------------------

#: At most this many jobs per example, so that operations meet often.
MAX_JOBS = 4
enqueue = st.tuples(st.just("enqueue"), st.sampled_from([1, 1, 2, 3]), st.sampled_from([0.0, 0.0, 4.0]))
lease = st.tuples(st.just("lease"), st.integers(1, 3), st.sampled_from([5, 20]))
# Reports pick one of the tokens issued so far, counting back from the
# newest (the current and stale tokens of the jobs leased last), and
# cancel and retry a job counting back from the newest.
recent = st.integers(0, 4)
heartbeat = st.tuples(st.just("heartbeat"), recent, st.integers(1, 30))
complete = st.tuples(st.just("complete"), recent)
fail = st.tuples(st.just("fail"), recent, st.booleans())
cancel = st.tuples(st.just("cancel"), recent)
retry = st.tuples(st.just("retry"), recent)
# Leases last 5 or 20 s; the first retries wait 0.5 to 2 s.
advance = st.tuples(st.just("advance"), st.sampled_from([1.0, 6.0, 6.0, 25.0]))
reap = st.tuples(st.just("reap"))

OPERATIONS = st.lists(
    st.one_of(
        enqueue, lease, lease, lease, heartbeat, complete, complete, fail, fail, cancel, retry,
        advance, advance, reap,
    ),  # fmt: skip
    min_size=15,
    max_size=50,
)


# -- the model ----------------------------------------------------------------


@dataclasses.dataclass
class Model:
    """What a job should be, as the contract describes it."""

    id: str
    max_attempts: int
    scheduled_at: float
    status: Status = Status.PENDING
    attempt: int = 0
    #: The token on the row: the last claim's, until the janitor or a retry
    #: clears it. Only this token may report.
    token: str | None = None
    locked_until: float | None = None

    def expired(self, now: float) -> bool:
        """Whether it is running on a lease that has run out."""
        return self.status is Status.RUNNING and self.locked_until is not None and self.locked_until < now

    def claimable(self, now: float) -> bool:
        """Whether a lease at *now* may hand it out."""
        if self.status is Status.PENDING:
            return self.scheduled_at <= now
        return self.expired(now) and self.attempt < self.max_attempts


class Clock:
    """The engine's wall clock, moved by the operations only."""

    def __init__(self) -> None:
        self.now = EPOCH

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def fresh_store(backend: str) -> AsyncIterator[Store]:
    """An empty store of *backend*, for one example."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            async with open_sqlite_store(Path(tmp) / "qftrio.db") as store:
                yield store
    else:
        async with open_test_postgres_store(pool_size=2) as store:
            yield store


class Run:
    """One example: the engine, the model, and every token issued."""

    def __init__(self, engine: Engine, clock: Clock) -> None:
        self.engine = engine
        self.clock = clock
        self.jobs: dict[str, Model] = {}
        self.order: list[str] = []
        #: (job id, token) of every lease handed out, oldest first.
        self.tokens: list[tuple[str, str]] = []

    def pick_token(self, index: int) -> tuple[Model, str] | None:
        if not self.tokens:
            return None
        job_id, token = self.tokens[-1 - index % len(self.tokens)]
        return self.jobs[job_id], token

    def pick_job(self, index: int) -> Model | None:
        if not self.order:
            return None
        return self.jobs[self.order[-1 - index % len(self.order)]]

    async def apply(self, op: tuple) -> None:
        name, *args = op
        await getattr(self, f"do_{name}")(*args)

    async def do_enqueue(self, max_attempts: int, delay: float) -> None:
        if len(self.jobs) >= MAX_JOBS:
            return
        now = self.clock.now
        (inserted,) = await self.engine.enqueue(
            TENANT, [EnqueueRequest(kind="k", payload={}, config=JobConfig(queue=QUEUE, max_attempts=max_attempts, delay_secs=delay))]
        )
        assert inserted.created
        job = inserted.job
        assert job.id not in self.jobs
        self.jobs[job.id] = Model(id=job.id, max_attempts=max_attempts, scheduled_at=now + delay)
        self.order.append(job.id)

    async def do_lease(self, max_jobs: int, lease_secs: int) -> list[Lease]:
        now = self.clock.now
        claimable = {m.id for m in self.jobs.values() if m.claimable(now)}
        leases = await self.engine.lease(QUEUE, max_jobs=max_jobs, lease_secs=lease_secs, worker_id="w")
        assert len(leases) == min(max_jobs, len(claimable))
        ids = [lease_.job.id for lease_ in leases]
        assert len(set(ids)) == len(ids), "a job handed out twice in one lease"
        issued = {token for _, token in self.tokens}
        for lease_ in leases:
            model = self.jobs[lease_.job.id]
            assert model.id in claimable, f"claimed a job that was not claimable: {model}"
            assert lease_.lease_token not in issued, "a lease token was reused"
            model.status, model.attempt = Status.RUNNING, model.attempt + 1
            model.token, model.locked_until = lease_.lease_token, now + lease_secs
            self.tokens.append((model.id, lease_.lease_token))
            assert lease_.job.status is Status.RUNNING
            assert lease_.job.attempt == model.attempt
            assert lease_.job.locked_until == when(model.locked_until)
        return leases

    async def do_heartbeat(self, index: int, extend_secs: int) -> None:
        picked = self.pick_token(index)
        if picked is None:
            return
        model, token = picked
        (result,) = await self.engine.heartbeat([HeartbeatItem(model.id, token, extend_secs)])
        if token != model.token:
            assert result.outcome is Outcome.CONFLICT
            return
        assert result.outcome is Outcome.OK
        assert result.status is model.status
        if model.status is Status.RUNNING:
            model.locked_until = self.clock.now + extend_secs
            assert result.locked_until == model.locked_until
        else:
            assert result.locked_until is None

    async def do_complete(self, index: int) -> None:
        picked = self.pick_token(index)
        if picked is not None:
            await self.complete(*picked)

    async def complete(self, model: Model, token: str) -> None:
        (result,) = await self.engine.complete([CompleteItem(model.id, token, {"by": token})])
        if token != model.token or model.status not in (Status.RUNNING, Status.COMPLETED):
            assert result.outcome is Outcome.CONFLICT, (model, result)
            assert not result.applied
            return
        assert result.outcome is Outcome.OK
        assert result.status is Status.COMPLETED
        assert result.applied == (model.status is Status.RUNNING)
        if result.applied:
            model.status, model.locked_until = Status.COMPLETED, None

    async def do_fail(self, index: int, retryable: bool) -> None:
        picked = self.pick_token(index)
        if picked is None:
            return
        model, token = picked
        now = self.clock.now
        (result,) = await self.engine.fail([FailItem(model.id, token, "boom", retryable)])
        if token != model.token or model.status not in (Status.RUNNING, Status.PENDING, Status.FAILED):
            assert result.outcome is Outcome.CONFLICT, (model, result)
            assert not result.applied
            return
        assert result.outcome is Outcome.OK
        assert result.applied == (model.status is Status.RUNNING)
        if not result.applied:  # a replay
            assert result.status is model.status
            return
        if retryable and model.attempt < model.max_attempts:
            model.status = Status.PENDING
            job = await self.engine.job_get(TENANT, model.id)
            low = now + POLICY.delay(model.attempt, rand=lambda: 1.0)
            high = now + POLICY.delay(model.attempt, rand=lambda: 0.0)
            assert when(low) <= job.scheduled_at <= when(high), "the retry is not scheduled by the backoff"
            model.scheduled_at = job.scheduled_at.timestamp()
        else:
            model.status = Status.FAILED
        assert result.status is model.status
        model.locked_until = None

    async def do_cancel(self, index: int) -> None:
        model = self.pick_job(index)
        if model is None:
            return
        if model.status not in (Status.PENDING, Status.RUNNING):
            with pytest.raises(errors.Conflict):
                await self.engine.job_cancel(TENANT, model.id)
            return
        job = await self.engine.job_cancel(TENANT, model.id)
        assert job.status is Status.CANCELLED
        model.status = Status.CANCELLED

    async def do_retry(self, index: int) -> None:
        model = self.pick_job(index)
        if model is None:
            return
        if model.status not in (Status.FAILED, Status.CANCELLED):
            with pytest.raises(errors.Conflict):
                await self.engine.job_retry(TENANT, model.id)
            return
        job = await self.engine.job_retry(TENANT, model.id)
        assert job.status is Status.PENDING and job.attempt == 0
        model.status, model.attempt, model.token, model.locked_until = Status.PENDING, 0, None, None
        model.scheduled_at = self.clock.now

    async def do_advance(self, secs: float) -> None:
        self.clock.now += secs

    async def do_reap(self) -> None:
        now = self.clock.now
        expired = [m for m in self.jobs.values() if m.expired(now)]
        assert await self.engine.reap_expired() == len(expired)
        for model in expired:
            model.status = Status.PENDING if model.attempt < model.max_attempts else Status.FAILED
            model.token, model.locked_until = None, None
            if model.status is Status.FAILED:
                job = await self.engine.job_get(TENANT, model.id)
                assert job.error == "lease expired"

    async def check(self) -> None:
        """The store's jobs match the model, and every invariant holds."""
        stored, cursor = await self.engine.jobs_list(TENANT, queue=QUEUE, limit=100)
        assert cursor is None
        by_id = {job.id: job for job in stored}
        assert by_id.keys() == self.jobs.keys()
        for model in self.jobs.values():
            job = by_id[model.id]
            expected = (model.status, model.attempt, model.max_attempts)
            assert (job.status, job.attempt, job.max_attempts) == expected, (job, model)
            check_consistent(job)
            if job.status is Status.RUNNING:
                assert job.locked_until == when(model.locked_until)
            if job.status is Status.PENDING:
                assert job.scheduled_at == when(model.scheduled_at)
            if job.status is Status.COMPLETED:
                # the result of the lease that completed it, whatever came later
                assert job.result == {"by": model.token}, job

    async def check_stats(self) -> None:
        """The queue's counts match the model."""
        (stats,) = await self.engine.queues_stats(TENANT, QUEUE)
        for status in Status:
            assert stats.counts.get(status.value, 0) == sum(1 for m in self.jobs.values() if m.status is status)
        now = self.clock.now
        assert stats.scheduled == sum(1 for m in self.jobs.values() if m.status is Status.PENDING and m.scheduled_at > now)

    async def drain(self) -> None:
        """Let workers run every job to its end: time passes beyond every
        lease and backoff, the janitor runs, and every lease completes."""
        for _ in range(20):
            if all(m.status in TERMINAL for m in self.jobs.values()):
                return
            await self.do_advance(POLICY.cap_secs + 100)
            await self.do_reap()
            while any(m.claimable(self.clock.now) for m in self.jobs.values()):
                for lease_ in await self.do_lease(3, 20):
                    await self.complete(self.jobs[lease_.job.id], lease_.lease_token)
            await self.check()
        raise AssertionError("jobs still unfinished after the drain")


def check_consistent(job: Job) -> None:
    """The invariants a single job's fields must keep, whatever happened."""
    assert 0 <= job.attempt <= job.max_attempts, job
    if job.status is Status.RUNNING:
        assert job.attempt >= 1 and job.locked_until is not None, job
    elif job.status is not Status.CANCELLED:
        # A cancelled job keeps the lease's deadline it had (see
        # test_cancelling_a_running_job_clears_its_deadline).
        assert job.locked_until is None, job
    if job.status is Status.COMPLETED:
        assert job.result is not None and job.attempt >= 1, job
    else:
        assert job.result is None, job
    if job.status is Status.FAILED:
        # dead-lettered: its last attempt failed, or no attempt was left
        assert job.error is not None and job.attempt >= 1, job


def backend_params() -> list[object]:
    return [
        pytest.param(b, marks=pytest.mark.skipif(b == "postgres" and pg_url() is None, reason="no PostgreSQL"))
        for b in BACKENDS
    ]


#: Sequences known to matter, run on every test run besides random ones.
KNOWN = [
    # the first lease runs out and the job is claimed again: its token is stale
    [("enqueue", 2, 0.0), ("lease", 1, 5), ("advance", 6.0), ("lease", 1, 5),
     ("complete", 1), ("heartbeat", 1, 10), ("fail", 1, True), ("complete", 0)],
    # a lease runs out with no attempt left: it is not claimed again
    [("enqueue", 1, 0.0), ("lease", 1, 5), ("advance", 6.0), ("lease", 1, 5), ("reap",)],
    # a running job is cancelled: its worker's reports change nothing
    [("enqueue", 3, 0.0), ("lease", 1, 5), ("cancel", 0), ("complete", 0), ("fail", 0, False),
     ("heartbeat", 0, 10), ("retry", 0), ("lease", 1, 5), ("complete", 1), ("complete", 0)],
    # the janitor takes a lease back: the old token is stale from then on
    [("enqueue", 2, 0.0), ("lease", 1, 5), ("advance", 6.0), ("reap",), ("complete", 0),
     ("lease", 1, 5), ("fail", 1, True), ("advance", 3.0), ("lease", 1, 5), ("fail", 0, False)],
]  # fmt: skip


def with_known(test: Callable[..., Any]) -> Callable[..., Any]:
    for operations in KNOWN:
        test = example(operations=operations)(test)
    return test


@pytest.mark.parametrize("backend", backend_params())
@with_known
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS)
async def test_no_sequence_of_operations_breaks_an_invariant(backend: str, operations: list[tuple]) -> None:
    clock = Clock()
    async with fresh_store(backend) as store:
        run = Run(Engine(store, clock=clock), clock)
        for op in operations:
            await run.apply(op)
            await run.check()
        await run.check_stats()
        outcomes = {job_id: m.status for job_id, m in run.jobs.items()}
        await run.drain()
        for job_id, status in outcomes.items():
            if status in TERMINAL:
                assert run.jobs[job_id].status is status, "a terminal job changed its outcome"
        ended = {job_id: m.status for job_id, m in run.jobs.items()}
        # Every token ever issued, reported once more: nothing changes.
        for job_id, token in run.tokens:
            (completed,) = await run.engine.complete([CompleteItem(job_id, token, {"late": True})])
            (failed,) = await run.engine.fail([FailItem(job_id, token, "late", False)])
            assert not completed.applied and not failed.applied
        await run.check()
        await run.check_stats()
        assert {job_id: m.status for job_id, m in run.jobs.items()} == ended


# -- known deviations from the contract, as strict expected failures ----------


@contextlib.asynccontextmanager
async def one_running_job(backend: str) -> AsyncIterator[tuple[Engine, Clock, Job]]:
    """An engine on a fresh store, holding one job (one attempt) leased by
    worker ``w1`` for 30 s."""
    clock = Clock()
    async with fresh_store(backend) as store:
        engine = Engine(store, clock=clock)
        await engine.enqueue(TENANT, [EnqueueRequest(kind="k", payload={}, config=JobConfig(queue=QUEUE, max_attempts=1))])
        (lease_,) = await engine.lease(QUEUE, lease_secs=30, worker_id="w1")
        yield engine, clock, lease_.job


@pytest.mark.parametrize("backend", backend_params())
async def test_cancelling_a_running_job_clears_its_deadline(backend: str) -> None:
    async with one_running_job(backend) as (engine, _, job):
        cancelled = await engine.job_cancel(TENANT, job.id)
        assert cancelled.status is Status.CANCELLED
        assert (await engine.job_get(TENANT, job.id)).locked_until is None


@pytest.mark.parametrize("backend", backend_params())
async def test_a_job_dead_lettered_by_the_janitor_keeps_the_worker_it_ran_on(backend: str) -> None:
    async with one_running_job(backend) as (engine, clock, job):
        clock.now += 31
        assert await engine.reap_expired() == 1
        dead = await engine.job_get(TENANT, job.id)
        assert dead.status is Status.FAILED and dead.error == "lease expired"
        assert dead.worker_id == "w1"
