"""Answers lost on the way back: a proxy between a ``qftrio worker`` and the
server drops answers to lease, complete and fail calls after the server has
acted on them. Every job still ends once, in its final state."""

from __future__ import annotations

import collections
import json
import signal
from collections.abc import Callable

import pytest
import trio

from qftrio import Client
from qftrio.models import Status

from .conftest import Rig, all_jobs, wait_for
from ..proxy import Proxy

pytestmark = pytest.mark.slow

QUEUE = "lossy"
#: Answers lost, by kind of call: leases that hand out jobs, completes, and
#: fails that schedule a retry or dead-letter.
LOSSES = {"lease": 2, "complete": 2, "retry": 1, "dead": 1}


class EveryOther:
    """Lose every other answer of each kind, up to :data:`LOSSES`;
    ``lost[kind]`` lists the jobs each lost answer was about."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        self.lost: dict[str, list[set[str]]] = {kind: [] for kind in LOSSES}
        #: (job id, attempt) of the claims whose lease answer was lost
        self.claims_lost: set[tuple[str, int]] = set()

    def __call__(self, target: str, request: bytes, answer: bytes) -> bool:
        call = target.rsplit("/", 1)[-1]
        if call not in ("lease", "complete", "fail"):
            return False
        claims: set[tuple[str, int]] = set()
        if call == "lease":
            claims = {(item["job"]["id"], item["job"]["attempt"]) for item in json.loads(answer)["jobs"]}
            items = [{"id": job_id} for job_id, _ in claims]
        elif target.startswith("/api/v1/leases/"):  # a batch report
            items = json.loads(request)["items"]
        else:  # /api/v1/jobs/<id>/<call>
            items = [{**json.loads(request), "id": target.split("/")[4]}]
        if not items:
            return False
        kind = call
        if call == "fail":
            kind = "retry" if any(item.get("retryable", True) for item in items) else "dead"
        self.seen[kind] += 1
        if self.seen[kind] % 2 == 0 or len(self.lost[kind]) >= LOSSES[kind]:
            return False
        self.lost[kind].append({item["id"] for item in items})
        self.claims_lost |= claims
        return True


async def test_lost_answers_to_lease_complete_and_fail_leave_each_job_ended_once(
    rig: Rig, app: Callable[[str], Client]
) -> None:
    (server,) = await rig.servers(rig.sqlite(), "server")
    rule = EveryOther()
    proxy = Proxy(int(server.url.rsplit(":", 1)[1]))
    proxy.drop = rule
    client = app(server.url)
    kinds = ["ok"] * 6 + ["bad"] * 3 + ["flaky"] * 3
    jobs = await client.enqueue_many(
        [{"kind": kind, "queue": QUEUE, "payload": {"i": i}} for i, kind in enumerate(kinds)]
    )
    expected = {job.id: job.kind for job in jobs}

    async with trio.open_nursery() as nursery:
        proxy_url = await nursery.start(proxy.run)
        worker = rig.worker("lossy", QUEUE, proxy_url, lease_secs=2, lanes=2)

        async def ended() -> bool:
            counts = (await client.queue_stats(QUEUE)).counts
            return counts["pending"] == counts["running"] == 0

        await wait_for(ended, timeout=60, what="every job to end")
        worker.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            while worker.poll() is None:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()

    assert {kind: len(lost) for kind, lost in rule.lost.items()} == LOSSES, proxy.dropped
    assert worker.returncode == 0, rig.log("lossy")
    final = {job.id: job for job in await all_jobs(client, QUEUE)}
    assert final.keys() == expected.keys()
    for job_id, job in final.items():
        ran = rig.ran(job_id)
        assert job.attempt in ran and max(ran) == job.attempt, f"attempts run {ran}, job at {job.attempt}"
        if expected[job_id] == "bad":
            assert job.status is Status.FAILED and job.error == "this job cannot succeed", job
        else:
            # the result of its last attempt: no earlier attempt's report landed over it
            assert job.status is Status.COMPLETED, job
            assert job.result == {"attempt": job.attempt, "worker": "lossy"}, job
        if expected[job_id] == "flaky":
            assert job.attempt >= 2
        # one error entry per attempt that did not complete: no report counted twice
        assert len(job.errors) == job.attempt - (job.status is Status.COMPLETED), job
    # A lost lease answer: its jobs ran only once that lease had run out.
    lost_leases = set().union(*rule.lost["lease"])
    for job_id, attempt in rule.claims_lost:
        assert attempt not in rig.ran(job_id), (final[job_id], rig.ran(job_id))
        assert final[job_id].attempt > attempt and "lease expired" in [e.error for e in final[job_id].errors]
    # A lost report answer: the report had landed, and the worker's retry of
    # it was a replay, answered as such; the lease never ran out.
    for job_id in set().union(*rule.lost["complete"], *rule.lost["retry"], *rule.lost["dead"]) - lost_leases:
        assert all(e.error != "lease expired" for e in final[job_id].errors), final[job_id]
