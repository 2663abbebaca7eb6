"""The HTTP client against a real server over real HTTP (the ``server``
fixture of conftest: every backend available)."""

from __future__ import annotations

import asyncio
import datetime
import functools
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from qftrio import errors
from qftrio.client import Client, CompleteItem, FailItem, HeartbeatItem
from qftrio.models import Outcome, Status

from .conftest import RunningServer
from .test_http_client import start

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def tenant(server: RunningServer) -> AsyncIterator[Client]:
    async with Client(server.url, server.tenants["acme"], timeout=5) as client:
        yield client


@pytest.fixture
async def worker(server: RunningServer) -> AsyncIterator[Client]:
    async with Client(server.url, server.worker_token, timeout=5) as client:
        yield client


# -- application API -----------------------------------------------------------


async def test_health(tenant: Client) -> None:
    assert (await tenant.health())["status"] == "ok"


async def test_enqueue_get_and_idempotency(tenant: Client) -> None:
    job = await tenant.enqueue("resize-image", {"src": "a.png"}, queue="images", priority=3, max_attempts=2)
    assert (job.kind, job.queue, job.priority, job.max_attempts) == ("resize-image", "images", 3, 2)
    assert job.status is Status.PENDING and job.attempt == 0 and job.payload == {"src": "a.png"}
    assert (await tenant.job_get(job.id)) == job

    first = await tenant.enqueue("x", idempotency_key="k1")
    again = await tenant.enqueue("x", {"other": True}, idempotency_key="k1")
    assert again.id == first.id and again.payload == {}


async def test_enqueue_delayed_and_scheduled(tenant: Client) -> None:
    delayed = await tenant.enqueue("x", delay_secs=60)
    assert delayed.scheduled_at >= delayed.created_at + datetime.timedelta(seconds=59)
    at = delayed.created_at + datetime.timedelta(hours=1)
    scheduled = await tenant.enqueue("x", scheduled_at=at)
    assert scheduled.scheduled_at == at


async def test_enqueue_many_accepts_wire_and_flat_items(tenant: Client) -> None:
    jobs = await tenant.enqueue_many(
        [
            {"kind": "a", "payload": {"n": 1}, "config": {"queue": "q1"}},
            {"kind": "b", "queue": "q2", "priority": 5},
        ]
    )
    assert [(j.kind, j.queue, j.priority) for j in jobs] == [("a", "q1", 0), ("b", "q2", 5)]


async def test_bad_input_is_refused_before_sending(tenant: Client) -> None:
    with pytest.raises(errors.InvalidInput, match="kind"):
        await tenant.enqueue("not a kind")
    with pytest.raises(errors.InvalidInput, match="delay_secs or scheduled_at"):
        await tenant.enqueue("x", delay_secs=1, scheduled_at=1.0)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(errors.InvalidInput, match="payload.ratio.1: .* is not a JSON number"):
            await tenant.enqueue("x", payload={"ratio": [1.0, bad]})
    assert await tenant.jobs_list() == ([], None)


async def test_server_side_validation_raises_invalid_input(tenant: Client) -> None:
    with pytest.raises(errors.InvalidInput, match="limit"):
        await tenant.jobs_list(limit=5000)


async def test_unknown_job_is_not_found(tenant: Client) -> None:
    with pytest.raises(errors.NotFound) as info:
        await tenant.job_get("00000000-0000-0000-0000-000000000000")
    assert info.value.status_code == 404 and info.value.code


async def test_jobs_list_pages_with_cursor(tenant: Client) -> None:
    made = [await tenant.enqueue("page", {"n": n}, queue="pages") for n in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = await tenant.jobs_list(queue="pages", limit=2, cursor=cursor)
        seen += [j.id for j in page]
        if cursor is None:
            break
    assert seen == [j.id for j in reversed(made)]
    pending, _ = await tenant.jobs_list(queue="pages", status=Status.PENDING, kind="page")
    assert len(pending) == 5


async def test_cancel_and_retry(tenant: Client) -> None:
    job = await tenant.enqueue("x")
    cancelled = await tenant.job_cancel(job.id)
    assert cancelled.status is Status.CANCELLED
    with pytest.raises(errors.Conflict):
        await tenant.job_cancel(job.id)
    retried = await tenant.job_retry(job.id)
    assert retried.status is Status.PENDING and retried.attempt == 0


async def test_queues_and_stats(tenant: Client) -> None:
    await tenant.enqueue("x", queue="stats-a")
    await tenant.enqueue("x", queue="stats-a")
    await tenant.enqueue("x", queue="stats-b", delay_secs=100)
    names = [q.queue for q in await tenant.queues()]
    assert "stats-a" in names and "stats-b" in names
    a = await tenant.queue_stats("stats-a")
    assert a.counts["pending"] == 2 and a.oldest_ready_at is not None
    b = await tenant.queue_stats("stats-b")
    assert b.oldest_ready_at is None and b.next_available_at is not None



async def test_pause_resume_bulk_and_workers(tenant: Client, worker: Client) -> None:
    jobs = await tenant.enqueue_many([{"kind": kind, "queue": "ops"} for kind in ("x", "x", "y")])
    paused = await tenant.queue_pause("ops")
    assert paused.paused and paused.counts["pending"] == 3
    assert (await tenant.queue_stats("ops")).paused
    assert await worker.lease("ops", max_jobs=3) == []
    assert not (await tenant.queue_resume("ops")).paused
    (held,) = await worker.lease("ops", worker_id="w-ops")
    (seen,) = await tenant.workers()
    assert (seen.worker_id, seen.jobs, seen.queues) == ("w-ops", 1, ("ops",))
    assert 0 <= (seen.last_seen_at - held.job.updated_at).total_seconds() < 1  # the claim, or the lease call just after it

    assert await tenant.jobs_bulk("cancel", queue="ops", kind="x") == 2  # the running one too
    assert await tenant.jobs_bulk("cancel", queue="ops") == 1
    early = min(job.created_at for job in jobs)
    assert await tenant.jobs_bulk("retry", status="cancelled", created_before=early) == 0
    assert await tenant.jobs_bulk("retry", status=Status.CANCELLED, created_after=early - datetime.timedelta(seconds=1), limit=1) == 1
    assert await tenant.jobs_bulk("delete", queue="ops") == 2
    assert sum((await tenant.queue_stats("ops")).counts.values()) == 1
    assert [(w.worker_id, w.jobs, w.job_ids) for w in await tenant.workers()] == [("w-ops", 0, ())]  # seen, idle
    with pytest.raises(errors.InvalidInput, match="status"):
        await tenant.jobs_bulk("retry", status="pending")  # the server's rule
    assert await tenant.jobs_bulk("cancel", all=True) == 1  # no filter: every pending or running job
    for bad in ({"action": "purge"}, {"action": "cancel", "limit": 0}, {"action": "cancel", "queue": "a b"}, {"action": "cancel"}):
        with pytest.raises(errors.InvalidInput):
            await Client("http://127.0.0.1:1").jobs_bulk(**bad)  # refused before the network


# -- credentials -----------------------------------------------------------------


async def test_credentials_are_checked(server: RunningServer) -> None:
    async with Client(server.url, server.tenants["acme"]) as tenant_client:
        with pytest.raises(errors.Forbidden):
            await tenant_client.lease("q")
    async with Client(server.url, None) as anonymous:
        with pytest.raises(errors.Unauthorized):
            await anonymous.lease("q")
        assert (await anonymous.health())["status"] == "ok"
    async with Client(server.url, "nonsense") as wrong:
        with pytest.raises(errors.Unauthorized):
            await wrong.job_get("x")
    async with Client(server.url, server.worker_token) as worker_client:
        with pytest.raises(errors.Forbidden):
            await worker_client.enqueue("x")


# -- the worker protocol ---------------------------------------------------------


async def test_lease_heartbeat_complete(tenant: Client, worker: Client) -> None:
    job = await tenant.enqueue("x", {"n": 1}, queue="proto")
    (lease,) = await worker.lease("proto", lease_secs=30, worker_id="w-1")
    assert lease.job.id == job.id and lease.job.status is Status.RUNNING
    assert lease.job.attempt == 1 and lease.job.worker_id == "w-1"
    status, locked_until = await worker.heartbeat(job.id, lease.lease_token, 60)
    assert status == "running" and locked_until is not None and locked_until > lease.job.locked_until
    await worker.complete(job.id, lease.lease_token, {"ok": True})
    await worker.complete(job.id, lease.lease_token, {"ok": True})  # replay: 204 again
    done = await tenant.job_get(job.id)
    assert done.status is Status.COMPLETED and done.result == {"ok": True}
    status, locked_until = await worker.heartbeat(job.id, lease.lease_token, 60)
    assert (status, locked_until) == ("completed", None)


async def test_stale_token_is_a_conflict(tenant: Client, worker: Client) -> None:
    job = await tenant.enqueue("x", queue="proto")
    await worker.lease("proto")
    with pytest.raises(errors.Conflict):
        await worker.heartbeat(job.id, "not-the-token", 10)
    with pytest.raises(errors.Conflict):
        await worker.complete(job.id, "not-the-token")
    with pytest.raises(errors.NotFound):
        await worker.fail("00000000-0000-0000-0000-000000000000", "t", "boom")


async def test_fail_retryable_and_permanent(tenant: Client, worker: Client) -> None:
    a = await tenant.enqueue("x", queue="fails")
    b = await tenant.enqueue("x", queue="fails")
    leases = {lease.job.id: lease for lease in await worker.lease("fails", max_jobs=2)}
    await worker.fail(a.id, leases[a.id].lease_token, "try again")
    await worker.fail(b.id, leases[b.id].lease_token, "never", retryable=False)
    a2, b2 = await tenant.job_get(a.id), await tenant.job_get(b.id)
    assert a2.status is Status.PENDING and a2.error == "try again" and a2.scheduled_at > a2.created_at
    assert b2.status is Status.FAILED and b2.errors[0].error == "never"


async def test_cancelled_job_heartbeat_says_so(tenant: Client, worker: Client) -> None:
    job = await tenant.enqueue("x", queue="proto")
    (lease,) = await worker.lease("proto")
    await tenant.job_cancel(job.id)
    assert await worker.heartbeat(job.id, lease.lease_token, 10) == ("cancelled", None)
    with pytest.raises(errors.Conflict):
        await worker.complete(job.id, lease.lease_token)


async def test_long_poll_wakes_on_enqueue_and_outlasts_the_client_timeout(
    server: RunningServer, tenant: Client
) -> None:
    async with Client(server.url, server.worker_token, timeout=0.5) as impatient:
        # wait_secs beyond the client's timeout: the lease call allows for it.
        assert await impatient.lease("poll", wait_secs=1) == []

        async def enqueue_soon() -> None:
            await trio.sleep(0.3)
            await tenant.enqueue("x", queue="poll")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(enqueue_soon)
            start = trio.current_time()
            (lease,) = await impatient.lease("poll", wait_secs=10)
            assert trio.current_time() - start < 2
        assert lease.job.queue == "poll"


async def test_batch_routes(tenant: Client, worker: Client) -> None:
    jobs = await tenant.enqueue_many([{"kind": "x", "queue": "batch"} for _ in range(4)])
    leases = {lease.job.id: lease for lease in await worker.lease("batch", max_jobs=4, lease_secs=30)}
    a, b, c, d = (leases[j.id] for j in jobs)
    unknown = "00000000-0000-0000-0000-000000000000"

    beats = await worker.heartbeat_many(
        [
            HeartbeatItem(a.job.id, a.lease_token, 60),
            HeartbeatItem(b.job.id, "stale", 60),
            HeartbeatItem(unknown, "t", 60),
        ]
    )
    assert [(r.job_id, r.outcome) for r in beats] == [
        (a.job.id, Outcome.OK), (b.job.id, Outcome.CONFLICT), (unknown, Outcome.NOT_FOUND)
    ]
    assert beats[0].status == "running" and beats[0].locked_until is not None

    done = await worker.complete_many(
        [CompleteItem(a.job.id, a.lease_token, {"n": 1}), CompleteItem(b.job.id, "stale", {})]
    )
    assert [r.outcome for r in done] == [Outcome.OK, Outcome.CONFLICT]
    failed = await worker.fail_many(
        [FailItem(c.job.id, c.lease_token, "again"), FailItem(d.job.id, d.lease_token, "never", retryable=False)]
    )
    assert [r.outcome for r in failed] == [Outcome.OK, Outcome.OK]
    states = [(await tenant.job_get(j.id)).status for j in jobs]
    assert states == [Status.COMPLETED, Status.RUNNING, Status.PENDING, Status.FAILED]


# -- asyncio ---------------------------------------------------------------------


def docs_asyncio_example() -> dict[str, Any]:
    """The names the asyncio example of docs/client.md defines, run as written."""
    section = (ROOT / "docs" / "client.md").read_text().split("\n## asyncio\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match
    names: dict[str, Any] = {"__name__": "docs_client_asyncio"}
    exec(compile(match[1], "docs/client.md", "exec"), names)
    return names


async def test_the_asyncio_example_enqueues_concurrently(server: RunningServer, tenant: Client) -> None:
    enqueue_thumbnails = docs_asyncio_example()["enqueue_thumbnails"]
    sources = [f"{n}.png" for n in range(20)]
    jobs = await trio.to_thread.run_sync(
        lambda: asyncio.run(enqueue_thumbnails(server.url, server.tenants["acme"], sources))
    )
    assert [job.payload["src"] for job in jobs] == sources
    assert [await tenant.job_get(job.id) for job in jobs] == jobs


async def dripping(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
    """A scripted server's answer whose every byte comes well within a read
    timeout, and the whole of it after 100 s."""
    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10000\r\n\r\n")
    for _ in range(10000):
        await stream.send_all(b" ")
        await trio.sleep(0.01)
    return False


async def test_under_asyncio_errors_and_timeouts_are_as_on_trio(server: RunningServer, nursery: trio.Nursery) -> None:
    slow_url = (await start(nursery, dripping)).url

    async def main() -> None:
        async with Client(server.url, server.tenants["acme"], timeout=5) as client:
            with pytest.raises(errors.NotFound) as not_found:
                await client.job_get("00000000-0000-0000-0000-000000000000")
            assert (not_found.value.status_code, not_found.value.code) == (404, "not_found")
            job = await client.enqueue("x")
            await client.job_cancel(job.id)
            with pytest.raises(errors.Conflict) as conflict:
                await client.job_cancel(job.id)
            assert conflict.value.status_code == 409
            with pytest.raises(errors.InvalidInput, match="limit"):
                await client.jobs_list(limit=5000)
        async with Client(slow_url, timeout=0.5) as slow:
            # The timeout bounds the whole call, however steadily the bytes come.
            with pytest.raises(errors.TransportError, match="timed out"):
                await slow.health()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):  # the caller's own bound ends the call too
                    await slow.health()

    await trio.to_thread.run_sync(lambda: asyncio.run(main()))
    nursery.cancel_scope.cancel()


# -- transport errors --------------------------------------------------------------


async def test_unreachable_server_is_a_transport_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with Client(f"http://127.0.0.1:{port}", "t", timeout=2) as client:
        with pytest.raises(errors.TransportError, match="127.0.0.1"):
            await client.health()


async def test_silent_server_times_out_as_transport_error(nursery: trio.Nursery) -> None:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, _silent, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    async with Client(f"http://127.0.0.1:{port}", "t", timeout=0.3) as client:
        with pytest.raises(errors.TransportError, match="timed out"):
            await client.heartbeat("j", "t", 10)
    nursery.cancel_scope.cancel()


async def _silent(stream: trio.SocketStream) -> None:
    async with stream:
        await trio.sleep(5)


async def test_error_answers_that_are_not_json(nursery: trio.Nursery) -> None:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, _bad_gateway, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    async with Client(f"http://127.0.0.1:{port}", "t", timeout=2) as client:
        with pytest.raises(errors.ApiError) as info:
            await client.health()
    assert info.value.status_code == 502 and "upstream" in info.value.message
    nursery.cancel_scope.cancel()


async def _bad_gateway(stream: trio.SocketStream) -> None:
    async with stream:
        await stream.receive_some(65536)
        body = b"upstream went away"
        await stream.send_all(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )


def test_importing_qftrio_does_not_import_httpx() -> None:
    # httpx is only for proxies, caller-supplied transports and asyncio
    # callers: its 90 ms of import stay out of every worker's start-up.
    code = "import sys, qftrio, qftrio.worker.process; print('httpx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
