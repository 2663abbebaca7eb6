"""A worker frozen (``SIGSTOP``) past its lease, then resumed: another
worker has finished its job meanwhile, and the resumed worker changes
nothing. It either sees that its lease ran out while it was frozen and
reports nothing (``unreported``), or its late report is refused with a
``409`` (``lost``); either way the other worker's result stands."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable

import pytest

from qftrio import Client
from qftrio.models import Lease, Status

from .conftest import Rig, wait_for, worker_client

pytestmark = pytest.mark.slow

QUEUE = "frozen"


async def test_a_worker_stopped_past_its_lease_changes_nothing_when_resumed(
    rig: Rig, app: Callable[[str], Client]
) -> None:
    (server,) = await rig.servers(rig.sqlite(), "server")
    client = app(server.url)
    job = await client.enqueue("hold", queue=QUEUE)
    frozen = rig.worker("frozen", QUEUE, server.url, lease_secs=1, lanes=1)

    async def started() -> bool:
        return rig.ran(job.id) == {1}

    await wait_for(started, timeout=30, what="the worker to start the job")
    frozen.send_signal(signal.SIGSTOP)

    async with worker_client(server.url) as other:

        async def taken_over() -> Lease | None:
            leases = await other.lease(QUEUE, lease_secs=60, wait_secs=1, worker_id="other")
            return leases[0] if leases else None

        lease = await wait_for(taken_over, timeout=15, what="the frozen worker's lease to run out")
        assert lease.job.id == job.id and lease.job.attempt == 2
        await other.complete(job.id, lease.lease_token, {"by": "other"})

    (rig.marks / f"{job.id}.go").touch()  # the frozen handler would finish now
    frozen.send_signal(signal.SIGCONT)

    async def given_up() -> bool:
        # the worker's events (docs/worker.md)
        return re.search(rf"(lost|unreported) job {job.id}", rig.log("frozen")) is not None

    await wait_for(given_up, timeout=15, what="the resumed worker to give the job up")
    after = await client.job_get(job.id)
    assert after.status is Status.COMPLETED and after.attempt == 2
    assert after.result == {"by": "other"}, "the resumed worker's result replaced the other's"
    assert after.worker_id == "other"

    # The resumed worker carries on with new work.
    assert frozen.poll() is None, rig.log("frozen")
    fresh = await client.enqueue("ok", queue=QUEUE)

    async def done_by_it() -> bool:
        return (await client.job_get(fresh.id)).status is Status.COMPLETED

    await wait_for(done_by_it, timeout=15, what="the resumed worker to run a new job")
    assert (await client.job_get(fresh.id)).result == {"attempt": 1, "worker": "frozen"}
