"""Snooze (a job back to pending for a while, its attempt not used up),
``retry_in_secs`` on fail and a job's own ``backoff``: on both stores and
over real HTTP."""

from __future__ import annotations

import pytest

from qftrio.models import SnoozeItem, Status
from qftrio.models import to_datetime as when
from qftrio.server.engine import RetryPolicy
from qftrio.server.store.base import FailItem, NewJob, Outcome, Store

T0 = 1_800_000_000.0
DEFAULT = RetryPolicy().retry_at


def new(**kw) -> NewJob:
    return NewJob(tenant="t1", queue="q", kind="k", payload={}, scheduled_at=T0, **kw)


async def claim(storage: Store, now: float):
    return await storage.jobs_claim("q", limit=1, lease_secs=30, worker_id="w1", now=now)


async def test_a_job_snoozed_twenty_times_is_never_dead_lettered(storage: Store) -> None:
    (ins,) = await storage.jobs_insert([new(max_attempts=1)], now=T0)
    now = T0
    for n in range(1, 21):
        (lease,) = await claim(storage, now)
        assert lease.job.attempt == n
        (res,) = await storage.jobs_snooze([SnoozeItem(ins.id, lease.lease_token, 60)], now=now + 1)
        assert (res.outcome, res.status, res.applied) == (Outcome.OK, Status.PENDING, True)
        job = await storage.job_get(ins.id)
        assert job.status is Status.PENDING and job.scheduled_at == when(now + 61) and job.locked_until is None
        assert job.max_attempts == 1 + n and job.errors == ()
        assert await claim(storage, now + 60) == []
        now += 61
    (lease,) = await claim(storage, now)
    # the last attempt fails for good: snoozes never used the budget up, nor extended it
    (res,) = await storage.jobs_fail([FailItem(ins.id, lease.lease_token, "no")], now=now, retry_at=DEFAULT)
    assert res.status is Status.FAILED


async def test_snooze_answers_as_a_report(storage: Store) -> None:
    a, b = (i.id for i in await storage.jobs_insert([new(), new()], now=T0))
    leases = await storage.jobs_claim("q", limit=2, lease_secs=30, worker_id="w1", now=T0)
    token = {lease.job.id: lease.lease_token for lease in leases}
    await storage.jobs_fail([FailItem(b, token[b], "x", retryable=False)], now=T0 + 1, retry_at=DEFAULT)
    results = await storage.jobs_snooze(
        [
            SnoozeItem(a, token[a], 5),
            SnoozeItem(a, token[a], 5),  # the same lease twice in one batch: a replay
            SnoozeItem(a, "00000000-0000-4000-8000-000000000000", 5),
            SnoozeItem(b, token[b], 5),  # failed: too late
            SnoozeItem("00000000-0000-7000-8000-000000000000", token[a], 5),
            SnoozeItem("not-an-id", token[a], 5),
        ],
        now=T0 + 2,
    )
    assert [(r.outcome, r.applied) for r in results] == [
        (Outcome.OK, True), (Outcome.OK, False), (Outcome.CONFLICT, False), (Outcome.CONFLICT, False),
        (Outcome.NOT_FOUND, False), (Outcome.NOT_FOUND, False),
    ]  # fmt: skip
    (replay,) = await storage.jobs_snooze([SnoozeItem(a, token[a], 5)], now=T0 + 3)
    assert (replay.outcome, replay.applied) == (Outcome.OK, False)
    job = await storage.job_get(a)
    assert job.max_attempts == 6 and job.scheduled_at == when(T0 + 7)


async def test_retry_in_and_a_jobs_own_backoff(storage: Store) -> None:
    own = {"initial_secs": 7, "factor": 3, "max_secs": 100, "jitter": 0}
    a, b = (i.id for i in await storage.jobs_insert([new(backoff=own), new(backoff=own)], now=T0))
    assert (await storage.job_get(a)).backoff == own
    leases = await storage.jobs_claim("q", limit=2, lease_secs=30, worker_id="w1", now=T0)
    token = {lease.job.id: lease.lease_token for lease in leases}
    await storage.jobs_fail(
        [FailItem(a, token[a], "slow down", retry_in_secs=600), FailItem(b, token[b], "x")], now=T0 + 1, retry_at=DEFAULT
    )
    assert (await storage.job_get(a)).scheduled_at == when(T0 + 601)
    assert (await storage.job_get(b)).scheduled_at == when(T0 + 8)  # its own backoff: 7 s, no jitter
    (lease,) = await claim(storage, T0 + 8)
    await storage.jobs_fail([FailItem(b, lease.lease_token, "x")], now=T0 + 9, retry_at=DEFAULT)
    assert (await storage.job_get(b)).scheduled_at == when(T0 + 9 + 21)


# -- over HTTP ------------------------------------------------------------------


async def enqueue_and_lease(http, server, **config) -> tuple[str, str]:
    body = {"kind": "k", "config": {"queue": "later", **config}}
    r = await http.post("/api/v1/jobs", json=body, headers=server.headers())
    assert r.status_code == 201, r.text
    r = await http.post("/api/v1/queues/later/lease", json={}, headers=server.headers("worker"))
    (leased,) = r.json()["jobs"]
    return leased["job"]["id"], leased["lease_token"]


async def test_snooze_over_http(http, server) -> None:
    job_id, token = await enqueue_and_lease(http, server, max_attempts=1)
    worker = server.headers("worker")
    r = await http.post(f"/api/v1/jobs/{job_id}/snooze", json={"lease_token": token, "delay_secs": 30}, headers=worker)
    assert r.status_code == 204 and r.content == b""
    got = (await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())).json()
    assert got["status"] == "pending" and got["max_attempts"] == 2 and got["attempt"] == 1
    stale = await http.post(
        f"/api/v1/jobs/{job_id}/snooze", json={"lease_token": "x" * 36, "delay_secs": 30}, headers=worker
    )
    assert stale.status_code == 409
    unknown = await http.post(
        "/api/v1/jobs/00000000-0000-7000-8000-000000000000/snooze", json={"lease_token": token, "delay_secs": 1}, headers=worker
    )
    assert unknown.status_code == 404
    server.clock.advance(31)
    r = await http.post("/api/v1/queues/later/lease", json={}, headers=worker)
    (leased,) = r.json()["jobs"]
    items = [{"id": job_id, "lease_token": leased["lease_token"], "delay_secs": 0}, {"id": job_id, "lease_token": token, "delay_secs": 0}]
    r = await http.post("/api/v1/leases/snooze", json={"items": items}, headers=worker)
    assert r.status_code == 200 and [x["code"] for x in r.json()["results"]] == [204, 409]
    tenant = await http.post(f"/api/v1/jobs/{job_id}/snooze", json={"lease_token": token, "delay_secs": 1}, headers=server.headers())
    assert tenant.status_code == 403


async def test_retry_in_over_http(http, server) -> None:
    job_id, token = await enqueue_and_lease(http, server)
    r = await http.post(
        f"/api/v1/jobs/{job_id}/fail",
        json={"lease_token": token, "error": "429", "retry_in_secs": 90},
        headers=server.headers("worker"),
    )
    assert r.status_code == 204
    got = (await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())).json()
    assert got["status"] == "pending" and got["error"] == "429"
    from qftrio.models import parse_time

    assert parse_time(got["scheduled_at"]) - parse_time(got["updated_at"]) == pytest.approx(90)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("snooze", {"lease_token": "t", "delay_secs": -1}, "delay_secs"),
        ("snooze", {"lease_token": "t", "delay_secs": 31 * 86400}, "delay_secs"),
        ("snooze", {"lease_token": "t", "delay_secs": "5"}, "delay_secs"),
        ("fail", {"lease_token": "t", "error": "e", "retry_in_secs": -0.5}, "retry_in_secs"),
    ],
)
async def test_bad_reports_are_refused_naming_the_field(http, server, path, body, field) -> None:
    job_id, token = await enqueue_and_lease(http, server)
    r = await http.post(f"/api/v1/jobs/{job_id}/{path}", json={**body, "lease_token": token}, headers=server.headers("worker"))
    assert r.status_code == 422 and field in r.json()["error"]["message"]
    assert (await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())).json()["status"] == "running"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"timeout_secs": 0}, "timeout_secs"),
        ({"timeout_secs": 7 * 86400 + 1}, "timeout_secs"),
        ({"timeout_secs": 2.5}, "timeout_secs"),
        ({"backoff": {"initial_secs": 1, "step": 2}}, "backoff.step"),
        ({"backoff": {"initial_secs": 0}}, "backoff.initial_secs"),
        ({"backoff": {"factor": 0.5}}, "backoff.factor"),
        ({"backoff": {"jitter": 2}}, "backoff.jitter"),
        ({"delay_secs": -1}, "delay_secs"),
    ],
)
async def test_bad_job_policies_are_refused_naming_the_field(http, server, config, field) -> None:
    body = {"kind": "k", "config": {"queue": "bad", **config}}
    r = await http.post("/api/v1/jobs", json=body, headers=server.headers())
    assert r.status_code == 422 and field in r.json()["error"]["message"], r.text
    listed = await http.get("/api/v1/jobs", params={"queue": "bad"}, headers=server.headers())
    assert listed.json()["jobs"] == []


async def test_stats_count_the_jobs_whose_time_has_not_come(storage: Store) -> None:
    ready, delayed, snoozed = (i.id for i in await storage.jobs_insert([new(), new(), new()], now=T0))
    await storage.jobs_insert([NewJob(tenant="t1", queue="q", kind="k", payload={}, scheduled_at=T0 + 500)], now=T0)
    leases = await storage.jobs_claim("q", limit=3, lease_secs=30, worker_id="w1", now=T0)
    token = {lease.job.id: lease.lease_token for lease in leases}
    await storage.jobs_snooze([SnoozeItem(snoozed, token[snoozed], 60)], now=T0 + 1)
    await storage.jobs_fail([FailItem(delayed, token[delayed], "x", retry_in_secs=100)], now=T0 + 1, retry_at=DEFAULT)
    (stats,) = await storage.queues_stats(tenant="t1", now=T0 + 2)
    assert (stats.counts["pending"], stats.counts["running"], stats.scheduled) == (3, 1, 3)
    assert stats.to_wire()["counts"]["scheduled"] == 3
    (stats,) = await storage.queues_stats(tenant="t1", now=T0 + 102)
    assert stats.scheduled == 1
    assert ready in token


async def test_the_jobs_whose_time_has_not_come_next_first(storage: Store) -> None:
    def at(delay: float, queue: str = "q", tenant: str = "t1") -> NewJob:
        return NewJob(tenant=tenant, queue=queue, kind="k", payload={}, scheduled_at=T0 + delay)

    ids = [i.id for i in await storage.jobs_insert([at(0), at(300), at(100), at(200, "r"), at(50, tenant="t2")], now=T0)]
    got = await storage.jobs_scheduled(tenant="t1", now=T0)
    assert [job.id for job in got] == [ids[2], ids[3], ids[1]]
    assert [job.id for job in await storage.jobs_scheduled(tenant="t1", now=T0, queue="q", limit=1)] == [ids[2]]
    assert [job.id for job in await storage.jobs_scheduled(tenant="t1", now=T0, limit=2)] == [ids[2], ids[3]]
    assert [job.id for job in await storage.jobs_scheduled(tenant="t1", now=T0 + 150)] == [ids[3], ids[1]]
    assert await storage.jobs_scheduled(tenant="t1", now=T0, queue="none") == []


async def test_the_clients_snooze_retry_in_and_job_policies(server) -> None:
    from qftrio import Client, Conflict

    async with Client(server.url, server.tenants["acme"], timeout=5) as tenant, Client(
        server.url, server.worker_token, timeout=5
    ) as worker:
        job = await tenant.enqueue("k", queue="by-client", timeout_secs=60, backoff={"initial_secs": 2, "jitter": 0})
        # the backoff as stored: every field, those left out the server's defaults
        full = {"initial_secs": 2.0, "factor": 2.0, "max_secs": 3600.0, "jitter": 0.0}
        assert (job.timeout_secs, job.backoff) == (60, full)
        (lease,) = await worker.lease("by-client")
        await worker.job_snooze(job.id, lease.lease_token, 0)
        snoozed = await tenant.job_get(job.id)
        assert (snoozed.status, snoozed.max_attempts, snoozed.backoff) == ("pending", 6, full)
        (lease,) = await worker.lease("by-client")
        await worker.fail(job.id, lease.lease_token, "busy", retry_in_secs=45)
        failed = await tenant.job_get(job.id)
        assert (failed.scheduled_at - failed.updated_at).total_seconds() == pytest.approx(45)
        with pytest.raises(Conflict):
            await worker.job_snooze(job.id, "00000000-0000-4000-8000-000000000000", 1)
