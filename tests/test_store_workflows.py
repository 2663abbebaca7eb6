"""Workflows in the store conformance suite: every backend runs these unchanged.

The graph checks live in the engine (``qftrio.server.workflows``); these tests
hand the store graphs that are already valid, and drive steps through the
same job methods a worker's reports reach.
"""

from __future__ import annotations

import functools
import uuid

import pytest
import trio

from qftrio import errors
from qftrio.models import Status, StepStatus, Workflow, WorkflowStatus
from qftrio.models import to_datetime as when
from qftrio.server.engine import RetryPolicy
from qftrio.server.store.base import (
    LEASE_EXPIRED,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    NewStep,
    NewWorkflow,
    Outcome,
    Store,
)

T0 = 1_800_000_000.0
ALWAYS_RETRY = RetryPolicy(base_secs=10, cap_secs=10, jitter=0).retry_at


def step(name: str, *deps: str, kind: str = "k", max_attempts: int = 5, **payload) -> NewStep:
    return NewStep(name=name, kind=kind, payload=payload, depends_on=deps, max_attempts=max_attempts)


def diamond(tenant: str = "t1", **context) -> NewWorkflow:
    return NewWorkflow(
        tenant=tenant,
        name="diamond",
        context=context,
        steps=(step("a", n=1), step("b", "a"), step("c", "a"), step("d", "b", "c", kind="join")),
    )


async def claim_all(storage: Store, *, now: float = T0 + 1, lease: float = 30) -> dict[str, object]:
    """Claim every ready step job; returns step name -> lease."""
    leases = await storage.jobs_claim("default", limit=100, lease_secs=lease, worker_id="w", now=now)
    return {lease_.job.step: lease_ for lease_ in leases}


async def complete(storage: Store, lease, result: dict, *, now: float = T0 + 2):
    (res,) = await storage.jobs_complete([CompleteItem(lease.job.id, lease.lease_token, result)], now=now)
    assert res.outcome is Outcome.OK and res.applied
    return res


def statuses(workflow: Workflow) -> dict[str, str]:
    return {s.name: s.status.value for s in workflow.steps}


async def test_create_enqueues_the_steps_without_dependencies(storage: Store) -> None:
    wf = await storage.workflow_create(diamond(region="eu"), now=T0)
    uuid.UUID(wf.id)
    assert (wf.tenant, wf.name, wf.status, wf.context) == ("t1", "diamond", WorkflowStatus.RUNNING, {"region": "eu"})
    assert wf.created_at == wf.updated_at == when(T0)
    assert [s.name for s in wf.steps] == ["a", "b", "c", "d"]
    assert statuses(wf) == {"a": "pending", "b": "waiting", "c": "waiting", "d": "waiting"}
    a = wf.step("a")
    assert a.depends_on == () and wf.step("d").depends_on == ("b", "c") and a.payload == {"n": 1}
    assert a.job is not None and a.job_id == a.job.id
    assert wf.step("b").job is None and wf.step("b").job_id is None
    job = a.job
    assert (job.queue, job.kind, job.tenant, job.status) == ("default", "k", "t1", Status.PENDING)
    assert (job.workflow_id, job.step, job.context, job.payload) == (wf.id, "a", {"region": "eu"}, {"n": 1})
    assert await storage.workflow_get(wf.id) == wf
    assert await storage.job_get(job.id) == job


async def test_diamond_advances_and_merges_the_context(storage: Store) -> None:
    wf = await storage.workflow_create(diamond(seed=0, keep="me"), now=T0)
    leases = await claim_all(storage)
    assert list(leases) == ["a"]
    res = await complete(storage, leases["a"], {"seed": 1, "from_a": "A"})
    assert res.ready_queues == ("default",)
    wf = await storage.workflow_get(wf.id)
    assert statuses(wf) == {"a": "completed", "b": "pending", "c": "pending", "d": "waiting"}
    assert wf.context == {"seed": 1, "keep": "me", "from_a": "A"}
    leases = await claim_all(storage, now=T0 + 3)
    assert sorted(leases) == ["b", "c"]
    for name in ("b", "c"):
        assert leases[name].job.context == {"seed": 1, "keep": "me", "from_a": "A"}
    res = await complete(storage, leases["b"], {"seed": 2, "from_b": "B"}, now=T0 + 4)
    assert res.ready_queues == ()  # d still waits for c
    assert (await storage.workflow_get(wf.id)).step("d").status is StepStatus.WAITING
    res = await complete(storage, leases["c"], {"seed": 3}, now=T0 + 5)
    assert res.ready_queues == ("default",)
    (d,) = (await claim_all(storage, now=T0 + 6)).values()
    assert d.job.step == "d" and d.job.kind == "join"
    assert d.job.context == {"seed": 3, "keep": "me", "from_a": "A", "from_b": "B"}
    await complete(storage, d, {"done": True}, now=T0 + 7)
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.COMPLETED and wf.updated_at == when(T0 + 7)
    assert set(statuses(wf).values()) == {"completed"}
    assert wf.context == {"seed": 3, "keep": "me", "from_a": "A", "from_b": "B", "done": True}


async def test_replayed_completion_changes_nothing(storage: Store) -> None:
    wf = await storage.workflow_create(diamond(), now=T0)
    a = (await claim_all(storage))["a"]
    await complete(storage, a, {"x": 1})
    (replay,) = await storage.jobs_complete([CompleteItem(a.job.id, a.lease_token, {"x": 2})], now=T0 + 3)
    assert replay.outcome is Outcome.OK and not replay.applied and replay.ready_queues == ()
    wf = await storage.workflow_get(wf.id)
    assert wf.context == {"x": 1}
    assert sorted(await claim_all(storage, now=T0 + 4)) == ["b", "c"]  # enqueued once, not twice


async def test_two_steps_completed_in_one_batch(storage: Store) -> None:
    wf = await storage.workflow_create(
        NewWorkflow(tenant="t1", name="w", context={}, steps=(step("a"), step("b"), step("c", "a", "b"))), now=T0
    )
    leases = await claim_all(storage)
    results = await storage.jobs_complete(
        [CompleteItem(leases[n].job.id, leases[n].lease_token, {n: True}) for n in ("a", "b")], now=T0 + 2
    )
    assert [r.ready_queues for r in results] == [(), ("default",)]
    (c,) = (await claim_all(storage, now=T0 + 3)).values()
    assert c.job.context == {"a": True, "b": True}
    await complete(storage, c, {}, now=T0 + 4)
    assert (await storage.workflow_get(wf.id)).status is WorkflowStatus.COMPLETED


async def test_get_is_tenant_scoped(storage: Store) -> None:
    wf = await storage.workflow_create(diamond(tenant="t1"), now=T0)
    assert await storage.workflow_get(wf.id, tenant="t2") is None
    assert (await storage.workflow_get(wf.id, tenant="t1")).id == wf.id
    assert await storage.workflow_get("not-a-uuid") is None
    assert await storage.workflow_get(str(uuid.uuid4())) is None
    assert await storage.workflow_cancel(wf.id, tenant="t2", now=T0) is None
    assert await storage.workflow_cancel(str(uuid.uuid4()), tenant="t1", now=T0) is None
    bare = await storage.workflow_get(wf.id, jobs=False)
    assert bare.step("a").job is None and bare.step("a").job_id is not None
    assert statuses(bare) == statuses(wf)


async def test_dead_lettered_step_fails_the_workflow_and_cancels_the_rest(storage: Store) -> None:
    wf = await storage.workflow_create(
        NewWorkflow(
            tenant="t1",
            name="w",
            context={},
            steps=(step("a", max_attempts=2), step("b"), step("c"), step("after_a", "a"), step("after_b", "b")),
        ),
        now=T0,
    )
    leases = await claim_all(storage)
    assert sorted(leases) == ["a", "b", "c"]
    await complete(storage, leases["c"], {})
    # a retryable failure with attempts left changes nothing for the workflow
    a = leases["a"]
    (res,) = await storage.jobs_fail([FailItem(a.job.id, a.lease_token, "boom")], now=T0 + 3, retry_at=ALWAYS_RETRY)
    assert res.status is Status.PENDING
    assert (await storage.workflow_get(wf.id)).status is WorkflowStatus.RUNNING
    a = (await claim_all(storage, now=T0 + 20))["a"]
    (res,) = await storage.jobs_fail(
        [FailItem(a.job.id, a.lease_token, "boom again")], now=T0 + 21, retry_at=ALWAYS_RETRY
    )
    assert res.status is Status.FAILED
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.FAILED and wf.updated_at == when(T0 + 21)
    assert statuses(wf) == {"a": "failed", "b": "cancelled", "c": "completed", "after_a": "cancelled", "after_b": "cancelled"}
    assert wf.step("after_a").job_id is None
    # the running step's worker learns it on its next heartbeat, and cannot report
    b = leases["b"]
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(b.job.id, b.lease_token, 30)], now=T0 + 22)
    assert (hb.outcome, hb.status) == (Outcome.OK, Status.CANCELLED)
    (late,) = await storage.jobs_complete([CompleteItem(b.job.id, b.lease_token, {})], now=T0 + 22)
    assert late.outcome is Outcome.CONFLICT
    assert await claim_all(storage, now=T0 + 100) == {}


async def test_expired_lease_without_attempts_fails_the_workflow(storage: Store) -> None:
    wf = await storage.workflow_create(
        NewWorkflow(tenant="t1", name="w", context={}, steps=(step("a", max_attempts=1), step("c", "a"))),
        now=T0,
    )
    await claim_all(storage, now=T0 + 1, lease=10)
    (reaped,) = await storage.jobs_reap_expired(now=T0 + 20)
    assert reaped.status is Status.FAILED
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.FAILED and statuses(wf) == {"a": "failed", "c": "cancelled"}
    assert wf.step("a").job.error == LEASE_EXPIRED and wf.step("a").job.worker_id == "w"


async def test_steps_expiring_in_one_round_fail_the_one_that_ran_out_first(storage: Store) -> None:
    wf = await storage.workflow_create(
        NewWorkflow(
            tenant="t1",
            name="w",
            context={},
            steps=(step("a", max_attempts=1), step("b", max_attempts=1), step("c", max_attempts=3), step("d", "a")),
        ),
        now=T0,
    )
    leases = await claim_all(storage, now=T0 + 1, lease=10)
    a, b, c = leases["a"], leases["b"], leases["c"]
    beats = [HeartbeatItem(b.job.id, b.lease_token, 3), HeartbeatItem(c.job.id, c.lease_token, 6)]
    await storage.jobs_heartbeat(beats, now=T0 + 2)
    # all three leases ran out in one janitor round: b's first, at T0 + 5
    reaped = await storage.jobs_reap_expired(now=T0 + 20)
    assert [(r.job_id, r.status) for r in reaped] == [(b.job.id, Status.FAILED)]
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.FAILED
    assert statuses(wf) == {"a": "cancelled", "b": "failed", "c": "cancelled", "d": "cancelled"}
    assert wf.step("b").job.error == LEASE_EXPIRED
    for sibling in (a, c):
        job = wf.step(sibling.job.step).job
        # taken back by the janitor: the deadline cleared, the token stale,
        # the worker kept, and an error entry that names the failed step
        assert job.locked_until is None and job.worker_id == sibling.job.worker_id
        assert job.error == f"{LEASE_EXPIRED}; cancelled with its workflow, which failed at step 'b'"
        assert [(e.attempt, e.error, e.at) for e in job.errors] == [(1, job.error, when(T0 + 20))]
        (hb,) = await storage.jobs_heartbeat([HeartbeatItem(job.id, sibling.lease_token, 30)], now=T0 + 21)
        assert hb.outcome is Outcome.CONFLICT
    # the failed step is the one to retry
    with pytest.raises(errors.Conflict, match="failed at step 'b'"):
        await storage.job_retry(a.job.id, tenant="t1", now=T0 + 22)
    await storage.job_retry(b.job.id, tenant="t1", now=T0 + 22)
    assert statuses(await storage.workflow_get(wf.id)) == {"a": "pending", "b": "pending", "c": "pending", "d": "waiting"}


async def test_steps_whose_leases_ran_out_together_fail_the_earlier_step(storage: Store) -> None:
    wf = await storage.workflow_create(
        NewWorkflow(tenant="t1", name="w", context={}, steps=(step("x", max_attempts=1), step("y", max_attempts=1))),
        now=T0,
    )
    leases = await claim_all(storage, now=T0 + 1, lease=10)
    (reaped,) = await storage.jobs_reap_expired(now=T0 + 20)
    assert reaped.job_id == leases["x"].job.id
    assert statuses(await storage.workflow_get(wf.id)) == {"x": "failed", "y": "cancelled"}


async def test_retrying_the_failed_step_resumes_the_workflow(storage: Store) -> None:
    wf = await storage.workflow_create(
        NewWorkflow(
            tenant="t1",
            name="w",
            context={"v": 0},
            steps=(step("a", max_attempts=1), step("b"), step("after_a", "a"), step("after_b", "b")),
        ),
        now=T0,
    )
    leases = await claim_all(storage)
    a, b = leases["a"], leases["b"]
    await storage.jobs_fail([FailItem(a.job.id, a.lease_token, "boom", retryable=False)], now=T0 + 2, retry_at=ALWAYS_RETRY)
    wf = await storage.workflow_get(wf.id)
    assert statuses(wf) == {"a": "failed", "b": "cancelled", "after_a": "cancelled", "after_b": "cancelled"}
    # only the failed step's job resumes it
    with pytest.raises(errors.Conflict, match="retry that step's job"):
        await storage.job_retry(b.job.id, tenant="t1", now=T0 + 3)
    assert await storage.job_retry(a.job.id, tenant="t2", now=T0 + 3) is None
    job = await storage.job_retry(a.job.id, tenant="t1", now=T0 + 3)
    assert job.status is Status.PENDING and job.attempt == 0 and job.errors[0].error == "boom"
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.RUNNING
    assert statuses(wf) == {"a": "pending", "b": "pending", "after_a": "waiting", "after_b": "waiting"}
    assert wf.step("b").job_id == b.job.id  # the same job, never a second one
    # the old lease of b is stale for good
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(b.job.id, b.lease_token, 30)], now=T0 + 4)
    assert hb.outcome is Outcome.CONFLICT
    leases = await claim_all(storage, now=T0 + 5)
    assert sorted(leases) == ["a", "b"] and leases["a"].job.attempt == 1
    await complete(storage, leases["a"], {"v": 1}, now=T0 + 6)
    await complete(storage, leases["b"], {}, now=T0 + 6)
    leases = await claim_all(storage, now=T0 + 7)
    assert sorted(leases) == ["after_a", "after_b"]
    assert leases["after_a"].job.context == {"v": 1}
    for lease_ in leases.values():
        await complete(storage, lease_, {}, now=T0 + 8)
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.COMPLETED
    assert len({s.job_id for s in wf.steps}) == 4


async def test_cancel_workflow(storage: Store) -> None:
    wf = await storage.workflow_create(
        NewWorkflow(tenant="t1", name="w", context={}, steps=(step("a"), step("b"), step("c", "a"))), now=T0
    )
    a = (await claim_all(storage, now=T0 + 1))["a"]
    got = await storage.workflow_cancel(wf.id, tenant="t1", now=T0 + 2)
    assert got.status is WorkflowStatus.CANCELLED and got.updated_at == when(T0 + 2)
    assert statuses(got) == {"a": "cancelled", "b": "cancelled", "c": "cancelled"}
    assert got == await storage.workflow_get(wf.id)
    (hb,) = await storage.jobs_heartbeat([HeartbeatItem(a.job.id, a.lease_token, 30)], now=T0 + 3)
    assert hb.status is Status.CANCELLED
    (res,) = await storage.jobs_complete([CompleteItem(a.job.id, a.lease_token, {})], now=T0 + 3)
    assert res.outcome is Outcome.CONFLICT
    with pytest.raises(errors.Conflict):
        await storage.workflow_cancel(wf.id, tenant="t1", now=T0 + 4)
    # a cancelled workflow is final
    with pytest.raises(errors.Conflict, match="cancelled"):
        await storage.job_retry(a.job.id, tenant="t1", now=T0 + 4)
    assert await claim_all(storage, now=T0 + 5) == {}


async def test_cancelling_a_step_job_cancels_the_workflow(storage: Store) -> None:
    wf = await storage.workflow_create(diamond(), now=T0)
    a = (await claim_all(storage))["a"]
    await complete(storage, a, {})
    b_id = (await storage.workflow_get(wf.id)).step("b").job_id
    job = await storage.job_cancel(b_id, tenant="t1", now=T0 + 3)
    assert job.status is Status.CANCELLED
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.CANCELLED
    assert statuses(wf) == {"a": "completed", "b": "cancelled", "c": "cancelled", "d": "cancelled"}
    with pytest.raises(errors.Conflict):
        await storage.workflow_cancel(wf.id, tenant="t1", now=T0 + 4)


async def test_cancelled_or_completed_workflow_cannot_be_cancelled(storage: Store) -> None:
    wf = await storage.workflow_create(NewWorkflow(tenant="t1", name="one", context={}, steps=(step("only"),)), now=T0)
    await complete(storage, (await claim_all(storage))["only"], {"r": 1})
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.COMPLETED and wf.context == {"r": 1}
    with pytest.raises(errors.Conflict, match="completed"):
        await storage.workflow_cancel(wf.id, tenant="t1", now=T0 + 3)


async def test_list_is_keyset_paginated_newest_first(storage: Store) -> None:
    ids = []
    for i in range(5):
        ids.append((await storage.workflow_create(diamond(), now=T0 + i)).id)
    await storage.workflow_create(diamond(tenant="t2"), now=T0 + 100)
    await storage.workflow_cancel(ids[1], tenant="t1", now=T0 + 10)
    page1 = await storage.workflows_list(tenant="t1", limit=3)
    assert [w.id for w in page1] == ids[::-1][:3]
    assert all(s.job is None for w in page1 for s in w.steps)
    assert statuses(page1[0]) == {"a": "pending", "b": "waiting", "c": "waiting", "d": "waiting"}
    last = page1[-1]
    page2 = await storage.workflows_list(tenant="t1", limit=3, before=(last.created_at.timestamp(), last.id))
    assert [w.id for w in page2] == ids[::-1][3:]
    cancelled = await storage.workflows_list(tenant="t1", status=WorkflowStatus.CANCELLED)
    assert [w.id for w in cancelled] == [ids[1]]
    assert await storage.workflows_list(tenant="t1", status=WorkflowStatus.COMPLETED) == []
    assert await storage.workflows_list(tenant="nobody") == []


async def test_prune_keeps_unfinished_workflows(storage: Store) -> None:
    running = await storage.workflow_create(
        NewWorkflow(tenant="t1", name="r", context={}, steps=(step("a"), step("b", "a"))), now=T0
    )
    a = (await claim_all(storage))["a"]
    await complete(storage, a, {})
    assert await storage.jobs_prune(before=T0 + 1000) == 0
    assert await storage.job_get(a.job.id) is not None
    b = (await claim_all(storage, now=T0 + 3))["b"]
    await complete(storage, b, {}, now=T0 + 4)
    failed = await storage.workflow_create(
        NewWorkflow(tenant="t1", name="f", context={}, steps=(step("x", max_attempts=1),)), now=T0
    )
    x = (await claim_all(storage, now=T0 + 5))["x"]
    await storage.jobs_fail([FailItem(x.job.id, x.lease_token, "no")], now=T0 + 6, retry_at=ALWAYS_RETRY)
    cancelled = await storage.workflow_create(
        NewWorkflow(tenant="t1", name="c", context={}, steps=(step("y"),)), now=T0
    )
    await storage.workflow_cancel(cancelled.id, tenant="t1", now=T0 + 500)
    # the completed workflow ended at T0 + 4, the cancelled one at T0 + 500
    assert await storage.jobs_prune(before=T0 + 100) == 2
    assert await storage.workflow_get(running.id) is None and await storage.job_get(a.job.id) is None
    assert (await storage.workflow_get(cancelled.id)).status is WorkflowStatus.CANCELLED
    assert await storage.jobs_prune(before=T0 + 1000) == 1
    assert await storage.workflow_get(cancelled.id) is None
    # failed workflows stay, like dead-lettered jobs, and can still resume
    assert (await storage.workflow_get(failed.id)).status is WorkflowStatus.FAILED
    assert await storage.jobs_prune(before=T0 + 10_000) == 0


async def test_a_thousand_steps_fan_out_and_fan_in(storage: Store) -> None:
    middle = [step(f"m{i}", "root") for i in range(998)]
    steps = (step("root"), *middle, step("sink", *(m.name for m in middle)))
    wf = await storage.workflow_create(NewWorkflow(tenant="t1", name="big", context={}, steps=steps), now=T0)
    assert len(wf.steps) == 1000
    assert sum(1 for s in wf.steps if s.job_id is not None) == 1
    root = (await claim_all(storage))["root"]
    res = await complete(storage, root, {"root": True})
    assert res.ready_queues == ("default",)
    done, now = 1, T0 + 3
    while True:
        now += 1
        leases = await storage.jobs_claim("default", limit=100, lease_secs=30, worker_id="w", now=now)
        if not leases:
            break
        results = await storage.jobs_complete(
            [CompleteItem(x.job.id, x.lease_token, {x.job.step: 1}) for x in leases], now=now
        )
        assert all(r.applied for r in results)
        done += len(leases)
    assert done == 1000
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.COMPLETED
    assert len(wf.context) == 1000  # root plus one key per middle step plus the sink's
    assert sum(1 for s in wf.steps if s.status is StepStatus.COMPLETED) == 1000
    assert wf.step("sink").job.context["m997"] == 1


@pytest.mark.soak
async def test_a_thousand_step_chain(storage: Store) -> None:
    steps = (step("s0"), *(step(f"s{i}", f"s{i - 1}") for i in range(1, 1000)))
    wf = await storage.workflow_create(NewWorkflow(tenant="t1", name="chain", context={}, steps=steps), now=T0)
    for i in range(1000):
        (lease_,) = await storage.jobs_claim("default", limit=10, lease_secs=30, worker_id="w", now=T0 + i)
        assert lease_.job.step == f"s{i}"
        await complete(storage, lease_, {"last": i}, now=T0 + i)
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.COMPLETED and wf.context == {"last": 999}


async def test_batch_fail_of_two_steps_fails_the_workflow_once(storage: Store) -> None:
    wf = await storage.workflow_create(
        NewWorkflow(tenant="t1", name="w", context={}, steps=(step("a", max_attempts=1), step("b", max_attempts=1))),
        now=T0,
    )
    leases = await claim_all(storage)
    items = [FailItem(leases[n].job.id, leases[n].lease_token, f"{n} broke") for n in ("a", "b")]
    first, second = await storage.jobs_fail(items, now=T0 + 2, retry_at=ALWAYS_RETRY)
    assert (first.outcome, first.status) == (Outcome.OK, Status.FAILED)
    # b was cancelled with the workflow before its own report was applied
    assert second.outcome is Outcome.CONFLICT
    wf = await storage.workflow_get(wf.id)
    assert wf.status is WorkflowStatus.FAILED and statuses(wf) == {"a": "failed", "b": "cancelled"}
    job = await storage.job_retry(leases["a"].job.id, tenant="t1", now=T0 + 3)
    assert job.status is Status.PENDING
    assert statuses(await storage.workflow_get(wf.id)) == {"a": "pending", "b": "pending"}


def fan(width: int, *, max_attempts: int = 5) -> NewWorkflow:
    parts = [step(f"p{i}", "root", max_attempts=max_attempts) for i in range(width)]
    return NewWorkflow(
        tenant="t1", name="fan", context={}, steps=(step("root"), *parts, step("sink", *(p.name for p in parts)))
    )


async def test_concurrent_completions_of_one_workflow(storage: Store) -> None:
    wf = await storage.workflow_create(fan(40), now=T0)
    await complete(storage, (await claim_all(storage))["root"], {})
    leases = await claim_all(storage, now=T0 + 3)
    assert len(leases) == 40

    async def report(lease_) -> None:
        await storage.jobs_complete([CompleteItem(lease_.job.id, lease_.lease_token, {lease_.job.step: 1})], now=T0 + 4)

    async with trio.open_nursery() as nursery:
        for lease_ in leases.values():
            nursery.start_soon(report, lease_)
    (sink,) = (await claim_all(storage, now=T0 + 5)).values()
    assert sink.job.step == "sink" and sink.job.context == {f"p{i}": 1 for i in range(40)}
    wf = await storage.workflow_get(wf.id)
    assert wf.context == sink.job.context
    assert statuses(wf)["sink"] == "running"


async def test_concurrent_reports_and_cancels_keep_the_invariants(storage: Store) -> None:
    workflows = [await storage.workflow_create(fan(12, max_attempts=1), now=T0) for _ in range(3)]
    roots = await storage.jobs_claim("default", limit=100, lease_secs=30, worker_id="w", now=T0 + 1)
    assert len(roots) == 3
    for lease_ in roots:
        await complete(storage, lease_, {})
    leases = await storage.jobs_claim("default", limit=100, lease_secs=30, worker_id="w", now=T0 + 3)
    assert len(leases) == 36

    by_workflow: dict[str, list] = {}
    for lease_ in leases:
        by_workflow.setdefault(lease_.job.workflow_id, []).append(lease_)
    doomed = {by_workflow[workflows[0].id][3].job.id, by_workflow[workflows[1].id][7].job.id}

    async def report(lease_) -> None:
        if lease_.job.id in doomed:
            await storage.jobs_fail([FailItem(lease_.job.id, lease_.lease_token, "no")], now=T0 + 4, retry_at=ALWAYS_RETRY)
        else:
            await storage.jobs_complete([CompleteItem(lease_.job.id, lease_.lease_token, {})], now=T0 + 4)

    async with trio.open_nursery() as nursery:
        for lease_ in leases:
            nursery.start_soon(report, lease_)
        nursery.start_soon(functools.partial(storage.workflow_cancel, workflows[2].id, tenant="t1", now=T0 + 4))
    expected = [WorkflowStatus.FAILED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED]
    for wf in workflows:
        wf = await storage.workflow_get(wf.id)
        counts = {s: list(statuses(wf).values()).count(s) for s in set(statuses(wf).values())}
        assert wf.status is expected.pop(0), counts
        assert counts.get("failed", 0) == (1 if wf.status is WorkflowStatus.FAILED else 0), counts
        assert not {"pending", "running", "waiting"} & set(counts), counts
        assert len({s.job_id for s in wf.steps if s.job_id}) == sum(1 for s in wf.steps if s.job_id)
    assert await claim_all(storage, now=T0 + 10) == {}
