"""Workers seen when idle: a lease call's worker id and queue are kept (at
most one write per worker and queue every few seconds, in a bounded cache),
and the workers list shows every worker seen in the last few minutes on a
queue holding the tenant's jobs, with what it holds. On both stores, and over
real HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from qftrio.models import EnqueueRequest, JobConfig
from qftrio.models import to_datetime as when
from qftrio.server.engine import Engine, Sightings
from qftrio.server.store.base import NewJob, Store
from qftrio.server.store.sqlite import open_sqlite_store

from .conftest import EPOCH, RunningServer
from .test_operations_api import enqueue
from .test_protocol import lease, report

T0 = 1_800_000_000.0


def job(queue: str, tenant: str = "t1") -> NewJob:
    return NewJob(tenant=tenant, queue=queue, kind="k", payload={}, scheduled_at=T0, max_attempts=2)


def seen(workers: list, worker_id: str) -> tuple[int, tuple[str, ...], float] | None:
    for w in workers:
        if w.worker_id == worker_id:
            return w.jobs, w.queues, w.last_seen_at
    return None


# -- the store, on both backends ----------------------------------------------


async def test_a_sighting_shows_to_the_tenants_whose_jobs_its_queue_holds(storage: Store) -> None:
    await storage.jobs_insert([job("mine"), job("theirs", tenant="t2"), job("shared"), job("shared", tenant="t2")], now=T0)
    await storage.queue_set_paused(tenant="t1", queue="paused-empty", paused=True, now=T0)
    sightings = [("w-mine", "mine"), ("w-theirs", "theirs"), ("w-shared", "shared"), ("w-paused", "paused-empty"), ("w-none", "nobody")]
    await storage.workers_seen(sightings, now=T0 + 10)
    t1 = await storage.workers(tenant="t1", seen_since=T0)
    assert sorted(w.worker_id for w in t1) == ["w-mine", "w-paused", "w-shared"]
    assert all(w.jobs == 0 and w.job_ids == () and w.last_seen_at == when(T0 + 10) for w in t1)
    assert sorted(w.worker_id for w in await storage.workers(tenant="t2", seen_since=T0)) == ["w-shared", "w-theirs"]
    # only sightings at or after seen_since
    assert await storage.workers(tenant="t1", seen_since=T0 + 11) == []


async def test_a_worker_holding_jobs_shows_their_ids_and_its_latest_sighting(storage: Store) -> None:
    await storage.jobs_insert([job("a"), job("a"), job("a", tenant="t2")], now=T0)
    leases = await storage.jobs_claim("a", limit=3, lease_secs=60, worker_id="w1", now=T0 + 1)
    await storage.workers_seen([("w1", "a"), ("w1", "b")], now=T0 + 5)
    await storage.workers_seen([("w1", "a")], now=T0 + 3)  # an older write never moves it back
    (w1,) = await storage.workers(tenant="t1", seen_since=T0)
    mine = sorted(lease.job.id for lease in leases if lease.job.tenant == "t1")
    # its queue b holds none of t1's jobs: not shown; t2's job id: never shown
    assert (w1.jobs, w1.job_ids, w1.queues, w1.last_seen_at) == (2, tuple(mine), ("a",), when(T0 + 5))
    (other,) = await storage.workers(tenant="t2", seen_since=T0)
    assert other.job_ids == tuple(lease.job.id for lease in leases if lease.job.tenant == "t2")


async def test_purged_sightings_are_gone(storage: Store) -> None:
    await storage.jobs_insert([job("a")], now=T0)
    await storage.workers_seen([("old", "a")], now=T0)
    await storage.workers_seen([("new", "a")], now=T0 + 100)
    await storage.sightings_purge(before=T0 + 50)
    assert [w.worker_id for w in await storage.workers(tenant="t1", seen_since=0)] == ["new"]


# -- the engine, on the Trio clock ----------------------------------------------


async def put(engine: Engine, queue: str, tenant: str = "t1") -> None:
    await engine.enqueue(tenant, [EnqueueRequest(kind="k", config=JobConfig(queue=queue, delay_secs=3600))])


async def test_an_idle_worker_is_listed_for_five_minutes_after_its_last_lease(
    engine: Engine, autojump_clock: trio.abc.Clock
) -> None:
    await put(engine, "q")  # due in an hour: nothing to lease
    assert await engine.lease("q", worker_id="idle-1") == []
    ((worker_id, jobs, queues, last),) = [(w.worker_id, w.jobs, w.queues, w.last_seen_at) for w in await engine.workers("t1")]
    assert (worker_id, jobs, queues) == ("idle-1", 0, ("q",))
    assert last.timestamp() == pytest.approx(EPOCH + trio.current_time())
    assert await engine.workers("t2") == []
    await trio.sleep(engine.WORKERS_SEEN_SECS - 1)
    assert [w.worker_id for w in await engine.workers("t1")] == ["idle-1"]
    await trio.sleep(2)
    assert await engine.workers("t1") == []


async def test_lease_calls_are_written_at_most_every_few_seconds(engine: Engine, autojump_clock: trio.abc.Clock) -> None:
    await put(engine, "q")
    first = EPOCH + trio.current_time()
    await engine.lease("q", worker_id="w")
    await trio.sleep(engine.SIGHTING_EVERY_SECS - 1)
    await engine.lease("q", worker_id="w")  # not due: the store keeps the first time
    (w,) = await engine.workers("t1")
    assert w.last_seen_at.timestamp() == pytest.approx(first)
    await trio.sleep(1)
    await engine.lease("q", worker_id="w")
    (w,) = await engine.workers("t1")
    assert w.last_seen_at.timestamp() == pytest.approx(first + engine.SIGHTING_EVERY_SECS)


async def test_endless_worker_ids_grow_neither_memory_nor_the_table(engine: Engine, autojump_clock: trio.abc.Clock) -> None:
    engine.sightings = Sightings(every=engine.SIGHTING_EVERY_SECS, window=engine.WORKERS_SEEN_SECS, capacity=10)
    await put(engine, "q")
    for n in range(100):
        await engine.lease("q", worker_id=f"w-{n}")
    assert len(engine.sightings) == 10 and engine.sightings.refused == 90
    assert sorted(w.worker_id for w in await engine.workers("t1")) == sorted(f"w-{n}" for n in range(10))
    # a pair already kept is still written when due
    await trio.sleep(engine.SIGHTING_EVERY_SECS)
    await engine.lease("q", worker_id="w-3")
    assert (await engine.workers("t1"))[0].worker_id == "w-3"
    # once the window has passed, room frees up for new ids
    await trio.sleep(engine.WORKERS_SEEN_SECS + 1)
    await engine.lease("q", worker_id="later")
    assert [w.worker_id for w in await engine.workers("t1")] == ["later"]
    assert len(engine.sightings) <= 10


async def test_the_janitor_purges_old_sightings(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    # Store calls inline on the event loop: a store thread would let the
    # mock clock jump past the janitor's rounds (the purge itself is in the
    # store suite above, on both stores).
    async with open_sqlite_store(tmp_path / "qftrio.db", threaded=False) as store:
        engine = Engine(store, clock=lambda: EPOCH + trio.current_time())
        await purged_by_the_janitor(engine)


async def purged_by_the_janitor(engine: Engine) -> None:
    await put(engine, "q")
    await engine.lease("q", worker_id="gone")
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run_janitor)
        # Bounded on the Trio clock: the sighting is gone within a purge
        # round of the end of its window.
        with trio.fail_after(engine.WORKERS_SEEN_SECS + 3 * engine.PURGE_EVERY_SECS):
            while await engine.store.workers(tenant="t1", seen_since=0):
                await trio.sleep(1)
        assert trio.current_time() >= engine.WORKERS_SEEN_SECS
        nursery.cancel_scope.cancel()


# -- over HTTP -------------------------------------------------------------------


async def test_over_http_an_idle_worker_shows_to_the_tenants_of_its_queue(http: httpx.AsyncClient, server: RunningServer) -> None:
    (done,) = await enqueue(http, server, "acme", "images", "resize")
    (held,) = await lease(http, server, "images", worker_id="busy")
    r = await report(http, server, done, "complete", lease_token=held["lease_token"])
    assert r.status_code == 204
    assert await lease(http, server, "images", worker_id="idle") == []  # the queue holds a completed job of acme's
    await enqueue(http, server, "globex", "private", "x")
    (theirs,) = await lease(http, server, "private", worker_id="globex-worker", lease_secs=3600)

    answer = await http.get("/api/v1/workers", headers=server.headers())
    assert answer.status_code == 200
    listed = {w["worker_id"]: w for w in answer.json()["workers"]}
    assert listed.keys() == {"busy", "idle"}
    assert (listed["idle"]["jobs"], listed["idle"]["job_ids"], listed["idle"]["queues"]) == (0, [], ["images"])
    assert listed["idle"]["last_seen_at"].endswith("Z")
    (globex,) = (await http.get("/api/v1/workers", headers=server.headers("globex"))).json()["workers"]
    assert (globex["worker_id"], globex["job_ids"]) == ("globex-worker", [theirs["job"]["id"]])

    server.clock.advance(server.engine.WORKERS_SEEN_SECS + 1)
    # the held job keeps its holder listed; the idle ones are gone
    assert (await http.get("/api/v1/workers", headers=server.headers())).json()["workers"] == []
    (still,) = (await http.get("/api/v1/workers", headers=server.headers("globex"))).json()["workers"]
    assert still["worker_id"] == "globex-worker"
