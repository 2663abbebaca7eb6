"""The times of the Python records read like the wire: every time a call of
the client returns, and every time of a job a handler is given, is an aware
datetime in UTC naming the instant of the wire's RFC 3339 string (a real
server over real HTTP, each backend)."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from qftrio.client import Client
from qftrio.models import Job, format_time, to_datetime
from qftrio.testing import wait_for_job
from qftrio.worker.registry import Registry
from qftrio.worker.runtime import open_worker
from qftrio.worker.transport import HttpTransport

from .conftest import RunningServer
from .test_client import tenant, worker  # noqa: F401 (the fixtures: a tenant's client, the worker's)

UTC = datetime.timezone.utc
#: An instant with microseconds, and the same instant as every input a
#: caller may give.
AT = datetime.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers(), timeout=5) as client:
        yield client


def same_as_wire(value: Any, wire: str | None) -> None:
    """*value* is the aware UTC datetime the wire's *wire* names."""
    if wire is None:
        assert value is None
        return
    assert type(value) is datetime.datetime and value.tzinfo is UTC, value
    assert format_time(value) == wire
    assert value == datetime.datetime.fromisoformat(wire)
    assert value.isoformat(timespec="microseconds") == wire.replace("Z", "+00:00")


async def wire_job(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await http.get(f"/api/v1/jobs/{job_id}")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


async def test_a_jobs_times_are_the_wires_as_aware_datetimes(tenant: Client, http: httpx.AsyncClient) -> None:
    job = await tenant.enqueue("x", scheduled_at=AT)
    assert job.scheduled_at == AT and job.scheduled_at.isoformat() == "2031-05-06T07:08:09.123456+00:00"
    wire = await wire_job(http, job.id)
    for name in ("scheduled_at", "created_at", "updated_at", "locked_until", "progress_at"):
        same_as_wire(getattr(job, name), wire[name])
    assert await tenant.job_get(job.id) == job
    assert job.created_at <= job.updated_at < job.scheduled_at


@pytest.mark.parametrize(
    "given",
    [
        AT,
        AT.astimezone(datetime.timezone(datetime.timedelta(hours=-5))),
        AT.replace(tzinfo=None),  # naive: UTC
        AT.timestamp(),
        "2031-05-06T07:08:09.123456Z",
        "2031-05-06T09:08:09.123456+02:00",
    ],
    ids=["utc", "offset", "naive", "epoch", "rfc3339", "rfc3339-offset"],
)
async def test_every_time_input_names_the_same_instant(tenant: Client, given: Any) -> None:
    job = await tenant.enqueue("x", scheduled_at=given)
    assert job.scheduled_at == AT and job.scheduled_at.tzinfo is UTC


async def test_an_attempts_and_an_errors_times(
    server: RunningServer, tenant: Client, worker: Client, http: httpx.AsyncClient
) -> None:
    job = await tenant.enqueue("x", queue="times", max_attempts=3)
    (lease,) = await worker.lease("times", lease_secs=60, worker_id="w-times")
    running = lease.job
    same_as_wire(running.locked_until, (await wire_job(http, job.id))["locked_until"])
    assert running.locked_until is not None and running.locked_until > running.updated_at
    (attempt,) = running.attempts
    assert attempt.claimed_at == running.updated_at and attempt.ended_at is None
    status, locked_until = await worker.heartbeat(job.id, lease.lease_token, 120)
    assert status == "running" and locked_until is not None and locked_until.tzinfo is UTC
    await worker.fail(job.id, lease.lease_token, "boom")

    failed = await tenant.job_get(job.id)
    wire = await wire_job(http, job.id)
    (entry,) = failed.attempts
    same_as_wire(entry.claimed_at, wire["attempts"][0]["claimed_at"])
    same_as_wire(entry.ended_at, wire["attempts"][0]["ended_at"])
    (error,) = failed.errors
    same_as_wire(error.at, wire["errors"][0]["at"])
    assert entry.claimed_at is not None and entry.ended_at is not None
    assert entry.claimed_at <= entry.ended_at and entry.claimed_at <= error.at


async def test_a_schedules_times(tenant: Client, http: httpx.AsyncClient) -> None:
    schedule = await tenant.schedule_set("hourly", "0 * * * *", {"kind": "x"})
    assert schedule.next_run_at is not None and schedule.next_run_at.minute == 0
    assert schedule.next_run_at > schedule.created_at and schedule.last_run_at is None
    triggered, job = await tenant.schedule_trigger("hourly")
    wire = (await http.get("/api/v1/schedules/hourly")).json()
    for name in ("next_run_at", "last_run_at", "created_at", "updated_at"):
        same_as_wire(getattr(triggered, name), wire[name])
    assert triggered.last_run_at == job.created_at and triggered.next_run_at == schedule.next_run_at


async def test_the_operations_records_times(tenant: Client, worker: Client, http: httpx.AsyncClient) -> None:
    await tenant.enqueue("x", queue="ops")
    await tenant.enqueue("x", queue="ops", scheduled_at=AT)
    await worker.lease("ops", worker_id="w-ops", lease_secs=60)
    await tenant.enqueue("x", queue="ops")
    stats = await tenant.queue_stats("ops")
    wire = (await http.get("/api/v1/queues/ops/stats")).json()
    same_as_wire(stats.oldest_ready_at, wire["oldest_ready_at"])
    same_as_wire(stats.next_available_at, wire["next_available_at"])
    assert stats.oldest_ready_at is not None and stats.next_available_at is not None

    (seen,) = [w for w in await tenant.workers() if w.worker_id == "w-ops"]
    (wired,) = [w for w in (await http.get("/api/v1/workers")).json()["workers"] if w["worker_id"] == "w-ops"]
    same_as_wire(seen.last_seen_at, wired["last_seen_at"])

    workflow = await tenant.workflow_create("flow", [{"name": "a", "kind": "x"}])
    wired = (await http.get(f"/api/v1/workflows/{workflow.id}")).json()
    same_as_wire(workflow.created_at, wired["created_at"])
    same_as_wire(workflow.updated_at, wired["updated_at"])
    step_job = workflow.step("a").job
    assert step_job is not None and step_job.created_at.tzinfo is UTC

    await tenant.rate_limit_set("slow", 1, 60)
    await tenant.enqueue("x", queue="rated", rate_limit="slow")
    await tenant.enqueue("x", queue="rated", rate_limit="slow")
    await worker.lease("rated", max_jobs=2)
    (limit,) = await tenant.rate_limits_list()
    (wired,) = (await http.get("/api/v1/rate-limits")).json()["rate_limits"]
    same_as_wire(limit.next_available_at, wired["next_available_at"])
    assert limit.next_available_at is not None


async def test_a_handler_is_given_aware_datetimes(server: RunningServer, tenant: Client, worker: Client) -> None:
    seen: list[Job] = []
    registry = Registry()

    @registry.handler("timed")
    async def timed(job: Job) -> dict[str, Any]:
        seen.append(job)
        return {"at": job.scheduled_at.isoformat(), "deadline": job.locked_until and job.locked_until.isoformat()}

    job = await tenant.enqueue("timed", queue="timed")
    async with open_worker(HttpTransport(worker), "timed", registry, lease_secs=30, wait_secs=1):
        done = await wait_for_job(tenant, job.id, timeout=30)
    (given,) = seen
    assert given.scheduled_at == job.scheduled_at and given.scheduled_at.tzinfo is UTC
    assert given.locked_until is not None and given.locked_until > given.updated_at
    assert done.result == {"at": job.scheduled_at.isoformat(), "deadline": given.locked_until.isoformat()}


def test_to_datetime_reads_each_form() -> None:
    assert to_datetime(None) is None
    for given in (AT, AT.replace(tzinfo=None), AT.timestamp(), "2031-05-06T07:08:09.123456Z"):
        got = to_datetime(given)
        assert got == AT and got.tzinfo is UTC
    with pytest.raises(TypeError):
        to_datetime(object())  # type: ignore[arg-type]
