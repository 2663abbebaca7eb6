"""A schedule firing every second on three PostgreSQL servers, one of them
SIGKILLed and started again meanwhile: every tick enqueued exactly one job
(docs/schedules.md, "Exactly once")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from qftrio import Client

from .conftest import PgCluster, Rig, all_jobs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


async def test_each_tick_one_job_while_a_server_is_killed_and_restarted(
    rig: Rig, pg_cluster: PgCluster, app: Callable[[str], Client]
) -> None:
    store = ["--database-url", pg_cluster.new_database()]
    a, b, c = await rig.servers(store, "a", "b", "c")
    client = app(a.url)
    schedule = await client.schedule_set("every-second", "* * * * * *", {"kind": "tick", "queue": "cron"})
    assert schedule.next_run_at is not None
    first = schedule.next_run_at.timestamp()  # ticks are whole seconds

    async def fired_past(at: float) -> bool:
        last = (await client.schedule_get("every-second")).last_run_at
        return last is not None and last.timestamp() >= at

    await wait_for(lambda: fired_past(first + 8), timeout=60, what="eight seconds of ticks on three servers")
    b.kill()  # wherever it was: maybe mid-round, holding a tick's transaction
    await wait_for(lambda: fired_past(first + 14), timeout=60, what="ticks on the two servers left")
    (b2,) = await rig.servers(store, "b2")
    await wait_for(lambda: fired_past(first + 22), timeout=60, what="ticks on three servers again")
    paused = (await client.schedule_pause("every-second")).last_run_at
    assert paused is not None
    last = paused.timestamp()

    jobs = await all_jobs(client, "cron")
    ticks = sorted(job.scheduled_at.timestamp() for job in jobs)
    # one job per tick, none doubled, none lost, from the first tick to the last
    assert ticks == [first + k for k in range(int(last - first) + 1)]
    assert {job.schedule for job in jobs} == {"every-second"}
    for server in (a, c, b2):
        assert server.proc.poll() is None, rig.log(server.name)
