"""The store conformance suite: every backend runs every test here unchanged.

Time is passed explicitly (``now``), so these tests need no clock at all.
"""

from __future__ import annotations

import uuid

import pytest
import trio

from qftrio import errors
from qftrio.models import Status
from qftrio.models import to_datetime as when
from qftrio.server.engine import RetryPolicy
from qftrio.server.store.base import (
    LEASE_EXPIRED,
    ClaimRequest,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    NewJob,
    Outcome,
    Store,
    new_ids,
    new_tokens,
)

T0 = 1_800_000_000.0
ALWAYS_RETRY = RetryPolicy(base_secs=10, cap_secs=10, jitter=0).retry_at


def new(kind: str = "k", *, queue: str = "q", tenant: str = "t1", at: float = T0, **kw) -> NewJob:
    return NewJob(tenant=tenant, queue=queue, kind=kind, payload={"n": 1}, scheduled_at=at, **kw)


async def insert(storage: Store, *jobs: NewJob, now: float = T0) -> list[str]:
    return [i.job.id for i in await storage.jobs_insert(list(jobs), now=now)]


async def claim_one(storage: Store, *, queue: str = "q", now: float = T0 + 1, lease: float = 30):
    (lease_,) = await storage.jobs_claim(queue, limit=1, lease_secs=lease, worker_id="w1", now=now)
    return lease_


async def test_insert_and_get(storage: Store) -> None:
    (ins,) = await storage.jobs_insert([new(priority=3, max_attempts=7)], now=T0)
    assert ins.created
    job = await storage.job_get(ins.job.id)
    assert job == ins.job
    assert job.status is Status.PENDING
    assert (job.priority, job.attempt, job.max_attempts) == (3, 0, 7)
    assert job.payload == {"n": 1}
    assert job.created_at == job.updated_at == when(T0)
    assert job.locked_until is None and job.worker_id is None and job.result is None
    assert job.errors == ()
    uuid.UUID(job.id)


async def test_insert_answers_each_job_as_a_read_shows_it(storage: Store) -> None:
    # An insert reads nothing back of the jobs it creates: its answer is
    # built from what it was given, and must be what the store then holds.
    given = [
        NewJob(tenant="t1", queue="q", kind="k", payload={"n": 1, "big": 2**70, "deep": {"list": [0.1, "é\u2028", None]}},
               priority=-3, max_attempts=9, scheduled_at=T0 + 30.25),
        new(idempotency_key="key"),
        new("again", idempotency_key="key"),
        new(queue="r"),
    ]  # fmt: skip
    inserted = await storage.jobs_insert(given, now=T0)
    inserted += await storage.jobs_insert([new("later", idempotency_key="key")], now=T0 + 5)
    assert [i.created for i in inserted] == [True, True, False, True, False]
    assert inserted[2].id == inserted[4].id == inserted[1].id
    for i in inserted:
        stored = await storage.job_get(i.id)
        assert stored is not None
        assert i.job == stored
        assert i.to_wire() == stored.to_wire()


def test_new_ids_are_distinct_canonical_version_7_uuids_of_their_time() -> None:
    ids = new_ids(2000, T0)
    assert len(set(ids)) == 2000
    for job_id in ids:
        parsed = uuid.UUID(job_id)
        assert str(parsed) == job_id and parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert parsed.int >> 80 == int(T0 * 1000)
    assert new_ids(0, T0) == []


def test_ids_made_later_sort_later() -> None:
    earlier, later = new_ids(500, T0), new_ids(500, T0 + 0.001)
    assert max(earlier) < min(later)
    assert max(map(uuid.UUID, earlier)) < min(map(uuid.UUID, later))


def test_the_ids_of_a_batch_sort_in_its_order() -> None:
    ids = new_ids(2000, T0)
    assert ids == sorted(ids) and list(map(uuid.UUID, ids)) == sorted(map(uuid.UUID, ids))


def test_new_tokens_are_distinct_random_version_4_uuids() -> None:
    tokens = new_tokens(2000)
    assert len(set(tokens)) == 2000
    assert all(uuid.UUID(t).version == 4 and str(uuid.UUID(t)) == t for t in tokens)


async def test_get_is_tenant_scoped(storage: Store) -> None:
    (job_id,) = await insert(storage, new(tenant="t1"))
    assert await storage.job_get(job_id, tenant="t2") is None
    assert (await storage.job_get(job_id, tenant="t1")).id == job_id
    assert await storage.job_get("not-a-uuid") is None
    assert await storage.job_get(str(uuid.uuid4())) is None


async def test_idempotency_key_returns_the_first_job(storage: Store) -> None:
    (first,) = await storage.jobs_insert([new(idempotency_key="k1")], now=T0)
    (again,) = await storage.jobs_insert([new("other", idempotency_key="k1")], now=T0 + 5)
    assert again.created is False and again.job == first.job
    (other_tenant,) = await storage.jobs_insert([new(tenant="t2", idempotency_key="k1")], now=T0)
    assert other_tenant.created and other_tenant.job.id != first.job.id
    batch = await storage.jobs_insert([new(idempotency_key="k2"), new(idempotency_key="k2")], now=T0)
    assert [b.created for b in batch] == [True, False]
    assert batch[0].job.id == batch[1].job.id


async def test_claim_order_and_schedule(storage: Store) -> None:
    low = (await insert(storage, new(priority=0, at=T0 - 10)))[0]
    future = (await insert(storage, new(priority=9, at=T0 + 100)))[0]
    high_late = (await insert(storage, new(priority=5, at=T0 - 1)))[0]
    high_early = (await insert(storage, new(priority=5, at=T0 - 2)))[0]
    other_queue = (await insert(storage, new(priority=9, queue="other")))[0]
    leases = await storage.jobs_claim("q", limit=10, lease_secs=1000, worker_id="w1", now=T0)
    assert [lease.job.id for lease in leases] == [high_early, high_late, low]
    assert future not in {lease.job.id for lease in leases} and other_queue not in {lease.job.id for lease in leases}
    (later,) = await storage.jobs_claim("q", limit=10, lease_secs=30, worker_id="w1", now=T0 + 100)
    assert later.job.id == future


async def test_claim_sets_the_lease(storage: Store) -> None:
    await insert(storage, new())
    lease = await claim_one(storage, now=T0 + 1, lease=30)
    job = lease.job
    assert job.status is Status.RUNNING
    assert job.attempt == 1
    assert job.locked_until == when(T0 + 31)
    assert job.worker_id == "w1"
    assert job.updated_at == when(T0 + 1)
    uuid.UUID(lease.lease_token)
    assert await storage.jobs_claim("q", limit=1, lease_secs=30, worker_id="w2", now=T0 + 2) == []


async def test_insert_claiming_hands_new_jobs_to_claims_in_one_call(storage: Store) -> None:
    older = (await insert(storage, new("older", at=T0 - 5)))[0]
    (first,) = await storage.jobs_insert([new(idempotency_key="dup")], now=T0)
    inserted, claimed = await storage.jobs_insert_claiming(
        [new("a", priority=1), new("b"), new("later", at=T0 + 60), new(idempotency_key="dup"), new("other", queue="r")],
        now=T0,
        claims=[
            ClaimRequest(queue="q", limit=2, lease_secs=30, worker_id="w1"),
            ClaimRequest(queue="q", limit=5, lease_secs=300, worker_id="w2"),
            ClaimRequest(queue="empty", limit=1, lease_secs=10),
        ],
    )
    assert [i.created for i in inserted] == [True, True, True, False, True]
    assert inserted[3].job.id == first.job.id
    a, b, later, _, other = (i.job.id for i in inserted)
    # Each claim in order, in lease order; jobs not yet due stay pending.
    assert [[lease.job.id for lease in c] for c in claimed] == [[a, older], [first.job.id, b], []]
    for lease in claimed[0] + claimed[1]:
        assert lease.job.status is Status.RUNNING and lease.job.attempt == 1
    assert {lease.job.worker_id for lease in claimed[0]} == {"w1"}
    assert {lease.job.locked_until for lease in claimed[1]} == {when(T0 + 300)}
    assert (await storage.job_get(later)).status is Status.PENDING
    assert (await storage.job_get(other)).status is Status.PENDING
    # The leases are real: their tokens complete the jobs.
    results = await storage.jobs_complete(
        [CompleteItem(lease.job.id, lease.lease_token, {}) for lease in claimed[0]], now=T0 + 1
    )
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.OK]
    # Nothing to insert: only the claims run.
    inserted, claimed = await storage.jobs_insert_claiming(
        [], now=T0 + 60, claims=[ClaimRequest(queue="q", limit=3, lease_secs=30)]
    )
    assert inserted == [] and [lease.job.id for lease in claimed[0]] == [later]


async def test_insert_claiming_for_one_poll(storage: Store) -> None:
    # The common hand-off: one parked poll, new jobs of its queue.
    poll = ClaimRequest(queue="q", limit=2, lease_secs=30, worker_id="w1")
    inserted, (leases,) = await storage.jobs_insert_claiming(
        [new("low", priority=0), new("later", at=T0 + 60), new("high", priority=5), new("mid", priority=3)],
        now=T0,
        claims=[poll],
    )
    low, later, high, mid = (i.job for i in inserted)
    assert all(i.created for i in inserted)
    assert [lease.job.id for lease in leases] == [high.id, mid.id]
    # The insert answers each job as enqueued, the claimed ones too.
    for i in inserted:
        assert i.job.status is Status.PENDING and i.job.attempt == 0 and i.job.locked_until is None
        assert i.to_wire()["status"] == "pending"
    for lease in leases:
        assert lease.job.status is Status.RUNNING and lease.job.attempt == 1 and lease.job.worker_id == "w1"
        assert lease.job.locked_until == when(T0 + 30)
        uuid.UUID(lease.lease_token)
    assert (await storage.job_get(low.id)).status is Status.PENDING
    assert (await storage.job_get(later.id)).status is Status.PENDING
    results = await storage.jobs_complete([CompleteItem(x.job.id, x.lease_token, {}) for x in leases], now=T0 + 1)
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.OK]
    # Something older is claimable: it is claimed in lease order with the new.
    _, (leases,) = await storage.jobs_insert_claiming([new("newer", priority=1)], now=T0 + 2, claims=[poll])
    assert [lease.job.kind for lease in leases] == ["newer", "low"]
    await storage.jobs_complete([CompleteItem(x.job.id, x.lease_token, {}) for x in leases], now=T0 + 2)
    # New jobs alone, in lease order.
    _, (leases,) = await storage.jobs_insert_claiming(
        [new("newest", at=T0 + 3), new("newest")], now=T0 + 3, claims=[poll]
    )
    assert [lease.job.scheduled_at for lease in leases] == [when(T0), when(T0 + 3)]
    await storage.jobs_complete([CompleteItem(x.job.id, x.lease_token, {}) for x in leases], now=T0 + 3)
    # An expired lease counts as claimable too.
    (expired,) = await storage.jobs_claim("q", limit=1, lease_secs=1, worker_id="w2", now=T0 + 60)
    assert expired.job.id == later.id
    inserted, (leases,) = await storage.jobs_insert_claiming(
        [new("last", at=T0 + 70)], now=T0 + 70, claims=[ClaimRequest(queue="q", limit=1, lease_secs=30)]
    )
    assert [(lease.job.id, lease.job.attempt) for lease in leases] == [(expired.job.id, 2)]
    assert (await storage.job_get(inserted[0].job.id)).status is Status.PENDING


async def test_claim_is_exclusive_under_concurrency(storage: Store) -> None:
    ids = await insert(storage, *[new() for _ in range(60)])
    seen: list[str] = []

    async def claimer() -> None:
        while True:
            leases = await storage.jobs_claim("q", limit=3, lease_secs=30, worker_id="w", now=T0 + 1)
            if not leases:
                return
            seen.extend(lease.job.id for lease in leases)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(claimer)
    assert sorted(seen) == sorted(ids)


async def test_expired_lease_is_reclaimable_and_old_token_stale(storage: Store) -> None:
    await insert(storage, new(max_attempts=3))
    first = await claim_one(storage, now=T0 + 1, lease=10)
    assert await storage.jobs_claim("q", limit=1, lease_secs=10, worker_id="w2", now=T0 + 5) == []
    (second,) = await storage.jobs_claim("q", limit=1, lease_secs=10, worker_id="w2", now=T0 + 12)
    assert second.job.id == first.job.id
    assert second.lease_token != first.lease_token
    assert second.job.attempt == 2 and second.job.worker_id == "w2"
    assert [(e.attempt, e.error) for e in second.job.errors] == [(1, LEASE_EXPIRED)]
    job_id = first.job.id
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, first.lease_token, 30)], now=T0 + 13)
    assert hb.outcome is Outcome.CONFLICT
    (done,) = await storage.jobs_complete([CompleteItem(job_id, first.lease_token, {})], now=T0 + 13)
    assert done.outcome is Outcome.CONFLICT
    (failed,) = await storage.jobs_fail([FailItem(job_id, first.lease_token, "x")], now=T0 + 13, retry_at=ALWAYS_RETRY)
    assert failed.outcome is Outcome.CONFLICT
    (ok,) = await storage.jobs_complete([CompleteItem(job_id, second.lease_token, {"v": 2})], now=T0 + 13)
    assert ok.outcome is Outcome.OK and ok.applied
    assert (await storage.job_get(job_id)).result == {"v": 2}


async def test_expired_token_stays_valid_until_the_job_is_claimed_again(storage: Store) -> None:
    await insert(storage, new(max_attempts=3), new(max_attempts=3))
    late, lost = await storage.jobs_claim("q", limit=2, lease_secs=10, worker_id="w1", now=T0 + 1)
    # both leases ran out at T0 + 11, and neither job was claimed again nor reaped
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(late.job.id, late.lease_token, 30)], now=T0 + 20)
    assert (hb.outcome, hb.status, hb.locked_until) == (Outcome.OK, Status.RUNNING, T0 + 50)
    (done,) = await storage.jobs_complete([CompleteItem(lost.job.id, lost.lease_token, {"late": True})], now=T0 + 20)
    assert done.outcome is Outcome.OK and done.applied
    job = await storage.job_get(lost.job.id)
    assert (job.status, job.result, job.attempt, job.errors) == (Status.COMPLETED, {"late": True}, 1, ())
    assert await storage.jobs_claim("q", limit=2, lease_secs=10, worker_id="w2", now=T0 + 30) == []


async def test_expired_token_is_stale_once_reaped(storage: Store) -> None:
    (job_id,) = await insert(storage, new(max_attempts=3))
    lease = await claim_one(storage, now=T0 + 1, lease=10)
    await storage.jobs_reap_expired(now=T0 + 12)
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, lease.lease_token, 30)], now=T0 + 13)
    (done,) = await storage.jobs_complete([CompleteItem(job_id, lease.lease_token, {})], now=T0 + 13)
    (failed,) = await storage.jobs_fail([FailItem(job_id, lease.lease_token, "x")], now=T0 + 13, retry_at=ALWAYS_RETRY)
    assert [r.outcome for r in (hb, done, failed)] == [Outcome.CONFLICT] * 3
    job = await storage.job_get(job_id)
    assert (job.status, job.locked_until, job.updated_at) == (Status.PENDING, None, when(T0 + 12))


async def test_worker_id_is_kept_after_the_job_ends(storage: Store) -> None:
    done, failed, expired = await insert(storage, new(), new(max_attempts=1), new(max_attempts=1))
    leases = {x.job.id: x for x in await storage.jobs_claim("q", limit=3, lease_secs=10, worker_id="w7", now=T0)}
    await storage.jobs_complete([CompleteItem(done, leases[done].lease_token, {})], now=T0 + 1)
    await storage.jobs_fail([FailItem(failed, leases[failed].lease_token, "no")], now=T0 + 1, retry_at=ALWAYS_RETRY)
    (reaped,) = await storage.jobs_reap_expired(now=T0 + 20)
    assert (reaped.job_id, reaped.status) == (expired, Status.FAILED)
    for job_id, status in ((done, Status.COMPLETED), (failed, Status.FAILED), (expired, Status.FAILED)):
        job = await storage.job_get(job_id)
        assert (job.status, job.worker_id) == (status, "w7")


async def test_expired_lease_without_attempts_left_is_not_reclaimed(storage: Store) -> None:
    await insert(storage, new(max_attempts=1))
    await claim_one(storage, now=T0 + 1, lease=10)
    assert await storage.jobs_claim("q", limit=1, lease_secs=10, worker_id="w2", now=T0 + 100) == []
    (reaped,) = await storage.jobs_reap_expired(now=T0 + 100)
    assert reaped.status is Status.FAILED
    job = await storage.job_get(reaped.job_id)
    assert job.status is Status.FAILED and job.error == LEASE_EXPIRED


async def test_heartbeat(storage: Store) -> None:
    (job_id,) = await insert(storage, new())
    lease = await claim_one(storage, now=T0 + 1, lease=10)
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, lease.lease_token, 60)], now=T0 + 5)
    assert (hb.outcome, hb.status, hb.locked_until) == (Outcome.OK, Status.RUNNING, T0 + 65)
    job = await storage.job_get(job_id)
    assert (job.locked_until, job.updated_at) == (when(T0 + 65), when(T0 + 5))
    (wrong,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, str(uuid.uuid4()), 60)], now=T0 + 5)
    assert wrong.outcome is Outcome.CONFLICT
    (unknown,) = await storage.jobs_heartbeat([HeartbeatItem(str(uuid.uuid4()), lease.lease_token, 60)], now=T0)
    assert unknown.outcome is Outcome.NOT_FOUND
    await storage.job_cancel(job_id, tenant="t1", now=T0 + 6)
    (after,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, lease.lease_token, 60)], now=T0 + 7)
    assert (after.outcome, after.status, after.locked_until) == (Outcome.OK, Status.CANCELLED, None)
    job = await storage.job_get(job_id)
    assert (job.locked_until, job.updated_at) == (None, when(T0 + 6))


async def test_batch_heartbeat_mixes_every_outcome(storage: Store) -> None:
    live, done, cancelled = await insert(storage, *[new() for _ in range(3)])
    leases = {x.job.id: x for x in await storage.jobs_claim("q", limit=3, lease_secs=10, worker_id="w", now=T0 + 1)}
    await storage.jobs_complete([CompleteItem(done, leases[done].lease_token, {})], now=T0 + 2)
    await storage.job_cancel(cancelled, tenant="t1", now=T0 + 2)
    results = await storage.jobs_heartbeat(
        [
            HeartbeatItem(live, leases[live].lease_token, 30),
            HeartbeatItem(done, leases[done].lease_token, 30),
            HeartbeatItem(live, leases[live].lease_token, 40),
            HeartbeatItem(cancelled, leases[cancelled].lease_token, 30),
            HeartbeatItem(live, leases[done].lease_token, 30),
            HeartbeatItem(str(uuid.uuid4()), leases[live].lease_token, 30),
            HeartbeatItem("not-a-uuid", leases[live].lease_token, 30),
        ],
        now=T0 + 3,
    )
    assert [(r.outcome, r.status) for r in results] == [
        (Outcome.OK, Status.RUNNING),
        (Outcome.OK, Status.COMPLETED),
        (Outcome.OK, Status.RUNNING),
        (Outcome.OK, Status.CANCELLED),
        (Outcome.CONFLICT, None),
        (Outcome.NOT_FOUND, None),
        (Outcome.NOT_FOUND, None),
    ]
    # a lease heartbeated twice in one batch is extended once, by the longer
    # extension, and both are answered with it
    assert [r.locked_until for r in results[:4]] == [T0 + 43, None, T0 + 43, None]
    job = await storage.job_get(live)
    assert (job.locked_until, job.updated_at) == (when(T0 + 43), when(T0 + 3))
    # jobs no longer running are left as they were
    for job_id, status, locked_until in ((done, Status.COMPLETED, None), (cancelled, Status.CANCELLED, None)):
        job = await storage.job_get(job_id)
        assert (job.status, job.locked_until) == (status, locked_until)


async def test_complete_and_replay(storage: Store) -> None:
    (job_id,) = await insert(storage, new())
    lease = await claim_one(storage)
    (res,) = await storage.jobs_complete([CompleteItem(job_id, lease.lease_token, {"ok": True})], now=T0 + 2)
    assert (res.outcome, res.status, res.applied, res.queue) == (Outcome.OK, Status.COMPLETED, True, "q")
    job = await storage.job_get(job_id)
    assert job.status is Status.COMPLETED and job.result == {"ok": True} and job.locked_until is None
    (replay,) = await storage.jobs_complete([CompleteItem(job_id, lease.lease_token, {"ok": False})], now=T0 + 3)
    assert replay.outcome is Outcome.OK and not replay.applied
    assert await storage.job_get(job_id) == job
    (fail_after,) = await storage.jobs_fail([FailItem(job_id, lease.lease_token, "x")], now=T0 + 3, retry_at=ALWAYS_RETRY)
    assert fail_after.outcome is Outcome.CONFLICT
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, lease.lease_token, 5)], now=T0 + 3)
    assert (hb.outcome, hb.status) == (Outcome.OK, Status.COMPLETED)


async def test_fail_schedules_a_retry_then_dead_letters(storage: Store) -> None:
    (job_id,) = await insert(storage, new(max_attempts=2))
    lease = await claim_one(storage, now=T0 + 1)
    (res,) = await storage.jobs_fail([FailItem(job_id, lease.lease_token, "boom")], now=T0 + 2, retry_at=ALWAYS_RETRY)
    assert (res.outcome, res.status, res.applied) == (Outcome.OK, Status.PENDING, True)
    job = await storage.job_get(job_id)
    assert job.status is Status.PENDING and job.attempt == 1 and job.scheduled_at == when(T0 + 12)
    assert job.error == "boom" and [(e.attempt, e.error, e.at) for e in job.errors] == [(1, "boom", when(T0 + 2))]
    assert job.locked_until is None
    (replay,) = await storage.jobs_fail([FailItem(job_id, lease.lease_token, "boom")], now=T0 + 3, retry_at=ALWAYS_RETRY)
    assert replay.outcome is Outcome.OK and not replay.applied
    assert len((await storage.job_get(job_id)).errors) == 1
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, lease.lease_token, 5)], now=T0 + 3)
    assert (hb.outcome, hb.status) == (Outcome.OK, Status.PENDING)
    (late,) = await storage.jobs_complete([CompleteItem(job_id, lease.lease_token, {})], now=T0 + 3)
    assert late.outcome is Outcome.CONFLICT
    assert await storage.jobs_claim("q", limit=1, lease_secs=30, worker_id="w", now=T0 + 11) == []
    second = await claim_one(storage, now=T0 + 12)
    assert second.job.attempt == 2
    (last,) = await storage.jobs_fail([FailItem(job_id, second.lease_token, "again")], now=T0 + 13, retry_at=ALWAYS_RETRY)
    assert last.status is Status.FAILED
    job = await storage.job_get(job_id)
    assert job.status is Status.FAILED and job.error == "again" and len(job.errors) == 2


async def test_non_retryable_fail_dead_letters_at_once(storage: Store) -> None:
    (job_id,) = await insert(storage, new(max_attempts=5))
    lease = await claim_one(storage)
    (res,) = await storage.jobs_fail(
        [FailItem(job_id, lease.lease_token, "bad input", retryable=False)], now=T0 + 2, retry_at=ALWAYS_RETRY
    )
    assert res.status is Status.FAILED
    assert (await storage.job_get(job_id)).status is Status.FAILED


async def test_batch_reports_have_per_item_outcomes(storage: Store) -> None:
    await insert(storage, *[new() for _ in range(3)])
    leases = await storage.jobs_claim("q", limit=3, lease_secs=30, worker_id="w", now=T0 + 1)
    items = [CompleteItem(lease.job.id, lease.lease_token, {"i": i}) for i, lease in enumerate(leases)]
    items.insert(1, CompleteItem(str(uuid.uuid4()), "t", {}))
    items.append(CompleteItem(leases[0].job.id, "stale", {}))
    results = await storage.jobs_complete(items, now=T0 + 2)
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.NOT_FOUND, Outcome.OK, Outcome.OK, Outcome.CONFLICT]
    for i, lease in enumerate(leases):
        assert (await storage.job_get(lease.job.id)).result == {"i": i}


async def test_batch_complete_mixes_every_outcome(storage: Store) -> None:
    """One batch holding a fresh complete, a replay of an earlier one, the
    same pair twice, a stale token, an unknown id, a malformed id and a
    cancelled job: each item gets its own outcome, only current tokens write."""
    done, fresh, twice, cancelled = await insert(storage, *[new() for _ in range(4)])
    leases = {x.job.id: x for x in await storage.jobs_claim("q", limit=4, lease_secs=30, worker_id="w", now=T0 + 1)}
    await storage.jobs_complete([CompleteItem(done, leases[done].lease_token, {"v": 0})], now=T0 + 2)
    await storage.job_cancel(cancelled, tenant="t1", now=T0 + 2)
    items = [
        CompleteItem(done, leases[done].lease_token, {"v": 1}),
        CompleteItem(fresh, leases[fresh].lease_token, {"v": 2}),
        CompleteItem(twice, leases[twice].lease_token, {"v": 3}),
        CompleteItem(twice, leases[twice].lease_token, {"v": 3}),
        CompleteItem(fresh, leases[done].lease_token, {"v": 4}),
        CompleteItem(str(uuid.uuid4()), leases[fresh].lease_token, {}),
        CompleteItem("not-a-uuid", leases[fresh].lease_token, {}),
        CompleteItem(cancelled, leases[cancelled].lease_token, {}),
    ]
    results = await storage.jobs_complete(items, now=T0 + 3)
    assert [(r.outcome, r.applied) for r in results] == [
        (Outcome.OK, False),
        (Outcome.OK, True),
        (Outcome.OK, True),
        (Outcome.OK, False),
        (Outcome.CONFLICT, False),
        (Outcome.NOT_FOUND, False),
        (Outcome.NOT_FOUND, False),
        (Outcome.CONFLICT, False),
    ]
    assert [r.queue for r in results[:4]] == ["q"] * 4
    assert (await storage.job_get(done)).result == {"v": 0}
    assert (await storage.job_get(fresh)).result == {"v": 2}
    assert (await storage.job_get(twice)).result == {"v": 3}
    assert (await storage.job_get(cancelled)).status is Status.CANCELLED

async def test_cancel(storage: Store) -> None:
    pending, running, done = await insert(storage, new(queue="a"), new(queue="b"), new(queue="c"))
    job = await storage.job_cancel(pending, tenant="t1", now=T0 + 1)
    assert job.status is Status.CANCELLED and job.updated_at == when(T0 + 1)
    assert await storage.jobs_claim("a", limit=1, lease_secs=30, worker_id="w", now=T0 + 2) == []
    lease = await claim_one(storage, queue="b")
    await storage.job_cancel(running, tenant="t1", now=T0 + 2)
    (res,) = await storage.jobs_complete([CompleteItem(running, lease.lease_token, {})], now=T0 + 3)
    assert res.outcome is Outcome.CONFLICT
    (res,) = await storage.jobs_fail([FailItem(running, lease.lease_token, "x")], now=T0 + 3, retry_at=ALWAYS_RETRY)
    assert res.outcome is Outcome.CONFLICT
    assert (await storage.job_get(running)).status is Status.CANCELLED
    lease_c = await claim_one(storage, queue="c")
    await storage.jobs_complete([CompleteItem(done, lease_c.lease_token, {})], now=T0 + 3)
    with pytest.raises(errors.Conflict):
        await storage.job_cancel(done, tenant="t1", now=T0 + 4)
    with pytest.raises(errors.Conflict):
        await storage.job_cancel(pending, tenant="t1", now=T0 + 4)
    assert await storage.job_cancel(pending, tenant="t2", now=T0 + 4) is None
    assert await storage.job_cancel(str(uuid.uuid4()), tenant="t1", now=T0 + 4) is None


async def test_retry_gives_a_fresh_budget(storage: Store) -> None:
    (job_id,) = await insert(storage, new(max_attempts=1))
    lease = await claim_one(storage)
    await storage.jobs_fail([FailItem(job_id, lease.lease_token, "x")], now=T0 + 2, retry_at=ALWAYS_RETRY)
    with pytest.raises(errors.Conflict):
        await _retry_pending(storage)
    job = await storage.job_retry(job_id, tenant="t1", now=T0 + 3)
    assert job.status is Status.PENDING and job.attempt == 0 and job.scheduled_at == when(T0 + 3)
    assert job.errors[0].error == "x"
    # where it last ran stays visible until a new lease replaces it
    assert (job.worker_id, job.locked_until) == ("w1", None)
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, lease.lease_token, 5)], now=T0 + 3)
    assert hb.outcome is Outcome.CONFLICT
    again = await claim_one(storage, now=T0 + 4)
    assert again.job.attempt == 1
    assert await storage.job_retry(job_id, tenant="t2", now=T0 + 5) is None


async def _retry_pending(storage: Store) -> None:
    (job_id,) = await insert(storage, new(queue="other"))
    await storage.job_retry(job_id, tenant="t1", now=T0)


async def test_list_is_keyset_paginated_newest_first(storage: Store) -> None:
    ids = []
    for i in range(7):
        ids += await insert(storage, new(kind="even" if i % 2 == 0 else "odd"), now=T0 + i)
    await insert(storage, new(tenant="t2"), now=T0 + 100)
    page1 = await storage.jobs_list(tenant="t1", limit=3)
    assert [j.id for j in page1] == ids[::-1][:3]
    last = page1[-1]
    page2 = await storage.jobs_list(tenant="t1", limit=3, before=(last.created_at.timestamp(), last.id))
    assert [j.id for j in page2] == ids[::-1][3:6]
    evens = await storage.jobs_list(tenant="t1", kind="even")
    assert [j.id for j in evens] == ids[::-2]
    assert await storage.jobs_list(tenant="t1", status=Status.RUNNING) == []
    assert len(await storage.jobs_list(tenant="t1", queue="q", status=Status.PENDING)) == 7


async def test_list_pages_through_equal_timestamps(storage: Store) -> None:
    ids = set(await insert(storage, *[new() for _ in range(5)], now=T0))
    seen: list[str] = []
    before = None
    while True:
        page = await storage.jobs_list(tenant="t1", limit=2, before=before)
        if not page:
            break
        seen += [j.id for j in page]
        before = (page[-1].created_at.timestamp(), page[-1].id)
    assert len(seen) == 5 and set(seen) == ids


async def test_queue_stats(storage: Store) -> None:
    await insert(storage, new(at=T0 - 50), new(at=T0 - 20), new(at=T0 + 40), new(queue="z"), new(tenant="t2"))
    lease = await claim_one(storage, now=T0, lease=30)  # the one ready since T0 - 50
    (stats,) = await storage.queues_stats(tenant="t1", now=T0, queue="q")
    assert stats.queue == "q"
    assert stats.counts == {"pending": 2, "running": 1, "completed": 0, "failed": 0, "cancelled": 0}
    assert stats.oldest_ready_at == when(T0 - 20)
    assert stats.next_available_at == when(T0 + 30)  # the lease runs out before the scheduled job
    await storage.jobs_complete([CompleteItem(lease.job.id, lease.lease_token, {})], now=T0 + 1)
    (stats,) = await storage.queues_stats(tenant="t1", now=T0 + 1, queue="q")
    assert stats.counts["completed"] == 1 and stats.next_available_at == when(T0 + 40)
    every = await storage.queues_stats(tenant="t1", now=T0)
    assert [s.queue for s in every] == ["q", "z"]
    (empty,) = await storage.queues_stats(tenant="t1", now=T0, queue="nothing")
    assert sum(empty.counts.values()) == 0 and empty.oldest_ready_at is None and empty.next_available_at is None


async def test_next_available_at(storage: Store) -> None:
    assert await storage.queue_next_available_at("q", now=T0) is None
    await insert(storage, new(at=T0 + 50), new(at=T0 - 1))
    await claim_one(storage, now=T0, lease=20)
    assert await storage.queue_next_available_at("q", now=T0) == T0 + 20
    assert await storage.queue_next_available_at("q", now=T0 + 30) == T0 + 20


async def test_next_available_at_counts_jobs_scheduled_ahead_of_their_creation(storage: Store) -> None:
    # Due when created: claimable at once, never "next", even for a clock
    # that reads an earlier time; scheduled ahead (a delay, a retry): next.
    await insert(storage, new(at=T0 + 5), now=T0 + 10)
    assert await storage.queue_next_available_at("q", now=T0) is None
    await insert(storage, new(at=T0 + 40), now=T0 + 10)
    assert await storage.queue_next_available_at("q", now=T0) == T0 + 40


async def test_reap_expired(storage: Store) -> None:
    (job_id,) = await insert(storage, new(max_attempts=3))
    lease = await claim_one(storage, now=T0, lease=10)
    assert await storage.jobs_reap_expired(now=T0 + 5) == []
    (reaped,) = await storage.jobs_reap_expired(now=T0 + 11)
    assert (reaped.job_id, reaped.queue, reaped.status) == (job_id, "q", Status.PENDING)
    job = await storage.job_get(job_id)
    assert job.status is Status.PENDING and job.locked_until is None and job.worker_id == "w1"
    assert job.errors[-1].error == LEASE_EXPIRED
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(job_id, lease.lease_token, 5)], now=T0 + 12)
    assert hb.outcome is Outcome.CONFLICT
    again = await claim_one(storage, now=T0 + 12)
    assert again.job.attempt == 2


async def test_prune_removes_only_old_finished_jobs(storage: Store) -> None:
    done, cancelled, pending, fresh = await insert(storage, new(queue="a"), new(), new(), new(queue="b"))
    lease = await claim_one(storage, queue="a", now=T0)
    await storage.jobs_complete([CompleteItem(done, lease.lease_token, {})], now=T0)
    await storage.job_cancel(cancelled, tenant="t1", now=T0)
    lease_b = await claim_one(storage, queue="b", now=T0 + 100)
    await storage.jobs_complete([CompleteItem(fresh, lease_b.lease_token, {})], now=T0 + 100)
    assert await storage.jobs_prune(before=T0 + 50) == 2
    assert await storage.job_get(done) is None and await storage.job_get(cancelled) is None
    assert await storage.job_get(pending) is not None and await storage.job_get(fresh) is not None


async def test_concurrent_calls_succeed_or_fail_on_their_own(storage: Store) -> None:
    (done,) = await insert(storage, new(queue="d"))
    lease = await claim_one(storage, queue="d")
    await storage.jobs_complete([CompleteItem(done, lease.lease_token, {})], now=T0 + 2)
    conflicts: list[Exception] = []
    inserted: list[str] = []

    async def refused_cancel() -> None:
        try:
            await storage.job_cancel(done, tenant="t1", now=T0 + 3)
        except errors.Conflict as exc:
            conflicts.append(exc)

    async def enqueue(i: int) -> None:
        inserted.extend(await insert(storage, new(kind=f"k{i}")))

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(refused_cancel)
            nursery.start_soon(enqueue, i)
    assert len(conflicts) == 20
    assert len(inserted) == 20
    for job_id in inserted:
        assert (await storage.job_get(job_id)).status is Status.PENDING
    assert (await storage.job_get(done)).status is Status.COMPLETED
