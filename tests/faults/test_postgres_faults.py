"""Faults of a PostgreSQL deployment: the database restarted under a running
server, the LISTEN connection killed, and one of two servers killed."""

from __future__ import annotations

import signal
from collections.abc import Callable

import httpx
import pytest
import trio

from qftrio import Client, errors
from qftrio.models import Job, Status

from .conftest import PgCluster, Rig, wait_for, worker_client

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

QUEUE = "pg"


async def ended(client: Client, jobs: list[Job]) -> bool:
    """Whether every one of *jobs* has completed."""
    for job in jobs:
        if (await client.job_get(job.id)).status is not Status.COMPLETED:
            return False
    return True


async def test_postgres_restarted_mid_run_is_503_then_qftrio_recovers_by_itself(
    rig: Rig, pg_cluster: PgCluster, app: Callable[[str], Client]
) -> None:
    (server,) = await rig.servers(["--database-url", pg_cluster.new_database()], "server")
    client = app(server.url)
    rig.worker("worker", QUEUE, server.url, lease_secs=2)
    before = [await client.enqueue("ok", queue=QUEUE) for _ in range(3)]
    await wait_for(lambda: ended(client, before), timeout=30, what="the jobs before the restart")

    await trio.to_thread.run_sync(pg_cluster.stop)
    try:
        with pytest.raises(errors.Unavailable) as refused:
            await client.enqueue("ok", queue=QUEUE)
        assert refused.value.status_code == 503 and refused.value.code
        async with httpx.AsyncClient(timeout=5) as http:
            health = await http.get(f"{server.url}/healthz")
        assert health.status_code == 503, health.text
    finally:
        await trio.to_thread.run_sync(pg_cluster.start)

    async def enqueued() -> Job | None:
        try:
            return await client.enqueue("ok", queue=QUEUE)
        except errors.Unavailable:
            return None

    after = [await wait_for(enqueued, timeout=30, what="enqueues to succeed again")]
    after += [await client.enqueue("ok", queue=QUEUE) for _ in range(2)]
    await wait_for(lambda: ended(client, after), timeout=30, what="the worker to run the jobs after the restart")
    assert server.proc.poll() is None, "the server exited"


def listeners(cluster: PgCluster, database: str) -> set[str]:
    """Backend pids of the connections LISTENing on *database*."""
    rows = cluster.psql(
        "postgres", f"SELECT pid FROM pg_stat_activity WHERE datname = '{database}' AND query LIKE 'LISTEN%'"
    )
    return set(rows.split())


async def test_long_polls_still_wake_after_the_listen_connection_is_killed(
    rig: Rig, pg_cluster: PgCluster, app: Callable[[str], Client]
) -> None:
    url = pg_cluster.new_database()
    database = url.rsplit("/", 1)[1]
    a, b = await rig.servers(["--database-url", url], "a", "b")

    async def listening(previous: set[str]) -> set[str] | None:
        pids = await trio.to_thread.run_sync(listeners, pg_cluster, database)
        return pids if len(pids) == 2 and not pids & previous else None

    # A server LISTENs once a long poll may wait on it, not before.
    assert await trio.to_thread.run_sync(listeners, pg_cluster, database) == set()
    for server in (a, b):
        async with worker_client(server.url) as worker:
            assert await worker.lease(QUEUE, lease_secs=30, wait_secs=0.2) == []
    first = await wait_for(lambda: listening(set()), timeout=20, what="both servers to LISTEN")
    pids = ", ".join(sorted(first))
    kill = f"SELECT pg_terminate_backend(pid) FROM unnest(ARRAY[{pids}]) AS pid"
    await trio.to_thread.run_sync(pg_cluster.psql, "postgres", kill)
    await wait_for(lambda: listening(first), timeout=20, what="both servers to LISTEN again")

    # A long poll on b, shorter than b's safety poll (5 s), must be woken by
    # an enqueue on a: only a NOTIFY through b's new LISTEN connection can.
    async with worker_client(b.url) as worker, trio.open_nursery() as nursery:
        got: list[list[object]] = []

        async def poll() -> None:
            got.append(await worker.lease(QUEUE, lease_secs=30, wait_secs=4))

        nursery.start_soon(poll)
        # The poll's park is not observable from outside; an enqueue that
        # came first would be claimed at once, which passes too.
        await trio.sleep(0.5)
        job = await app(a.url).enqueue("ok", queue=QUEUE)
    (leases,) = got
    assert [lease.job.id for lease in leases] == [job.id], "the long poll was not woken"


async def test_two_servers_one_killed_the_other_serves_everything(
    rig: Rig, pg_cluster: PgCluster, app: Callable[[str], Client]
) -> None:
    a, b = await rig.servers(["--database-url", pg_cluster.new_database()], "a", "b")
    on_a, on_b = app(a.url), app(b.url)
    jobs = [await on_a.enqueue("hold", queue=QUEUE) for _ in range(4)]
    rig.worker("wa", QUEUE, a.url, lease_secs=2, lanes=2)
    rig.worker("wb", QUEUE, b.url, lease_secs=2, lanes=2)

    async def both_busy() -> bool:
        held = [await on_b.job_get(job.id) for job in jobs]
        return {j.worker_id for j in held if j.status is Status.RUNNING} == {"wa", "wb"}

    await wait_for(both_busy, timeout=30, what="both workers to hold jobs")
    a.kill()
    for job in jobs:
        (rig.marks / f"{job.id}.go").touch()
    jobs += [await on_b.enqueue("ok", queue=QUEUE) for _ in range(3)]

    await wait_for(lambda: ended(on_b, jobs), timeout=40, what="b to serve every job")
    for job in jobs:
        done = await on_b.job_get(job.id)
        assert done.result == {"attempt": done.attempt, "worker": "wb"}, done
    assert b.proc.poll() is None and a.proc.returncode == -signal.SIGKILL
