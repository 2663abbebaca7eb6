"""What only the PostgreSQL store has to prove: index use, many servers on one
database, LISTEN/NOTIFY that survives a lost connection, concurrent
migrations, and a database restart under an open store.

The behaviour every store shares is in ``test_store.py``. These tests talk to
a real PostgreSQL (``QFTRIO_TEST_DATABASE_URL``; ``scripts/test`` provides
one) on Trio's real clock, each bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import socket
import tempfile
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg.errors
import pytest
import trio

from qftrio import errors
from qftrio.models import EnqueueRequest, JobConfig, Status
from qftrio.server.engine import Engine, RetryPolicy
from qftrio.server.store.base import CompleteItem, FailItem, HeartbeatItem, NewJob, NewStep, NewWorkflow, Outcome
from qftrio.server.store import sql as statements
from qftrio.server.store.pgtrio import Record
from qftrio.server.store.postgres import (
    FUNCTIONS_DIGEST,
    ALL_QUEUES,
    Q,
    PostgresStore,
    migrate,
    open_postgres_store,
)

from .pg import connection, open_test_postgres_store, pg_url
from .test_engine_handoff import LateClaim

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(pg_url() is None, reason="QFTRIO_TEST_DATABASE_URL is not set"),
]

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_800_000_000.0


async def sql(url: str, query: str, *args: Any) -> list[Record]:
    """Run one statement on a connection of its own."""
    async with connection(url) as conn:
        return await conn.fetch(query, *args)


def other_store(**options: Any) -> contextlib.AbstractAsyncContextManager[PostgresStore]:
    """Another server's store on the test database (not emptied)."""
    url = pg_url()
    assert url is not None
    options.setdefault("timeout", None)
    return open_postgres_store(url, migrate=False, **options)


def new(queue: str = "q", **kw: Any) -> NewJob:
    return NewJob(tenant="t", queue=queue, kind="k", payload={}, scheduled_at=T0, **kw)


def with_payload(payload: dict[str, Any]) -> NewJob:
    return NewJob(tenant="t", queue="q", kind="k", payload=payload, scheduled_at=T0)


# -- enqueue ------------------------------------------------------------------------


async def test_concurrent_enqueues_share_transactions() -> None:
    # Twenty concurrent enqueues share inserts: a few commits (at most two
    # batches go out at once, the calls made meanwhile join the next), not
    # twenty.
    async with open_test_postgres_store() as store:
        url = pg_url()
        assert url is not None
        engine = Engine(store)
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(engine.enqueue, "t", [EnqueueRequest(kind="k", payload={"i": i})])
        rows = await sql(url, "SELECT count(*) AS jobs, count(DISTINCT xmin::text) AS commits FROM qftrio_jobs")
        assert rows[0]["jobs"] == 20 and rows[0]["commits"] <= 3
        (stats,) = await engine.queues_stats("t", "default")
        assert stats.counts["pending"] == 20


# -- the claim query stays on its indexes ------------------------------------------


async def test_claim_uses_the_partial_indexes() -> None:
    async with open_test_postgres_store() as store:
        url = pg_url()
        assert url is not None
        # A table that looks like months of traffic: mostly finished jobs, a
        # backlog spread over queues, some leases.
        await sql(
            url,
            """INSERT INTO qftrio_jobs (id, tenant, queue, kind, status, attempt, max_attempts,
                scheduled_at, created_at, updated_at, locked_until, lease_token)
            SELECT gen_random_uuid(), 't', 'q' || (g % 20), 'k',
                CASE (g / 20) % 50 WHEN 0 THEN 'pending' WHEN 1 THEN 'running' ELSE 'completed' END,
                1, 5, $1 - g, $1 - g, $1 - g,
                CASE WHEN (g / 20) % 50 = 1 THEN $1 + 60 - g % 120 END,
                CASE WHEN (g / 20) % 50 = 1 THEN gen_random_uuid() END
            FROM generate_series(1, 60000) AS g""",
            T0,
        )
        await sql(url, "ANALYZE qftrio_jobs")
        text = "\n".join(
            r[0] for r in await sql(url, "EXPLAIN " + Q["claim"], "q7", T0, 10, 30.0, "w", "lease expired", 0)
        )
        assert "Seq Scan on qftrio_jobs" not in text, text
        assert "qftrio_jobs_claim_idx" in text and "qftrio_jobs_running_idx" in text, text
        # each tenant's share walks the index in lease order, no sort of the backlog
        ready = text.split("CTE ready\n")[1].split("CTE expired")[0]
        assert "Index Scan using qftrio_jobs_claim_idx" in ready and "Sort" not in ready, text
        # the generic plan too (a prepared claim's, after five runs) finds the chosen rows by key
        for plan in await plans(url, Q["claim"], "q7", T0, 10, 30.0, "w", "lease expired", 0):
            assert "Seq Scan on qftrio_jobs " not in plan + " ", plan
        plan = "\n".join(r[0] for r in await sql(url, "EXPLAIN " + Q["next_available"], "q7", T0))
        # (by either index that keys on the queue and the time: which one the
        # planner takes depends on the statistics ANALYZE happened to sample)
        assert "Seq Scan on qftrio_jobs" not in plan, plan
        assert "qftrio_jobs_scheduled_idx" in plan or "Index Only Scan using qftrio_jobs_claim_idx" in plan, plan
        # every queue's stats read the running jobs' keys once, not once per queue
        plan = "\n".join(r[0] for r in await sql(url, "EXPLAIN " + Q["queues_stats"].format(where=""), T0))
        assert "CTE held_keys" in plan, plan
        leases = await store.jobs_claim("q7", limit=10, lease_secs=30, worker_id="w", now=T0)
        assert len(leases) == 10


async def test_each_tenants_walk_starts_at_its_own_jobs() -> None:
    # 20 tenants of 2,000 jobs each in one queue: a lease of 20 takes one job
    # of each, and each tenant's walk must start in the claim index at that
    # tenant's jobs, not at the queue's first (which read every tenant
    # before it: the last one's walk 38,000 entries long), custom plan or
    # generic.
    async with open_test_postgres_store():
        url = pg_url()
        assert url is not None
        await sql(
            url,
            """INSERT INTO qftrio_jobs (id, tenant, queue, kind, status, attempt, max_attempts,
                scheduled_at, created_at, updated_at)
            SELECT gen_random_uuid(), 't' || lpad((g % 20)::text, 2, '0'), 'q', 'k', 'pending', 0, 5,
                $1::float8, $1::float8 + g * 1e-3, $1::float8
            FROM generate_series(1, 40000) AS g""",
            T0,
        )
        await sql(url, "VACUUM ANALYZE qftrio_jobs")
        args = ("q", T0 + 1, 20, 30.0, "w", "lease expired", 0)

        async def ready_buffers(conn: Any, explain: str) -> int:
            # EXPLAIN ANALYZE runs the claim: rolled back, it takes nothing
            await conn.execute("BEGIN")
            text = "\n".join(r[0] for r in await conn.fetch(explain, *args))
            await conn.execute("ROLLBACK")
            ready = text.split("CTE ready\n")[1].split("CTE expired")[0]
            return int(ready.split("shared hit=")[1].split()[0])

        # About a root, an inner and a leaf page of the index and a heap page
        # per tenant; a walk from the queue's first job read about 2,000 pages.
        async with connection(url) as conn:
            custom = await ready_buffers(conn, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + Q["claim"])
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            generic = await ready_buffers(conn, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + Q["claim"])
        buffers = [custom, generic]
        # 186 on a quiet cluster; sessions of other databases on it (the
        # suite's parallel processes) add about a page per tenant (206 seen)
        assert max(buffers) < 400, buffers


async def test_claim_stays_on_its_index_before_the_table_is_analyzed() -> None:
    # A new table and a burst of enqueues, before autovacuum's first ANALYZE:
    # the claim must not sort the whole backlog.
    async with open_test_postgres_store() as store:
        url = pg_url()
        assert url is not None
        # What a never-analyzed table looks like to the planner (the test
        # database's table keeps earlier tests' statistics through TRUNCATE).
        try:
            await sql(url, "DELETE FROM pg_statistic WHERE starelid = 'qftrio_jobs'::regclass")
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("needs a superuser connection to clear the table's statistics")
        await sql(url, "UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid = 'qftrio_jobs'::regclass")
        await sql(
            url,
            """INSERT INTO qftrio_jobs (id, tenant, queue, kind, status, attempt, max_attempts,
                scheduled_at, created_at, updated_at)
            SELECT gen_random_uuid(), 't', 'q', 'k', 'pending', 0, 5, $1::float8, $1::float8 + g * 1e-3, $1::float8
            FROM generate_series(1, 30000) AS g""",
            T0,
        )
        # Half of them claimed since: their entries in the claim index are
        # dead but not vacuumed yet.
        await sql(
            url,
            """UPDATE qftrio_jobs SET status = 'running', attempt = 1, locked_until = $1::float8 + 600
            WHERE id IN (SELECT id FROM qftrio_jobs ORDER BY created_at LIMIT 15000)""",
            T0,
        )
        await sql(url, "DELETE FROM pg_statistic WHERE starelid = 'qftrio_jobs'::regclass")
        await sql(url, "UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid = 'qftrio_jobs'::regclass")
        (plan,) = await sql(url, "EXPLAIN (FORMAT JSON) " + Q["claim"], "q", T0 + 1, 1, 30.0, "w", "lease expired", 0)
        text = str(plan[0])
        assert "qftrio_jobs_claim_idx" in text and "qftrio_jobs_scheduled_idx" not in text, text
        # Jobs scheduled ahead are still found for a long-poll's wait.
        await store.jobs_insert([NewJob(tenant="t", queue="q", kind="k", payload={}, scheduled_at=T0 + 90)], now=T0)
        assert await store.queue_next_available_at("q", now=T0 + 1) == T0 + 90


def literal(value: Any) -> str:
    """*value* (a number, or a list of what prints as an array element) in SQL."""
    if isinstance(value, list):
        return "'{" + ",".join(f'"{v}"' for v in value) + "}'"
    return repr(value)


async def plans(url: str, statement: str, *args: Any) -> list[str]:
    """The custom and the generic plan of *statement* with *args*."""

    async with connection(url) as conn:
        custom = await conn.fetch("EXPLAIN " + statement, *args)
        await conn.execute("PREPARE s AS " + statement)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        generic = await conn.fetch(f"EXPLAIN EXECUTE s({', '.join(literal(a) for a in args)})")
        return ["\n".join(r[0] for r in custom), "\n".join(r[0] for r in generic)]


async def test_reports_probe_their_own_rows_whatever_the_planner_estimates() -> None:
    # Thousands of running jobs the statistics do not know of (analyzed while
    # they were pending): a report of a batch must find its rows by their
    # keys, not join every running job (which it did through their index),
    # nor read every workflow step's job to find the batch's workflows.
    with trio.fail_after(30):
        async with open_test_postgres_store() as store:
            url = pg_url()
            assert url is not None
            await sql(
                url,
                """INSERT INTO qftrio_jobs (id, tenant, queue, kind, status, attempt, max_attempts,
                    scheduled_at, created_at, updated_at)
                SELECT gen_random_uuid(), 't', 'q', 'k', 'pending', 0, 5, $1::float8, $1::float8, $1::float8
                FROM generate_series(1, 20000) AS g""",
                T0,
            )
            await sql(url, "ANALYZE qftrio_jobs")
            leases = []
            for _ in range(30):
                leases += await store.jobs_claim("q", limit=100, lease_secs=60, worker_id="w", now=T0)
            batch = leases[:100]
            ids = [uuid.UUID(x.job.id) for x in batch]
            tokens = [uuid.UUID(x.lease_token) for x in batch]
            statements = {
                "complete": (Q["complete"], ids, tokens, ["{}"] * 100, T0),
                "complete_lock": (Q["complete_lock"], ids, tokens, T0),
                "complete_write": (Q["complete_write"], ids, ["{}"] * 100, list(range(1, 101)), T0),
                "heartbeat": (Q["heartbeat"], ids, tokens, [60.0] * 100, T0),
                "heartbeat_lock": (Q["heartbeat_lock"], ids, tokens, T0),
                "heartbeat_write": (Q["heartbeat_write"], ids, [T0 + 60] * 100, T0),
                "fail": (Q["fail"], ids, tokens, ["pending"] * 100, [T0 + 9] * 100, ["e"] * 100, T0),
                # the batch's workflows, before its fail or locked complete
                "lock_workflows_of_jobs": (Q["lock_workflows_of_jobs"], ids),
            }
            for name, (statement, *args) in statements.items():
                for plan in await plans(url, statement, *args):
                    assert "qftrio_jobs_running_idx" not in plan, (name, plan)
                    assert "qftrio_jobs_workflow_step_idx" not in plan, (name, plan)
                    assert "qftrio_jobs_pkey" in plan and "Seq Scan on qftrio_jobs" not in plan, (name, plan)
            # and they still do what they say
            results = await store.jobs_complete([CompleteItem(x.job.id, x.lease_token, {}) for x in batch], now=T0)
            assert all(r.applied for r in results)


# -- NOTIFY reaches parked long-polls, even after the LISTEN connection died --------


async def wait_for_new_listener(store: PostgresStore, old_pid: int | None) -> int:
    with trio.fail_after(10):
        while store.listener_pid is None or store.listener_pid == old_pid:
            await trio.sleep(0.01)
    assert store.listener_pid is not None
    return store.listener_pid


async def test_long_poll_wakes_after_the_listener_backend_is_killed() -> None:
    url = pg_url()
    assert url is not None
    with trio.fail_after(30):
        async with open_test_postgres_store() as store_a, other_store() as store_b:
            # Server A's safety poll is out of reach: only NOTIFY can wake it.
            server_a = Engine(store_a, safety_poll_secs=120)
            server_b = Engine(store_b)
            woke: dict[str, Any] = {}
            async with trio.open_nursery() as nursery:
                await nursery.start(server_a.run_listener)
                first_pid = store_a.listener_pid

                async def long_poll() -> None:
                    woke["leases"] = await server_a.lease("q", wait_secs=30)
                    woke["at"] = trio.current_time()

                nursery.start_soon(long_poll)
                await trio.sleep(0.3)  # parked by now
                (killed,) = await sql(url, "SELECT pg_terminate_backend($1)", first_pid)
                assert killed[0] is True
                await wait_for_new_listener(store_a, first_pid)
                assert "leases" not in woke
                enqueued_at = trio.current_time()
                (inserted,) = await server_b.enqueue("t", [EnqueueRequest(kind="k", payload={}, config=JobConfig(queue="q"))])
                with trio.fail_after(5):
                    while "leases" not in woke:
                        await trio.sleep(0.01)
                assert [lease.job.id for lease in woke["leases"]] == [inserted.job.id]
                assert woke["at"] - enqueued_at < 1.0
                nursery.cancel_scope.cancel()


async def test_listener_signals_all_queues_after_reconnecting() -> None:
    url = pg_url()
    assert url is not None
    calls: list[str] = []
    with trio.fail_after(30):
        async with open_test_postgres_store() as store, other_store() as other:
            async with trio.open_nursery() as nursery:
                await nursery.start(store.run_listener, calls.append)
                await store.notifications_wanted(60)
                assert calls == [ALL_QUEUES]  # it began to listen: every queue looks again
                calls.clear()
                await other.jobs_insert([new("a"), new("b")], now=T0)
                with trio.fail_after(5):
                    while sorted(calls) != ["a", "b"]:
                        await trio.sleep(0.01)
                assert ALL_QUEUES not in calls
                old = store.listener_pid
                await sql(url, "SELECT pg_terminate_backend($1)", old)
                await wait_for_new_listener(store, old)
                assert calls[-1] == ALL_QUEUES
                # fail-with-retry, retry and reap notify too
                (job_id,) = [i.job.id for i in await other.jobs_insert([new("c", max_attempts=3)], now=T0)]
                (lease,) = await other.jobs_claim("c", limit=1, lease_secs=10, worker_id="w", now=T0)
                calls.clear()
                await other.jobs_fail([FailItem(job_id, lease.lease_token, "x")], now=T0, retry_at=lambda *a: T0 + 1)
                (lease,) = await other.jobs_claim("c", limit=1, lease_secs=10, worker_id="w", now=T0 + 1)
                await other.jobs_reap_expired(now=T0 + 20)
                with trio.fail_after(5):
                    while calls != ["c", "c"]:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()


async def test_the_listener_passes_on_only_other_servers_notifications() -> None:
    # what a store changes itself, its engine has woken already
    calls: list[str] = []
    with trio.fail_after(30):
        async with open_test_postgres_store() as store, other_store() as other:
            async with trio.open_nursery() as nursery:
                await nursery.start(store.run_listener, calls.append)
                await store.notifications_wanted(60)
                calls.remove(ALL_QUEUES)  # it began to listen
                await store.jobs_insert([new("own")], now=T0)
                await other.jobs_insert([new("other")], now=T0)
                with trio.fail_after(5):
                    while not calls:
                        await trio.sleep(0.01)
                await store.jobs_insert([new("own")], now=T0)
                await other.jobs_insert([new("later")], now=T0)
                with trio.fail_after(5):
                    while calls[-1:] != ["later"]:
                        await trio.sleep(0.01)
                assert calls == ["other", "later"]
                nursery.cancel_scope.cancel()


async def test_the_listener_listens_only_while_a_long_poll_may_wait() -> None:
    # Notifications cost the database a wake-up of each listening backend:
    # a server no poll waits on does not listen.
    calls: list[str] = []
    with trio.fail_after(30):
        async with open_test_postgres_store(listen_idle_secs=1.0) as store, other_store() as other:
            async with trio.open_nursery() as nursery:
                await nursery.start(store.run_listener, calls.append)
                await other.jobs_insert([new("before")], now=T0)
                # listening from when it returns: the next insert is heard
                await store.notifications_wanted(1.0)
                await other.jobs_insert([new("wanted")], now=T0)
                with trio.fail_after(5):
                    while calls[-1:] != ["wanted"]:
                        await trio.sleep(0.01)
                assert calls == [ALL_QUEUES, "wanted"]
                # and still while the announced wait lasts
                await trio.sleep(0.6)
                await other.jobs_insert([new("waiting")], now=T0)
                with trio.fail_after(5):
                    while calls[-1:] != ["waiting"]:
                        await trio.sleep(0.01)
                # not once the wait and listen_idle_secs have passed (margins of
                # over a second each way, for a busy machine)
                await trio.sleep(2.9)
                await other.jobs_insert([new("idle")], now=T0)
                # wanted again, by a wait that has it listen before it returns
                # (with none, the next insert may commit before the LISTEN)
                await store.notifications_wanted(0.5)
                await other.jobs_insert([new("again")], now=T0)
                with trio.fail_after(5):
                    while calls[-1:] != ["again"]:
                        await trio.sleep(0.01)
                assert calls == [ALL_QUEUES, "wanted", "waiting", ALL_QUEUES, "again"]
                nursery.cancel_scope.cancel()


async def test_a_long_poll_on_a_server_that_was_not_listening_hears_another_servers_enqueue() -> None:
    with trio.fail_after(30):
        async with open_test_postgres_store() as store_a, other_store() as store_b:
            # Server A's safety poll is out of reach: only NOTIFY can wake it.
            server_a = Engine(store_a, safety_poll_secs=120)
            server_b = Engine(store_b)
            woke: list[Any] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(server_a.run_listener)
                assert store_a.listener_pid is not None  # connected, not listening

                async def long_poll() -> None:
                    woke.extend(await server_a.lease("q", wait_secs=30))

                nursery.start_soon(long_poll)
                await trio.sleep(0.3)  # parked by now
                (inserted,) = await server_b.enqueue("t", [EnqueueRequest(kind="k", payload={}, config=JobConfig(queue="q"))])
                with trio.fail_after(2):
                    while not woke:
                        await trio.sleep(0.01)
                assert [lease.job.id for lease in woke] == [inserted.job.id]
                nursery.cancel_scope.cancel()



async def test_a_long_poll_hears_work_made_ready_between_its_claim_and_the_listen() -> None:
    # Server A did not listen: its poll claims (nothing), and only then has
    # the connection listen. What server B enqueued in between was notified
    # to no one; A's polls claim again once it listens.
    with trio.fail_after(30):
        async with open_test_postgres_store() as store_a, other_store() as store_b:
            late = LateClaim(store_a)
            # Server A's safety poll is out of reach.
            server_a = Engine(late, safety_poll_secs=120)  # type: ignore[arg-type]
            server_b = Engine(store_b)
            woke: list[Any] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(server_a.run_listener)

                async def long_poll() -> None:
                    woke.extend(await server_a.lease("q", wait_secs=30))

                nursery.start_soon(long_poll)
                await late.read.wait()  # its claim has read the queue
                (inserted,) = await server_b.enqueue("t", [EnqueueRequest(kind="k", payload={}, config=JobConfig(queue="q"))])
                late.answer.set()
                with trio.fail_after(5):
                    while not woke:
                        await trio.sleep(0.01)
                assert [lease.job.id for lease in woke] == [inserted.job.id]
                nursery.cancel_scope.cancel()


# -- several servers on one database --------------------------------------------------


async def test_jobs_a_hand_off_leaves_wake_the_other_servers() -> None:
    with trio.fail_after(30):
        async with open_test_postgres_store() as store_a, other_store() as store_b:
            # Safety polls out of reach: only the hand-off and NOTIFY deliver.
            server_a = Engine(store_a, safety_poll_secs=120)
            server_b = Engine(store_b, safety_poll_secs=120)
            got: dict[str, list[Any]] = {}
            async with trio.open_nursery() as nursery:
                await nursery.start(server_a.run_listener)
                await nursery.start(server_b.run_listener)

                async def long_poll(name: str, engine: Engine) -> None:
                    got[name] = await engine.lease("q", max_jobs=1, wait_secs=30)

                nursery.start_soon(long_poll, "a", server_a)
                nursery.start_soon(long_poll, "b", server_b)
                await trio.sleep(0.3)  # both parked
                inserted = await server_a.enqueue("t", [EnqueueRequest(kind="k", payload={}, config=JobConfig(queue="q"))] * 2)
                with trio.fail_after(5):
                    while len(got) < 2:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
            leased = sorted(lease.job.id for leases in got.values() for lease in leases)
            assert leased == sorted(i.job.id for i in inserted)
            assert len(got["a"]) == len(got["b"]) == 1


async def test_many_servers_never_share_a_job() -> None:
    n_jobs, n_servers, n_workers = 300, 3, 6
    with trio.fail_after(45):
        async with contextlib.AsyncExitStack() as stack:
            stores = [await stack.enter_async_context(open_test_postgres_store(pool_size=4))]
            for _ in range(n_servers - 1):
                stores.append(await stack.enter_async_context(other_store(pool_size=4)))
            instant_retry = RetryPolicy(base_secs=0.0, cap_secs=0.0, jitter=0.0)
            engines = [Engine(s, policy=instant_retry, safety_poll_secs=0.5) for s in stores]
            specs = [EnqueueRequest(kind="k", payload={"i": i}, config=JobConfig(queue="q", max_attempts=20)) for i in range(n_jobs)]
            ids = {i.job.id for i in await engines[0].enqueue("t", specs)}
            live: dict[str, str] = {}  # job id -> token of the lease that holds it
            overlaps: list[str] = []
            completions: collections.Counter[str] = collections.Counter()
            failures = 0

            async def worker(engine: Engine, name: str) -> None:
                nonlocal failures
                rnd = random.Random(name)
                while len(completions) < n_jobs:
                    leases = await engine.lease(
                        "q", max_jobs=rnd.randint(1, 5), lease_secs=60, wait_secs=0.2, worker_id=name
                    )
                    for lease in leases:
                        if lease.job.id in live:
                            overlaps.append(lease.job.id)
                        live[lease.job.id] = lease.lease_token
                    if not leases:
                        continue
                    await trio.sleep(rnd.random() / 100)
                    beats = await engine.heartbeat([HeartbeatItem(x.job.id, x.lease_token, 60) for x in leases])
                    assert all(b.outcome is Outcome.OK and b.status is Status.RUNNING for b in beats)
                    failing = [x for x in leases if rnd.random() < 0.2]
                    done = [x for x in leases if x not in failing]
                    # Given up before reporting: once the report commits,
                    # another worker may rightly claim the job.
                    for x in leases:
                        del live[x.job.id]
                    if failing:
                        results = await engine.fail([FailItem(x.job.id, x.lease_token, "flaky") for x in failing])
                        assert all(r.applied and r.status is Status.PENDING for r in results)
                        failures += len(failing)
                    if done:
                        results = await engine.complete([CompleteItem(x.job.id, x.lease_token, {}) for x in done])
                        assert all(r.applied for r in results)
                        completions.update(x.job.id for x in done)

            async with trio.open_nursery() as nursery:
                for engine in engines:
                    nursery.start_soon(engine.run_listener)
                    nursery.start_soon(lambda e=engine: e.run_janitor(interval_secs=0.05))
                async with trio.open_nursery() as workers:
                    for s, engine in enumerate(engines):
                        for w in range(n_workers):
                            workers.start_soon(worker, engine, f"s{s}w{w}")
                nursery.cancel_scope.cancel()

            assert overlaps == []
            assert set(completions) == ids and set(completions.values()) == {1}
            assert failures > 0
            (stats,) = await stores[0].queues_stats(tenant="t", now=T0, queue="q")
            assert stats.counts["completed"] == n_jobs


async def test_janitors_of_many_servers_do_not_collide() -> None:
    with trio.fail_after(20):
        async with open_test_postgres_store() as first, other_store() as second, other_store() as third:
            await first.jobs_insert([new(max_attempts=1 + i % 2) for i in range(200)], now=T0)
            assert len(await first.jobs_claim("q", limit=200, lease_secs=10, worker_id="w", now=T0)) == 200
            reaped: list[Any] = []

            async def reap(store: PostgresStore) -> None:
                while batch := await store.jobs_reap_expired(now=T0 + 11, limit=7):
                    reaped.extend(batch)

            async with trio.open_nursery() as nursery:
                for store in (first, second, third):
                    nursery.start_soon(reap, store)
            assert len(reaped) == 200 and len({r.job_id for r in reaped}) == 200
            assert collections.Counter(r.status for r in reaped) == {Status.PENDING: 100, Status.FAILED: 100}


async def test_prune_goes_in_bounded_batches() -> None:
    async with open_test_postgres_store() as store:
        jobs = await store.jobs_insert([new() for _ in range(25)], now=T0)
        leases = await store.jobs_claim("q", limit=25, lease_secs=10, worker_id="w", now=T0)
        await store.jobs_complete([CompleteItem(x.job.id, x.lease_token, {}) for x in leases], now=T0)
        assert [await store.jobs_prune(before=T0 + 1, limit=10) for _ in range(4)] == [10, 10, 5, 0]
        assert all([await store.job_get(i.job.id) is None for i in jobs])


async def test_cancelled_calls_leave_the_pool_usable() -> None:
    # A client that disconnects cancels its request mid-query. The
    # connection is closed (the server rolls back what had not committed),
    # the call raises Cancelled; the pool stays usable, and a claim that
    # committed simply holds its jobs until the lease ends.
    with trio.fail_after(20):
        async with open_test_postgres_store(pool_size=2) as store:
            await store.jobs_insert([new() for _ in range(1500)], now=T0)
            claimed = cancelled = 0
            for i in range(200):
                with trio.move_on_after(0.0005 * (i % 8)) as scope:
                    claimed += len(await store.jobs_claim("q", limit=5, lease_secs=60, worker_id="w", now=T0))
                cancelled += scope.cancelled_caught
            assert 0 < cancelled < 200
            await store.ping()
            (stats,) = await store.queues_stats(tenant="t", now=T0, queue="q")
            assert stats.counts["running"] >= claimed
            assert stats.counts["running"] + stats.counts["pending"] == 1500


# -- values PostgreSQL cannot store are the caller's error, not a 500 --------------


async def test_unstorable_values_are_invalid_input() -> None:
    async with open_test_postgres_store() as store:
        with pytest.raises(errors.InvalidInput):
            await store.jobs_insert([with_payload({"s": "a\x00b"})], now=T0)
        with pytest.raises(errors.InvalidInput):
            await store.jobs_insert([with_payload({"x": float("nan")})], now=T0)
        assert await store.jobs_list(tenant="t") == []
        (ins,) = await store.jobs_insert([new()], now=T0)
        (lease,) = await store.jobs_claim("q", limit=1, lease_secs=10, worker_id="w", now=T0)
        item = FailItem(ins.job.id, lease.lease_token, "nul\x00byte")
        (res,) = await store.jobs_fail([item], now=T0, retry_at=lambda *a: None)
        assert res.applied
        assert (await store.job_get(ins.job.id)).error == "nul\ufffdbyte"


# -- migrations ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def scratch_database() -> AsyncIterator[str]:
    url = pg_url()
    assert url is not None
    name = f"qftrio_scratch_{uuid.uuid4().hex[:12]}"
    await sql(url, f"CREATE DATABASE {name}")
    try:
        yield urllib.parse.urlsplit(url)._replace(path=f"/{name}").geturl()
    finally:
        with trio.CancelScope(shield=True):
            await sql(url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_concurrent_migrations_apply_once() -> None:
    with trio.fail_after(30):
        async with scratch_database() as url:
            with pytest.raises(errors.ConfigError, match="qftrio migrate"):
                async with open_postgres_store(url, migrate=False, timeout=None):
                    pass
            results: list[list[str]] = []

            async def run() -> None:
                results.append(await migrate(url, timeout=None))

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(run)
            numbered = statements.migrations("postgres")
            assert sorted(results) == [[], [], [name for _, name, _ in numbered] + ["functions"]]
            rows = await sql(url, "SELECT version, name FROM qftrio_schema_migrations")
            versions = sorted((r["version"], r["name"]) for r in rows)
            assert versions == [(version, name) for version, name, _ in numbered] + [("functions", FUNCTIONS_DIGEST)]
            assert await migrate(url, timeout=None) == []
            async with open_postgres_store(url, migrate=False, timeout=None) as store:
                await store.ping()


async def test_migration_0005_keeps_every_listing_and_count() -> None:
    # A database at 0004 holding jobs of every status, two queues and two
    # kinds: after 0005 (the filter index without running jobs) every
    # filtered listing, page by page, and every count is as before.
    with trio.fail_after(60):
        async with scratch_database() as url:

            async def at_0004() -> list[Record]:
                async with connection(url) as conn:
                    await conn.execute(Q["migrations_table"])
                    for version, name, script in statements.migrations("postgres"):
                        if version <= "0004":
                            await conn.execute(script)
                            await conn.execute(Q["migration_record"], version, name)
                    return await conn.fetch(
                        """INSERT INTO qftrio_jobs (id, tenant, queue, kind, status, attempt, max_attempts,
                            scheduled_at, created_at, updated_at, locked_until, lease_token)
                        SELECT gen_random_uuid(), 't', 'q' || (g % 2), 'k' || (g / 2 % 2),
                            (ARRAY['pending', 'running', 'completed', 'failed', 'cancelled'])[g / 4 % 5 + 1],
                            1, 5, $1::float8, $1::float8 + g % 30, $1::float8,
                            CASE WHEN g / 4 % 5 = 1 THEN $1::float8 + 60 END,
                            CASE WHEN g / 4 % 5 = 1 THEN gen_random_uuid() END
                        FROM generate_series(0, 119) AS g
                        RETURNING id, queue, kind, status, created_at""",
                        T0,
                    )

            rows = await at_0004()
            after = [name for version, name, _ in statements.migrations("postgres") if version > "0004"] + ["functions"]
            assert await migrate(url, timeout=None) == after and after[0] == "0005_filter_without_running"
            newest_first = sorted(rows, key=lambda r: (r["created_at"], r["id"]), reverse=True)
            async with open_postgres_store(url, migrate=False, timeout=None) as store:
                for queue in (None, "q1"):
                    for status in (None, *Status):
                        for kind in (None, "k0"):
                            expected = [
                                str(r["id"])
                                for r in newest_first
                                if queue in (None, r["queue"]) and status in (None, r["status"]) and kind in (None, r["kind"])
                            ]
                            listed: list[str] = []
                            before = None
                            while True:
                                page = await store.jobs_list(
                                    tenant="t", queue=queue, status=status, kind=kind, limit=7, before=before
                                )
                                listed += [j.id for j in page]
                                if len(page) < 7:
                                    break
                                before = (page[-1].created_at.timestamp(), page[-1].id)
                            assert listed == expected, (queue, status, kind)
                for stats in await store.queues_stats(tenant="t", now=T0):
                    counted = collections.Counter(r["status"] for r in rows if r["queue"] == stats.queue)
                    assert stats.counts == {s.value: counted[s.value] for s in Status}
                # and a claim now adds nothing to the filter index
                (plan,) = await sql(url, "SELECT indexdef FROM pg_indexes WHERE indexname = 'qftrio_jobs_filter_idx'")
                assert plan["indexdef"].endswith("WHERE (status <> 'running'::text)"), plan


# -- failures of the database itself --------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_unreachable_database_is_unavailable() -> None:
    with trio.fail_after(10), pytest.raises(errors.Unavailable):
        async with open_postgres_store(f"postgresql://postgres@127.0.0.1:{free_port()}/x", timeout=5):
            pass


@pytest.fixture
async def own_cluster() -> AsyncIterator[tuple[str, str, int]]:
    """A PostgreSQL cluster of this test's own, which it may stop and start:
    ``(url, data directory, port)``."""
    script = str(ROOT / "scripts" / "pg-cluster")
    data = tempfile.mkdtemp(prefix="qftrio-pg-restart-", dir="/tmp")
    port = free_port()
    try:
        with trio.fail_after(60):
            done = await trio.run_process([script, "start", data, str(port)], capture_stdout=True)
        yield done.stdout.decode().strip(), data, port
    finally:
        with trio.move_on_after(30, shield=True):
            await trio.run_process([script, "stop", data], check=False)
        shutil.rmtree(data, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.remove(f"{data}.initdb.log")


async def test_database_restart_under_an_open_store(own_cluster: tuple[str, str, int]) -> None:
    url, data, port = own_cluster
    script = str(ROOT / "scripts" / "pg-cluster")
    calls: list[str] = []
    with trio.fail_after(45):
        async with open_postgres_store(url, timeout=5) as store:
            inserted = await store.jobs_insert([new() for _ in range(10)], now=T0)
            leases = await store.jobs_claim("q", limit=4, lease_secs=600, worker_id="w", now=T0)
            await store.jobs_complete([CompleteItem(x.job.id, x.lease_token, {"n": 1}) for x in leases[:2]], now=T0)
            async with trio.open_nursery() as nursery:
                await nursery.start(store.run_listener, calls.append)
                await store.notifications_wanted(60)
                first_pid = store.listener_pid

                await trio.run_process([script, "stop", data])
                for call in (
                    store.ping(),
                    store.job_get(inserted[0].job.id),
                    store.jobs_insert([new()], now=T0),
                    store.jobs_claim("q", limit=1, lease_secs=10, worker_id="w", now=T0),
                ):
                    with pytest.raises(errors.Unavailable):
                        await call

                await trio.run_process([script, "start", data, str(port)], capture_stdout=True)
                await store.ping()
                jobs = {j.id: j for j in await store.jobs_list(tenant="t", limit=100)}
                assert set(jobs) == {i.job.id for i in inserted}
                assert collections.Counter(j.status for j in jobs.values()) == {
                    Status.PENDING: 6,
                    Status.RUNNING: 2,
                    Status.COMPLETED: 2,
                }
                # the leases taken before the restart are still good
                items = [CompleteItem(x.job.id, x.lease_token, {}) for x in leases[2:]]
                results = await store.jobs_complete(items, now=T0)
                assert [r.applied for r in results] == [True, True]
                await wait_for_new_listener(store, first_pid)
                assert ALL_QUEUES in calls
                nursery.cancel_scope.cancel()


# -- one transaction per batch ----------------------------------------------------------


async def test_a_complete_batch_with_a_workflow_step_commits_as_one() -> None:
    url = pg_url()
    assert url is not None
    with trio.fail_after(30):
        async with open_test_postgres_store() as store, connection(url) as holder:
            step = NewStep(name="s", kind="k", payload={})
            wf = await store.workflow_create(NewWorkflow(tenant="t", name="w", context={}, steps=(step,)), now=T0)
            (plain_id,) = [i.job.id for i in await store.jobs_insert([new("default")], now=T0)]
            leases = await store.jobs_claim("default", limit=2, lease_secs=60, worker_id="w", now=T0)
            assert len(leases) == 2
            # another transaction holds the step's workflow, so the batch
            # waits for it halfway
            hold = holder.transaction()
            await hold.start()
            await holder.execute("SELECT 1 FROM qftrio_workflows WHERE id = $1 FOR UPDATE", uuid.UUID(wf.id))
            results = []

            async def complete() -> None:
                items = [CompleteItem(lease.job.id, lease.lease_token, {}) for lease in leases]
                results.extend(await store.jobs_complete(items, now=T0 + 1))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(complete)
                try:
                    while not await sql(url, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"):
                        await trio.sleep(0.01)
                    # nothing of the batch is visible while it waits
                    (row,) = await sql(url, "SELECT status FROM qftrio_jobs WHERE id = $1", uuid.UUID(plain_id))
                    assert row["status"] == "running"
                finally:
                    await hold.rollback()
            assert [(r.outcome, r.applied) for r in results] == [(Outcome.OK, True)] * 2
            assert (await store.job_get(plain_id)).status is Status.COMPLETED
            assert (await store.workflow_get(wf.id)).status.value == "completed"
