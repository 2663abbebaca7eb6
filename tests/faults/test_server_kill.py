"""``kill -9`` of the server under an enqueue and lease storm, on each store:
every acknowledged enqueue survives, every acknowledged completion stands,
and every job ends exactly once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from qftrio import Client, errors
from qftrio.models import Status

from .conftest import Rig, all_jobs, wait_for, worker_client

pytestmark = pytest.mark.slow

QUEUE = "storm"


class Ledger:
    """What was sent and what the server acknowledged: enqueued jobs, and
    for each job the lease tokens it was completed with (sent), and those
    whose completion was answered 204 (acknowledged)."""

    def __init__(self) -> None:
        self.enqueued: set[str] = set()
        self.sent: dict[str, set[str]] = {}
        self.completed: dict[str, set[str]] = {}

    async def complete(self, worker: Client, job_id: str, token: str) -> None:
        self.sent.setdefault(job_id, set()).add(token)
        await worker.complete(job_id, token, {"token": token})
        self.completed.setdefault(job_id, set()).add(token)


async def enqueuer(client: Client, ledger: Ledger, n: int) -> None:
    """Enqueue until the server goes away, in batches every fifth call."""
    for i in range(10_000):
        try:
            if i % 5 == 0:
                batch = [{"kind": "ok", "payload": {"n": n, "i": i, "j": j}, "queue": QUEUE} for j in range(10)]
                jobs = await client.enqueue_many(batch)
                ledger.enqueued.update(job.id for job in jobs)
            else:
                ledger.enqueued.add((await client.enqueue("ok", {"n": n, "i": i}, queue=QUEUE)).id)
        except (errors.TransportError, errors.Unavailable):
            return


async def leaser(url: str, ledger: Ledger, until: Callable[[], bool]) -> None:
    """Lease and complete at once (the result names the token), until the
    server goes away or *until* says so."""
    async with worker_client(url) as worker:
        while not until():
            try:
                leases = await worker.lease(QUEUE, max_jobs=5, lease_secs=2, wait_secs=0.5)
                for lease in leases:
                    await ledger.complete(worker, lease.job.id, lease.lease_token)
            except (errors.TransportError, errors.Unavailable):
                return


async def test_kill_9_under_an_enqueue_and_lease_storm_loses_nothing(
    rig: Rig, store: list[str], app: Callable[[str], Client]
) -> None:
    ledger = Ledger()
    (first,) = await rig.servers(store, "first")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            client = app(first.url)
            for n in range(6):
                nursery.start_soon(enqueuer, client, ledger, n)
            for _ in range(2):
                nursery.start_soon(leaser, first.url, ledger, lambda: False)

            async def stormed() -> bool:
                return len(ledger.enqueued) >= 200 and len(ledger.completed) >= 20

            await wait_for(stormed, timeout=50, what="200 enqueues and 20 completions")
            first.kill()
    before_kill = {job_id: set(tokens) for job_id, tokens in ledger.completed.items()}

    (second,) = await rig.servers(store, "second")
    client = app(second.url)

    async def finished() -> bool:
        counts = (await client.queue_stats(QUEUE)).counts
        return counts["pending"] == counts["running"] == 0

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            done = False
            for _ in range(2):
                nursery.start_soon(leaser, second.url, ledger, lambda: done)
            await wait_for(finished, timeout=55, what="the storm's jobs to drain after the restart")
            done = True

    stored = {job.id: job for job in await all_jobs(client, QUEUE)}
    missing = ledger.enqueued - stored.keys()
    assert not missing, f"{len(missing)} acknowledged enqueues lost"
    for job_id, job in stored.items():
        # Completed once: by a completion that was sent for it, and no other
        # completion of it acknowledged.
        assert job.status is Status.COMPLETED, job
        assert job.result is not None and job.result["token"] in ledger.sent[job_id], job
        assert ledger.completed.get(job_id, set()) <= {job.result["token"]}, f"job {job_id} completed twice"
    for job_id, tokens in before_kill.items():
        assert ledger.completed[job_id] == tokens, f"job {job_id} ran again after its completion was acknowledged"
