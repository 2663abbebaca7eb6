"""Job timeouts (``config.timeout_secs``): a deadline of claim time plus the
timeout that no heartbeat extends the lease past, enforced by the janitor
whatever the worker still holds. On both stores, over real HTTP, and with
the engine's janitor on Trio's autojump clock."""

from __future__ import annotations

import pytest
import trio

from qftrio.models import EnqueueRequest, Status
from qftrio.models import to_datetime as when
from qftrio.server.engine import Engine, RetryPolicy

from .conftest import EPOCH
from qftrio.server.store.base import (
    ClaimRequest, CompleteItem, FailItem, HeartbeatItem, NewJob, Outcome, SnoozeItem, Store,
)  # fmt: skip

T0 = 1_800_000_000.0
RETRY_IN_10 = RetryPolicy(base_secs=10, cap_secs=10, jitter=0).retry_at


def new(**kw) -> NewJob:
    return NewJob(tenant="t1", queue="q", kind="k", payload={}, scheduled_at=T0, **kw)


async def claim(storage: Store, now: float, lease: float = 30):
    return await storage.jobs_claim("q", limit=1, lease_secs=lease, worker_id="w1", now=now)


async def test_the_lease_never_runs_past_the_deadline(storage: Store) -> None:
    (ins,) = await storage.jobs_insert([new(timeout_secs=10)], now=T0)
    assert ins.job.timeout_secs == 10 and (await storage.job_get(ins.id)).timeout_secs == 10
    (lease,) = await claim(storage, T0 + 1)
    assert lease.job.locked_until == when(T0 + 11) and lease.job.timeout_secs == 10
    (beat,) = await storage.jobs_heartbeat([HeartbeatItem(ins.id, lease.lease_token, 30)], now=T0 + 5)
    assert (beat.outcome, beat.status, beat.locked_until) == (Outcome.OK, Status.RUNNING, T0 + 11)
    assert (await storage.job_get(ins.id)).locked_until == when(T0 + 11)
    # a lease shorter than what is left of the timeout is the lease asked for
    (beat,) = await storage.jobs_heartbeat([HeartbeatItem(ins.id, lease.lease_token, 2)], now=T0 + 6)
    assert beat.locked_until == T0 + 8


async def test_a_job_without_timeout_is_leased_as_asked(storage: Store) -> None:
    (ins,) = await storage.jobs_insert([new()], now=T0)
    (lease,) = await claim(storage, T0 + 1)
    assert lease.job.locked_until == when(T0 + 31) and lease.job.timeout_secs is None
    (beat,) = await storage.jobs_heartbeat([HeartbeatItem(ins.id, lease.lease_token, 100)], now=T0 + 5)
    assert beat.locked_until == T0 + 105


async def test_a_timed_out_attempt_fails_and_retries_with_backoff(storage: Store) -> None:
    (ins,) = await storage.jobs_insert([new(timeout_secs=10, max_attempts=2)], now=T0)
    (lease,) = await claim(storage, T0 + 1)
    # past the deadline, before the janitor: no claim takes it, nothing says it is due
    assert await claim(storage, T0 + 12) == []
    assert await storage.queue_next_available_at("q", now=T0 + 12) is None
    (reaped,) = await storage.jobs_reap_expired(now=T0 + 12, retry_at=RETRY_IN_10)
    assert (reaped.job_id, reaped.status) == (ins.id, Status.PENDING)
    job = await storage.job_get(ins.id)
    assert job.status is Status.PENDING and job.error == "timed out after 10 s"
    assert job.scheduled_at == when(T0 + 22) and job.locked_until is None
    assert [(e.attempt, e.error) for e in job.errors] == [(1, "timed out after 10 s")]
    # the worker that still holds it reports too late: its token is stale
    (late,) = await storage.jobs_complete([CompleteItem(ins.id, lease.lease_token, {})], now=T0 + 13)
    assert late.outcome is Outcome.CONFLICT
    (late,) = await storage.jobs_fail([FailItem(ins.id, lease.lease_token, "x")], now=T0 + 13, retry_at=RETRY_IN_10)
    assert late.outcome is Outcome.CONFLICT
    assert await claim(storage, T0 + 21) == []
    (again,) = await claim(storage, T0 + 22)
    assert again.job.attempt == 2 and again.job.locked_until == when(T0 + 32)
    (reaped,) = await storage.jobs_reap_expired(now=T0 + 33, retry_at=RETRY_IN_10)
    assert reaped.status is Status.FAILED
    job = await storage.job_get(ins.id)
    assert job.status is Status.FAILED and job.error == "timed out after 10 s"


async def test_a_lease_lost_before_the_deadline_is_a_lost_lease(storage: Store) -> None:
    (ins,) = await storage.jobs_insert([new(timeout_secs=100)], now=T0)
    await claim(storage, T0 + 1, lease=10)
    (again,) = await claim(storage, T0 + 12)
    assert again.job.attempt == 2 and again.job.error == "lease expired"
    assert again.job.locked_until == when(T0 + 42)  # its own deadline: when(T0 + 112)


async def test_a_job_handed_to_a_parked_poll_gets_its_deadline(storage: Store) -> None:
    poll = ClaimRequest(queue="q", limit=1, lease_secs=60, worker_id="w1")
    _, ((lease,),) = await storage.jobs_insert_claiming([new(timeout_secs=5)], now=T0, claims=[poll])
    assert lease.job.locked_until == when(T0 + 5)
    (beat,) = await storage.jobs_heartbeat([HeartbeatItem(lease.job.id, lease.lease_token, 60)], now=T0 + 1)
    assert beat.locked_until == T0 + 5


async def test_timeout_over_http(http, server) -> None:
    body = {"kind": "k", "config": {"queue": "slow", "timeout_secs": 5, "max_attempts": 1}}
    r = await http.post("/api/v1/jobs", json=body, headers=server.headers())
    assert r.status_code == 201 and r.json()["timeout_secs"] == 5
    job_id = r.json()["id"]
    r = await http.post("/api/v1/queues/slow/lease", json={"lease_secs": 60}, headers=server.headers("worker"))
    (leased,) = r.json()["jobs"]
    token = leased["lease_token"]
    beat = await http.post(
        f"/api/v1/jobs/{job_id}/heartbeat", json={"lease_token": token, "extend_secs": 60}, headers=server.headers("worker")
    )
    assert beat.status_code == 200 and beat.json()["locked_until"] == leased["job"]["locked_until"]
    server.clock.advance(6)
    await server.engine.reap_expired()
    got = (await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())).json()
    assert got["status"] == "failed" and got["error"] == "timed out after 5 s"
    late = await http.post(f"/api/v1/jobs/{job_id}/complete", json={"lease_token": token}, headers=server.headers("worker"))
    assert late.status_code == 409


async def test_the_janitor_ends_a_hung_attempt_whatever_its_heartbeats(engine: Engine, autojump_clock) -> None:
    (ins,) = await engine.enqueue("t1", [EnqueueRequest.model_validate({"kind": "k", "config": {"queue": "q", "timeout_secs": 30}})])
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run_janitor)
        # A lease longer than the timeout: it is the deadline that ends the
        # attempt, however long the store takes to answer.
        (lease,) = await engine.lease("q", lease_secs=600)
        claimed_at = lease.job.updated_at.timestamp()
        assert lease.job.locked_until.timestamp() == pytest.approx(claimed_at + 30, abs=1e-6)
        beats = []
        while True:  # a worker that heartbeats for ever
            (beat,) = await engine.heartbeat([HeartbeatItem(ins.id, lease.lease_token, 600)])
            if beat.outcome is not Outcome.OK or beat.status is not Status.RUNNING:
                break
            beats.append(beat.locked_until)
            await trio.sleep(3)
        assert beat.outcome is Outcome.CONFLICT  # the attempt is over: the token is stale
        while (await engine.store.job_get(ins.id)).status is Status.RUNNING:
            await trio.sleep(1)  # the janitor's next round
        nursery.cancel_scope.cancel()
    assert beats == pytest.approx([claimed_at + 30] * len(beats), abs=1e-6)
    job = await engine.store.job_get(ins.id)
    assert job.status is Status.PENDING and job.error == "timed out after 30 s" and job.attempt == 1
    assert job.scheduled_at.timestamp() > claimed_at + 30


async def test_the_attempt_is_over_at_its_deadline_before_any_janitor_round(engine: Engine, autojump_clock) -> None:
    # No janitor runs here: past the deadline, a heartbeat, a completion and
    # a snooze are refused at once, and a fail ends the attempt as timed out.
    backoff = {"initial_secs": 30, "jitter": 0}
    body = {"kind": "k", "config": {"queue": "q", "timeout_secs": 5, "max_attempts": 3, "backoff": backoff}}
    await engine.enqueue("t1", [EnqueueRequest.model_validate(body)] * 5)
    leases = await engine.lease("q", max_jobs=5, lease_secs=600)
    on_time, beaten, completed, snoozed, failed = [(lease.job.id, lease.lease_token) for lease in leases]
    await trio.sleep(4.5)
    (done,) = await engine.complete([CompleteItem(*on_time, {"ok": 1})])
    assert done.outcome is Outcome.OK
    await trio.sleep(0.5)  # the deadline, to the instant
    (beat,) = await engine.heartbeat([HeartbeatItem(*beaten, 60)])
    (late,) = await engine.complete([CompleteItem(*completed, {"late": 1})])
    (later,) = await engine.snooze([SnoozeItem(*snoozed, 10)])
    assert [r.outcome for r in (beat, late, later)] == [Outcome.CONFLICT] * 3
    for job_id, _ in (beaten, completed, snoozed):
        job = await engine.store.job_get(job_id)
        assert (job.status, job.result, job.attempt) == (Status.RUNNING, None, 1)  # for the janitor to end
    (fail,) = await engine.fail([FailItem(*failed, "boom", retryable=False, retry_in_secs=1)])
    assert fail.outcome is Outcome.OK
    job = await engine.store.job_get(failed[0])
    # exactly what the janitor would have made of it: retried, by the backoff
    assert job.status is Status.PENDING and job.error == "timed out after 5 s"
    assert [e.error for e in job.errors] == ["timed out after 5 s"]
    assert job.scheduled_at.timestamp() == pytest.approx(EPOCH + trio.current_time() + 30)
    assert (await engine.store.job_get(on_time[0])).result == {"ok": 1}
    # the janitor ends the others as timed out, none of them completed
    assert await engine.reap_expired() == 0  # their leases end at the deadline, not before
    await trio.sleep(1)
    assert await engine.reap_expired() == 3
    for job_id, _ in (beaten, completed, snoozed):
        job = await engine.store.job_get(job_id)
        assert (job.status, job.error) == (Status.PENDING, "timed out after 5 s")
