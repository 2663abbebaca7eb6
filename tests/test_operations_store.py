"""Operations in the store conformance suite: every backend runs these unchanged.

Counts are checked against a full ``COUNT(*) ... GROUP BY`` of the jobs
table after random work, pages against a full scan; pause, bulk actions,
the live workers and the metrics through the engine.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from qftrio import errors
from qftrio.models import EnqueueRequest, JobConfig, Status
from qftrio.models import to_datetime as when
from qftrio.server.engine import Engine, RetryPolicy
from qftrio.server.store.base import (
    ClaimRequest,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    NewJob,
    NewStep,
    NewWorkflow,
    Store,
)
from qftrio.server.store.sqlite import SqliteStore

from .pg import pg_url

T0 = 1_800_000_000.0
RETRY = RetryPolicy(base_secs=5, cap_secs=5, jitter=0).retry_at


def new(kind: str = "k", *, queue: str = "q", tenant: str = "t1", at: float = T0, created: float = T0) -> NewJob:
    return NewJob(tenant=tenant, queue=queue, kind=kind, payload={}, scheduled_at=at, max_attempts=2)


async def rows(storage: Store, statement: str) -> list[tuple[Any, ...]]:
    """A raw read of the store's own tables (``{jobs}`` is the jobs table)."""
    if isinstance(storage, SqliteStore):
        text = statement.format(jobs="jobs")
        return await storage._run(lambda conn: [tuple(r) for r in conn.execute(text)])
    text = statement.format(jobs="qftrio_jobs")
    return [tuple(r) for r in await storage._db.fetch(text)]  # type: ignore[attr-defined]


async def full_counts(storage: Store) -> dict[tuple[str, str], dict[str, int]]:
    out: dict[tuple[str, str], dict[str, int]] = {}
    for tenant, queue, status, n in await rows(
        storage, "SELECT tenant, queue, status, count(*) FROM {jobs} GROUP BY tenant, queue, status"
    ):
        out.setdefault((tenant, queue), {s.value: 0 for s in Status})[status] = n
    return out


async def stats_counts(storage: Store, now: float) -> dict[tuple[str, str], dict[str, int]]:
    out = {}
    scheduled = {
        (tenant, queue): n
        for tenant, queue, n in await rows(
            storage,
            "SELECT tenant, queue, count(*) FROM {jobs} WHERE status = 'pending' AND scheduled_at > " + repr(now)
            + " GROUP BY tenant, queue",
        )
    }
    for tenant, stats in await storage.queues_overview(now=now):
        assert stats.scheduled == scheduled.get((tenant, stats.queue), 0)
        if any(stats.counts.values()):
            out[(tenant, stats.queue)] = stats.counts
    for tenant in ("t1", "t2"):
        for stats in await storage.queues_stats(tenant=tenant, now=now):
            assert out.get((tenant, stats.queue), {s.value: 0 for s in Status}) == stats.counts
    return out


async def all_pages(storage: Store, tenant: str, limit: int, **filters: Any) -> list[str]:
    ids: list[str] = []
    before = None
    while True:
        page = await storage.jobs_list(tenant=tenant, limit=limit, before=before, **filters)
        ids += [job.id for job in page]
        if len(page) < limit:
            return ids
        before = (page[-1].created_at.timestamp(), page[-1].id)


async def test_counts_and_pages_stay_exact_through_random_work(storage: Store) -> None:
    rand = random.Random(16)
    now = T0
    queues, kinds, tenants = ["a", "b", "c"], ["x", "y"], ["t1", "t2"]
    held: list[tuple[str, str]] = []  # (job id, token) of running jobs
    workflows: list[str] = []
    for round_ in range(60):
        now += rand.choice([0.5, 1, 3, 20])  # 20: leases (10 s) run out, retries (5 s) come due
        op = rand.random()
        if op < 0.3:
            batch = [
                new(rand.choice(kinds), queue=rand.choice(queues), tenant=rand.choice(tenants),
                    at=now + rand.choice([0, 0, 4]))
                for _ in range(rand.randint(1, 6))
            ]  # fmt: skip
            if rand.random() < 0.3:
                _, leases = await storage.jobs_insert_claiming(
                    batch, now=now, claims=[ClaimRequest(queue=batch[0].queue, limit=2, lease_secs=10)]
                )
                held += [(lease.job.id, lease.lease_token) for lease in leases[0]]
            else:
                await storage.jobs_insert(batch, now=now)
        elif op < 0.5:
            leases = await storage.jobs_claim(
                rand.choice(queues + ["default"]), limit=4, lease_secs=10, worker_id="w", now=now
            )
            held += [(lease.job.id, lease.lease_token) for lease in leases]
        elif op < 0.65 and held:
            rand.shuffle(held)
            done, held = held[:3], held[3:]
            await storage.jobs_complete(
                [CompleteItem(job_id=j, lease_token=t, result={"r": round_}) for j, t in done], now=now
            )
        elif op < 0.75 and held:
            rand.shuffle(held)
            done, held = held[:2], held[2:]
            await storage.jobs_fail(
                [FailItem(job_id=j, lease_token=t, error="e", retryable=rand.random() < 0.7) for j, t in done],
                now=now,
                retry_at=RETRY,
            )
        elif op < 0.8 and held:
            await storage.jobs_heartbeat([HeartbeatItem(job_id=j, lease_token=t, extend_secs=10) for j, t in held], now=now)
        elif op < 0.85:
            workflow = await storage.workflow_create(
                NewWorkflow(
                    tenant=rand.choice(tenants), name="w", context={},
                    steps=(NewStep(name="s1", kind="x", payload={}, max_attempts=1),
                           NewStep(name="s2", kind="y", payload={}, depends_on=("s1",))),
                ),
                now=now,
            )  # fmt: skip
            workflows.append(workflow.id)
        elif op < 0.9:
            tenant = rand.choice(tenants)
            jobs = await storage.jobs_list(tenant=tenant, limit=20)
            if jobs:
                job = rand.choice(jobs)
                try:
                    if rand.random() < 0.5:
                        await storage.job_cancel(job.id, tenant=tenant, now=now)
                    else:
                        await storage.job_retry(job.id, tenant=tenant, now=now)
                except errors.Conflict:
                    pass
        elif op < 0.93 and workflows:
            workflow = await storage.workflow_get(rand.choice(workflows))
            if workflow is not None:
                try:
                    await storage.workflow_cancel(workflow.id, tenant=workflow.tenant, now=now)
                except errors.Conflict:
                    pass
        elif op < 0.96:
            await storage.jobs_reap_expired(now=now)
        else:
            await storage.counts_fold()
            await storage.jobs_prune(before=now - 15)
        if round_ % 6 == 5:
            assert await stats_counts(storage, now) == {
                key: counts for key, counts in (await full_counts(storage)).items() if any(counts.values())
            }
    await storage.counts_fold()
    assert await stats_counts(storage, now) == {
        key: counts for key, counts in (await full_counts(storage)).items() if any(counts.values())
    }
    if not isinstance(storage, SqliteStore):  # the fold left one ledger row per combination
        assert await rows(
            storage, "SELECT 1 FROM qftrio_job_counts GROUP BY tenant, queue, kind, status HAVING count(*) > 1"
        ) == []
    # Every filter, paged, is the full scan's answer, newest first.
    for tenant in tenants:
        every = await rows(
            storage,
            f"SELECT id, queue, status, kind FROM {{jobs}} WHERE tenant = '{tenant}' ORDER BY created_at DESC, id DESC",
        )
        for queue in (None, "a", "default"):
            for status in (None, Status.PENDING, Status.COMPLETED, Status.FAILED, Status.CANCELLED):
                for kind in (None, "x"):
                    expected = [
                        str(id_) for id_, q, s, k in every
                        if queue in (None, q) and (status is None or s == status.value) and kind in (None, k)
                    ]  # fmt: skip
                    found = await all_pages(storage, tenant, 3, queue=queue, status=status, kind=kind)
                    assert found == expected, (tenant, queue, status, kind)


async def test_stats_times_and_paused(storage: Store) -> None:
    await storage.jobs_insert(
        [new(at=T0 - 30), new(at=T0 - 10), new(at=T0 + 50), new(tenant="t2", at=T0 - 100)], now=T0 - 40
    )
    (stats,) = await storage.queues_stats(tenant="t1", now=T0)
    assert (stats.oldest_ready_at, stats.next_available_at, stats.paused) == (when(T0 - 30), when(T0 + 50), False)
    assert stats.counts["pending"] == 3
    await storage.jobs_claim("q", limit=1, lease_secs=20, worker_id="w", now=T0)  # t2's job goes first
    await storage.jobs_claim("q", limit=1, lease_secs=20, worker_id="w", now=T0)
    (stats,) = await storage.queues_stats(tenant="t1", now=T0)
    assert (stats.oldest_ready_at, stats.next_available_at) == (when(T0 - 10), when(T0 + 20))
    await storage.queue_set_paused(tenant="t1", queue="idle", paused=True, now=T0)
    await storage.queue_set_paused(tenant="t1", queue="idle", paused=True, now=T0)  # idempotent
    listed = await storage.queues_stats(tenant="t1", now=T0)
    assert [(s.queue, s.paused) for s in listed] == [("idle", True), ("q", False)]
    assert sum(listed[0].counts.values()) == 0
    assert [s.queue for s in await storage.queues_stats(tenant="t2", now=T0)] == ["q"]
    await storage.queue_set_paused(tenant="t1", queue="idle", paused=False, now=T0)
    assert [s.queue for s in await storage.queues_stats(tenant="t1", now=T0)] == ["q"]


async def test_a_paused_queue_hands_out_nothing_of_its_tenant(storage: Store) -> None:
    await storage.jobs_insert([new(tenant="t1"), new(tenant="t1", at=T0 + 5), new(tenant="t2")], now=T0)
    await storage.queue_set_paused(tenant="t1", queue="q", paused=True, now=T0)
    claimed = await storage.jobs_claim("q", limit=10, lease_secs=30, worker_id="w", now=T0 + 1)
    assert [lease.job.tenant for lease in claimed] == ["t2"]
    assert await storage.jobs_claim("q", limit=10, lease_secs=30, worker_id="w", now=T0 + 10) == []
    # t2's lease is the next thing the queue offers; t1's scheduled job is not
    assert await storage.queue_next_available_at("q", now=T0 + 1) == T0 + 31
    # new jobs of the paused tenant are not handed to a parked poll either
    inserted, claimed_for_poll = await storage.jobs_insert_claiming(
        [new(tenant="t1")], now=T0 + 2, claims=[ClaimRequest(queue="q", limit=5, lease_secs=30)]
    )
    assert claimed_for_poll == [[]] and inserted[0].job.status is Status.PENDING
    (stats,) = await storage.queues_stats(tenant="t1", now=T0 + 10, queue="q")
    assert stats.paused and stats.counts["pending"] == 3
    await storage.queue_set_paused(tenant="t1", queue="q", paused=False, now=T0 + 10)
    claimed = await storage.jobs_claim("q", limit=10, lease_secs=30, worker_id="w", now=T0 + 10)
    assert len(claimed) == 3 and {lease.job.tenant for lease in claimed} == {"t1"}


async def test_bulk_actions_touch_exactly_the_matching_jobs_of_the_tenant(storage: Store) -> None:
    engine = Engine(storage, clock=lambda: T0 + 100)
    engine.BULK_BATCH = 2  # several batches, each its own transaction
    ids = {}
    for tenant in ("t1", "t2"):
        for queue in ("a", "b"):
            for kind in ("x", "y"):
                inserted = await storage.jobs_insert(
                    [new(kind, queue=queue, tenant=tenant) for _ in range(3)], now=T0 + len(ids)
                )
                ids[(tenant, queue, kind)] = [i.job.id for i in inserted]
    # fail every t1/a job for good, and cancel t2/a/x
    for kind in ("x", "y"):
        for _ in range(2):
            leases = await storage.jobs_claim("a", limit=12, lease_secs=30, worker_id="w", now=T0 + 50)
            await storage.jobs_fail(
                [FailItem(job_id=lease.job.id, lease_token=lease.lease_token, error="e", retryable=False)
                 for lease in leases if lease.job.tenant == "t1"],
                now=T0 + 50, retry_at=RETRY,
            )  # fmt: skip
            for lease in leases:
                if lease.job.tenant == "t2":
                    await storage.jobs_fail(
                        [FailItem(job_id=lease.job.id, lease_token=lease.lease_token, error="e")],
                        now=T0 + 50, retry_at=RETRY,
                    )  # fmt: skip
    before = await full_counts(storage)
    assert before[("t1", "a")]["failed"] == 6
    with pytest.raises(errors.InvalidInput, match="pending"):
        await engine.jobs_bulk("t1", "retry", status=Status.PENDING)
    with pytest.raises(errors.InvalidInput, match="running"):
        await engine.jobs_bulk("t1", "delete", status=Status.RUNNING)
    assert await full_counts(storage) == before
    # retry: t1's failed jobs of kind x only
    assert await engine.jobs_bulk("t1", "retry", kind="x") == 3
    assert {j.status for j in await storage.jobs_list(tenant="t1", queue="a", kind="x")} == {Status.PENDING}
    assert {j.status for j in await storage.jobs_list(tenant="t1", queue="a", kind="y")} == {Status.FAILED}
    # cancel with a limit, newest first, across batches
    newest = [j.id for j in await storage.jobs_list(tenant="t1", queue="b", limit=5)]
    assert await engine.jobs_bulk("t1", "cancel", queue="b", limit=5) == 5
    cancelled = await storage.jobs_list(tenant="t1", queue="b", status=Status.CANCELLED)
    assert [j.id for j in cancelled] == newest
    # a time range: created_after <= created_at < created_before
    b_x = await storage.jobs_list(tenant="t1", queue="b", kind="x")
    assert await engine.jobs_bulk("t1", "cancel", created_after=b_x[0].created_at.timestamp(), created_before=b_x[0].created_at.timestamp() + 1) == 1
    # delete: finished jobs of t1 only; t2's are untouched
    assert await engine.jobs_bulk("t1", "delete") == 3 + 6
    after = await full_counts(storage)
    assert after[("t2", "a")] == before[("t2", "a")] and after[("t2", "b")] == before[("t2", "b")]
    assert after[("t1", "a")] == {"pending": 3, "running": 0, "completed": 0, "failed": 0, "cancelled": 0}
    assert await stats_counts(storage, T0 + 100) == {k: v for k, v in after.items() if any(v.values())}


async def test_bulk_actions_decide_workflow_steps_as_single_calls_do(storage: Store) -> None:
    engine = Engine(storage, clock=lambda: T0 + 10)
    steps = (
        NewStep(name="s1", kind="x", payload={}, max_attempts=1),
        NewStep(name="s2", kind="x", payload={}, max_attempts=1),
        NewStep(name="s3", kind="x", payload={}, depends_on=("s1",)),
    )
    workflow = await storage.workflow_create(NewWorkflow(tenant="t1", name="w", context={}, steps=steps), now=T0)
    leases = await storage.jobs_claim("default", limit=1, lease_secs=30, worker_id="w", now=T0)
    await storage.jobs_fail(
        [FailItem(job_id=leases[0].job.id, lease_token=leases[0].lease_token, error="e")], now=T0, retry_at=RETRY
    )
    assert (await storage.workflow_get(workflow.id)).status.value == "failed"
    # delete never takes a workflow's job on its own
    assert await engine.jobs_bulk("t1", "delete") == 0
    # retry resumes the workflow through its failed step; its cancelled sibling comes back with it
    assert await engine.jobs_bulk("t1", "retry") == 2
    resumed = await storage.workflow_get(workflow.id)
    assert resumed.status.value == "running"
    assert {s.job.status for s in resumed.steps if s.job is not None} == {Status.PENDING}
    # cancel: a step cancelled by hand cancels its workflow
    assert await engine.jobs_bulk("t1", "cancel", status=Status.PENDING) == 2
    assert (await storage.workflow_get(workflow.id)).status.value == "cancelled"
    assert await engine.jobs_bulk("t1", "retry") == 0  # a cancelled workflow is final


async def test_workers_are_the_holders_of_running_jobs(storage: Store) -> None:
    await storage.jobs_insert([new(queue="a") for _ in range(3)] + [new(queue="b"), new(queue="a", tenant="t2")], now=T0)
    first = await storage.jobs_claim("a", limit=2, lease_secs=30, worker_id="w1", now=T0 + 1)
    await storage.jobs_claim("b", limit=1, lease_secs=30, worker_id="w1", now=T0 + 2)
    await storage.jobs_claim("a", limit=2, lease_secs=30, worker_id="w2", now=T0 + 3)
    await storage.jobs_heartbeat([HeartbeatItem(job_id=first[0].job.id, lease_token=first[0].lease_token, extend_secs=30)], now=T0 + 9)
    found = {(w.worker_id, w.jobs, w.queues, w.last_seen_at) for w in await storage.workers(tenant="t1", seen_since=T0)}
    tenants = {lease.job.tenant for lease in first}
    assert tenants == {"t1"} or tenants == {"t1", "t2"}
    by_id = {w.worker_id: w for w in await storage.workers(tenant="t1", seen_since=T0)}
    assert by_id["w1"].queues == ("a", "b") and by_id["w1"].last_seen_at == when(T0 + 9)
    assert sum(w.jobs for w in by_id.values()) == 4 and len(found) == 2
    await storage.jobs_complete(
        [CompleteItem(job_id=lease.job.id, lease_token=lease.lease_token, result={}) for lease in first], now=T0 + 10
    )
    left = await storage.workers(tenant="t1", seen_since=T0)
    assert sum(w.jobs for w in left) == 4 - sum(1 for lease in first if lease.job.tenant == "t1")
    assert [w.jobs for w in left] == sorted((w.jobs for w in left), reverse=True)
    assert await storage.workers(tenant="nobody", seen_since=T0) == []


def sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if m is None or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


async def test_metrics_move_as_the_jobs_do(storage: Store) -> None:
    now = [T0]
    clock = lambda: now[0]  # noqa: E731
    engine, other = Engine(storage, clock=clock), Engine(storage, clock=clock)
    await engine.enqueue("t1", [EnqueueRequest(kind="x", payload={}, config=JobConfig(queue="q")), EnqueueRequest(kind="y", payload={}, config=JobConfig(queue="q"))])
    now[0] += 4
    leases = await engine.lease("q", max_jobs=2, lease_secs=30, worker_id="w")
    now[0] += 2
    x = next(lease for lease in leases if lease.job.kind == "x")
    y = next(lease for lease in leases if lease.job.kind == "y")
    await engine.complete([CompleteItem(job_id=x.job.id, lease_token=x.lease_token, result={})])
    await engine.fail([FailItem(job_id=y.job.id, lease_token=y.lease_token, error="e", retryable=False)])
    await engine.complete([CompleteItem(job_id=y.job.id, lease_token=str(uuid.uuid4()), result={})])
    text = (await engine.metrics_exposition()).decode()
    assert sample(text, "qftrio_jobs_enqueued_total", queue="q", kind="x") == 1
    assert sample(text, "qftrio_jobs_leased_total", queue="q") == 2
    assert sample(text, "qftrio_jobs_completed_total", queue="q", kind="x") == 1
    assert sample(text, "qftrio_jobs_completed_total", kind="y") == 0
    assert sample(text, "qftrio_jobs_failed_total", queue="q", kind="y") == 1
    assert sample(text, "qftrio_jobs_dead_lettered_total", queue="q", kind="y") == 1
    assert sample(text, "qftrio_stale_token_rejections_total", queue="q", kind="y") == 1
    assert sample(text, "qftrio_lease_wait_seconds_sum", queue="q", kind="x") == pytest.approx(4, abs=0.01)
    assert sample(text, "qftrio_job_run_seconds_sum", queue="q", kind="x") == pytest.approx(2, abs=0.01)
    assert sample(text, "qftrio_job_run_seconds_count", queue="q") == 2
    # the gauges come from the store: every server on it shows the same
    await engine.enqueue("t1", [EnqueueRequest(kind="x", payload={}, config=JobConfig(queue="q"))])
    now[0] += 7
    for text in [(await e.metrics_exposition()).decode() for e in (engine, other)]:
        assert sample(text, "qftrio_queue_jobs", tenant="t1", queue="q", status="completed") == 1
        assert sample(text, "qftrio_queue_jobs", tenant="t1", queue="q", status="failed") == 1
        assert sample(text, "qftrio_queue_jobs", tenant="t1", queue="q", status="pending") == 1
        assert sample(text, "qftrio_queue_oldest_ready_age_seconds", tenant="t1", queue="q") == pytest.approx(7, abs=0.01)
    assert sample((await other.metrics_exposition()).decode(), "qftrio_jobs_completed_total") == 0


def test_metrics_children_are_looked_up_once() -> None:
    from qftrio.server.metrics import Metrics

    metrics = Metrics()
    child = metrics.of(metrics.completed, "q", "k")
    assert child is metrics.of(metrics.completed, "q", "k") is metrics.completed.labels("q", "k")
    assert metrics.of(metrics.failed, "q", "k") is not child
    child.inc(3)
    assert metrics.registry.get_sample_value("qftrio_jobs_completed_total", {"queue": "q", "kind": "k"}) == 3


@pytest.fixture
async def inline_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    # Inline SQLite calls: a worker thread would let the autojump clock run ahead.
    store = SqliteStore(str(tmp_path / "qftrio.db"), threaded=False)
    try:
        yield store
    finally:
        await store.aclose()


async def test_a_long_poll_on_a_paused_queue_waits(inline_store: SqliteStore, autojump_clock: trio.abc.Clock) -> None:
    engine = Engine(inline_store, clock=lambda: T0 + trio.current_time(), safety_poll_secs=1)
    await engine.enqueue("t1", [EnqueueRequest(kind="x", payload={}, config=JobConfig(queue="q"))])
    await engine.queue_pause("t1", "q")
    started = trio.current_time()
    assert await engine.lease("q", wait_secs=5) == []
    assert trio.current_time() - started >= 5
    got: list[Any] = []

    async def poll() -> None:
        got.extend(await engine.lease("q", wait_secs=30))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.sleep(3)
        await engine.enqueue("t1", [EnqueueRequest(kind="y", payload={}, config=JobConfig(queue="q"))])  # still paused: the poll waits
        await trio.sleep(3)
        assert got == []
        stats = await engine.queue_resume("t1", "q")
        assert not stats.paused
    assert len(got) == 1 and trio.current_time() - started < 5 + 6 + 1


@pytest.mark.skipif(pg_url() is None, reason="QFTRIO_TEST_DATABASE_URL is not set")
async def test_a_pause_holds_on_every_server(storage: Store) -> None:
    if isinstance(storage, SqliteStore):
        pytest.skip("one server per SQLite file")
    from qftrio.server.store.postgres import open_postgres_store

    async with open_postgres_store(pg_url() or "", timeout=None) as second:
        one, two = Engine(storage, clock=lambda: T0), Engine(second, clock=lambda: T0)
        await one.enqueue("t1", [EnqueueRequest(kind="x", payload={}, config=JobConfig(queue="q")) for _ in range(3)])
        assert (await two.queue_pause("t1", "q")).paused
        assert await one.lease("q", max_jobs=5) == [] and await two.lease("q", max_jobs=5) == []
        assert (await one.queues_stats("t1", "q"))[0].paused
        await one.queue_resume("t1", "q")
        assert len(await two.lease("q", max_jobs=5)) == 3
