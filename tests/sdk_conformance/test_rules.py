"""The runtime rules (DESIGN §9, last bullet), one scenario each, run against
every runtime through its adapter (ADAPTER.md), over real HTTP to a real
``qftrio serve``. Where a rule is about what goes over the wire, the adapter
talks to the server through a :class:`~.proxy.Proxy` that records it.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from qftrio import Client
from qftrio.models import Status

from .conftest import TENANT_TOKEN, WORKER_TOKEN, Adapter, Server, wait_job
from ..proxy import Proxy, Seen

pytestmark = pytest.mark.slow

REPORTS = ("complete", "fail", "snooze")


@pytest.fixture
async def proxy(server: Server, nursery: trio.Nursery) -> AsyncIterator[tuple[Proxy, str]]:
    """A recording proxy in front of the runtime's server, and its URL."""
    p = Proxy(server.port)
    url = await nursery.start(p.run)
    yield p, url


def items(seen: Seen, job_id: str) -> list[tuple[dict[str, Any], int | None]]:
    """The items of *seen* (a batch or a single-job call) about *job_id*,
    each with the code the worker got for it (None when it got no answer)."""
    body = json.loads(seen.body or b"{}")
    status = None if seen.dropped else seen.status
    if f"/jobs/{job_id}/" in seen.target:
        return [(body, status)]
    found = []
    answers = json.loads(seen.answer).get("results", []) if status == 200 and seen.answer else []
    for i, item in enumerate(body.get("items", [])):
        if item.get("id") == job_id:
            found.append((item, answers[i]["code"] if i < len(answers) else None))
    return found


def calls(proxy: Proxy, what: str | tuple[str, ...], job_id: str) -> list[tuple[Seen, dict[str, Any], int | None]]:
    """Every *what* call (``heartbeat``, ``complete``...) proxy saw about *job_id*."""
    whats = (what,) if isinstance(what, str) else what
    return [
        (seen, item, code)
        for seen in proxy.seen
        if seen.target.rsplit("/", 1)[-1] in whats
        for item, code in items(seen, job_id)
    ]


def lease_requests(proxy: Proxy) -> list[dict[str, Any]]:
    return [json.loads(s.body) for s in proxy.seen if s.target.endswith("/lease")]


def most_at_once(adapter: Adapter) -> int:
    """The most handlers the adapter ran at once, from its lines in order."""
    running: set[str] = set()
    most = 0
    for event in adapter.events:
        if event["event"] == "started":
            running.add(event["job"])
            most = max(most, len(running))
        elif event["event"] in ("returned", "aborted"):
            running.discard(event["job"])
    return most


# -- lanes and heartbeats --------------------------------------------------


async def test_lanes_bound_the_handlers_and_a_lease_asks_only_for_free_lanes(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("lanes")
    jobs = [await api.enqueue("sleep", {"secs": 60}, queue=queue) for _ in range(4)]

    def started() -> list[str]:
        return [e["job"] for e in adapter.find("started")]

    async def two_heartbeat_rounds() -> None:
        beats = len([s for s in p.seen if s.target.endswith("heartbeat")])
        await p.wait_for(lambda: len([s for s in p.seen if s.target.endswith("heartbeat")]) >= beats + 2)

    async with adapters(url, queue, lanes=2, lease_secs=2) as adapter:
        await adapter.until(lambda: len(started()) == 2, what="two handlers started")
        # Both lanes busy: two rounds of heartbeats later, nothing more was leased.
        await two_heartbeat_rounds()
        assert [(await api.job_get(j.id)).status for j in jobs if j.id not in started()] == [Status.PENDING] * 2
        # One lane free: one job more, and no other.
        first = started()[0]
        await api.job_cancel(first)
        await adapter.until(lambda: len(started()) == 3, what="a third handler started")
        await two_heartbeat_rounds()
        (last,) = [j for j in jobs if j.id not in started()]
        assert (await api.job_get(last.id)).status is Status.PENDING, "leased more than the free lanes"
        for job_id in started()[1:]:
            await api.job_cancel(job_id)
        await adapter.wait("started", job=last.id)
        await api.job_cancel(last.id)
        for job in jobs:
            await adapter.wait("aborted", job=job.id)
    assert most_at_once(adapter) == 2, adapter.events
    asked = [r.get("max_jobs", 1) for r in lease_requests(p)]
    assert asked and max(asked) <= 2, asked


async def test_one_heartbeat_batch_keeps_every_held_job_past_its_lease(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("beats")
    jobs = [await api.enqueue("sleep", {"secs": 60}, queue=queue) for _ in range(3)]
    ids = {j.id for j in jobs}

    def batches() -> int:
        return len([s for s in p.seen if s.target.endswith("/leases/heartbeat") and ids <= set(_job_ids(s))])

    async with adapters(url, queue, lanes=3, lease_secs=2) as adapter:
        for job in jobs:
            await adapter.wait("started", job=job.id)
        # three rounds, every lease_secs/2: past the 2 s lease of each job
        await p.wait_for(lambda: batches() >= 3)
        for job in jobs:
            after = await api.job_get(job.id)
            assert after.status is Status.RUNNING and after.attempt == 1 and after.errors == ()
            await api.job_cancel(job.id)
        for job in jobs:
            await adapter.wait("aborted", job=job.id)


def _job_ids(seen: Seen) -> list[str]:
    return [item.get("id") for item in json.loads(seen.body or b"{}").get("items", [])]


# -- jobs the worker no longer owns ---------------------------------------


async def test_a_cancelled_job_aborts_its_handler_and_nothing_is_reported(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("cancel")
    job = await api.enqueue("sleep", {"secs": 60}, queue=queue)
    async with adapters(url, queue, lease_secs=2) as adapter:
        await adapter.wait("started", job=job.id)
        await api.job_cancel(job.id)
        await adapter.wait("aborted", job=job.id, timeout=5)  # within a heartbeat (lease_secs/2) and then some
        # the worker goes on: a job enqueued next is run
        after = await api.enqueue("echo", {"n": 1}, queue=queue)
        await wait_job(api, after.id, lambda j: j.status is Status.COMPLETED, what="the next job done")
    assert not adapter.find("returned", job=job.id)
    assert calls(p, REPORTS, job.id) == []
    assert (await api.job_get(job.id)).status is Status.CANCELLED


async def test_a_409_aborts_the_handler_and_nothing_is_reported(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("stale")
    job = await api.enqueue("sleep", {"secs": 60}, queue=queue)
    async with adapters(url, queue, lease_secs=2) as adapter, Client(server.url, WORKER_TOKEN, timeout=10) as thief:
        await adapter.wait("started", job=job.id)
        await p.wait_for(lambda: any(code == 200 for _, _, code in calls(p, "heartbeat", job.id)))
        # Between two heartbeats, the job is claimed again by someone else:
        # the worker's token is no longer current. Its heartbeats wait
        # meanwhile, so that the next one is answered 409.
        p.refuse = lambda target, body: target.endswith("heartbeat")
        await api.job_cancel(job.id)
        await api.job_retry(job.id)
        (stolen,) = await thief.lease(queue, max_jobs=1, lease_secs=60, wait_secs=5, worker_id="someone-else")
        p.refuse = lambda target, body: False
        await adapter.wait("aborted", job=job.id, timeout=5)
        await p.wait_for(lambda: any(code == 409 for _, _, code in calls(p, "heartbeat", job.id)))
        await thief.complete(job.id, stolen.lease_token, {"by": "someone-else"})
    assert not adapter.find("returned", job=job.id)
    assert calls(p, REPORTS, job.id) == []
    done = await api.job_get(job.id)
    assert done.status is Status.COMPLETED and done.result == {"by": "someone-else"}


async def test_a_lease_about_to_end_aborts_the_handler_and_fails_retryably(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("ending")
    job = await api.enqueue("sleep", {"secs": 60}, queue=queue, max_attempts=3)
    p.refuse = lambda target, body: target.endswith("heartbeat")  # no heartbeat lands
    async with adapters(url, queue, lease_secs=2) as adapter:
        await adapter.wait("started", job=job.id)
        await adapter.wait("aborted", job=job.id, timeout=5)
        await p.wait_for(lambda: bool(calls(p, "fail", job.id)))
        failed = await wait_job(api, job.id, lambda j: j.status is not Status.RUNNING, what="the attempt ended")
    assert not adapter.find("returned", job=job.id)
    fails = calls(p, "fail", job.id)
    assert all(item.get("retryable", True) is True for _, item, _ in fails), fails
    assert any(code == 204 for _, _, code in fails), f"the fail did not land in the lease: {fails}"
    assert calls(p, "complete", job.id) == []
    assert failed.status is Status.PENDING and failed.attempt == 1
    assert failed.errors[0].error == fails[0][1]["error"] != "lease expired"


async def test_a_killed_workers_job_runs_again_after_its_lease(server, api, adapters) -> None:
    queue = server.queue("kill9")
    job = await api.enqueue("sleep", {"secs": 0.5}, queue=queue)
    async with adapters(server.url, queue, lease_secs=2) as first:
        await first.wait("started", job=job.id, attempt=1)
        first.signal(signal.SIGKILL)
        await first.wait_exit()
    async with adapters(server.url, queue, lease_secs=2) as second:
        await second.wait("started", job=job.id, attempt=2)
        done = await wait_job(api, job.id, lambda j: j.status is Status.COMPLETED, what="the job done")
    assert done.attempt == 2 and done.result == {"slept": 0.5}
    assert done.errors[0].error == "lease expired"


# -- stopping --------------------------------------------------------------


async def test_the_first_signal_drains(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("drain")
    held = await api.enqueue("sleep", {"secs": 1}, queue=queue)
    later = await api.enqueue("echo", {}, queue=queue)
    async with adapters(url, queue, lanes=1, lease_secs=2) as adapter:
        await adapter.wait("started", job=held.id)
        adapter.signal(signal.SIGTERM)
        stopped = await adapter.wait("stopped")
        assert await adapter.wait_exit() == 0
    assert stopped["error"] is None
    assert adapter.find("returned", job=held.id)
    assert (await api.job_get(held.id)).status is Status.COMPLETED  # finished and reported
    assert not adapter.find("started", job=later.id)
    assert (await api.job_get(later.id)).status is Status.PENDING  # nothing new leased


async def test_a_second_signal_quits_at_once(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("quit")
    job = await api.enqueue("sleep", {"secs": 60}, queue=queue)
    async with adapters(url, queue, lease_secs=2) as adapter:
        await adapter.wait("started", job=job.id)
        adapter.signal(signal.SIGTERM)
        # A second signal of another kind, again until it quits: a runtime
        # may coalesce signals that arrive together.
        with trio.fail_after(10):
            while adapter.proc.poll() is None:
                adapter.signal(signal.SIGINT)
                with trio.move_on_after(0.25):
                    await adapter.proc.wait()
        code = await adapter.wait_exit()
    assert code != 0
    assert not adapter.find("returned", job=job.id)
    assert calls(p, REPORTS, job.id) == []
    after = await api.job_get(job.id)
    assert after.status is Status.RUNNING and after.result is None  # its lease will expire
    await api.job_cancel(job.id)


@pytest.mark.parametrize("token, status", [("not-a-token", "401"), (TENANT_TOKEN, "403")])
async def test_a_refused_credential_stops_the_worker(server, adapters, token, status) -> None:
    async with adapters(server.url, server.queue("refused"), token=token) as adapter:
        stopped = await adapter.wait("stopped")
        code = await adapter.wait_exit()
    assert code != 0
    assert stopped["error"] and status in stopped["error"], stopped


# -- a network that fails ---------------------------------------------------


async def test_transport_errors_back_off_and_the_worker_survives(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("down")
    async with adapters(url, queue, lease_secs=2, wait_secs=1) as adapter:
        first = await api.enqueue("echo", {"n": 1}, queue=queue)
        await wait_job(api, first.id, lambda j: j.status is Status.COMPLETED, what="the first job done")
        p.down = True
        tried = len(p.attempts)
        await p.wait_for(lambda: len(p.attempts) >= tried + 4)
        gaps = p.attempts[tried + 3] - p.attempts[tried]
        p.down = False
        second = await api.enqueue("echo", {"n": 2}, queue=queue)
        done = await wait_job(api, second.id, lambda j: j.status is Status.COMPLETED, what="a job after the outage")
        assert not adapter.find("stopped") and adapter.proc.poll() is None
    # Without back-off, four attempts take milliseconds.
    assert gaps >= 0.5, p.attempts[tried:]
    assert done.result == {"echo": {"n": 2}}


async def test_a_report_whose_answer_is_lost_is_sent_again(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("lost-answer")
    job = await api.enqueue("echo", {"n": 3}, queue=queue)
    p.drop = lambda target, body, answer: target.endswith("complete") and job.id.encode() in body and len(
        [s for s in p.seen if s.dropped]) < 2  # fmt: skip
    async with adapters(url, queue, lease_secs=3) as adapter:
        await adapter.wait("returned", job=job.id)
        # two answers lost, then one that comes
        await p.wait_for(lambda: [code for _, _, code in calls(p, "complete", job.id)][2:3] == [204])
    sent = calls(p, "complete", job.id)
    assert len({item["lease_token"] for _, item, _ in sent}) == 1  # the same report, again
    assert sent[-1][2] == 204
    done = await api.job_get(job.id)
    assert done.status is Status.COMPLETED and done.attempt == 1 and done.result == {"echo": {"n": 3}}


async def test_reports_are_given_up_when_the_lease_ends(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("given-up")
    job = await api.enqueue("echo", {"n": 4}, queue=queue)
    tokens: list[str] = []

    def first_attempts(target: str, body: bytes) -> bool:
        if not target.endswith("complete") or job.id.encode() not in body:
            return False
        token = next(item for item, _ in _items_of(body, job.id))["lease_token"]
        tokens.append(token)
        return token == tokens[0]

    p.refuse = first_attempts
    async with adapters(url, queue, lease_secs=2) as adapter:
        await adapter.wait("started", job=job.id, attempt=2)
        done = await wait_job(api, job.id, lambda j: j.status is Status.COMPLETED, what="the second attempt done")
    first = [seen for seen, item, _ in calls(p, "complete", job.id) if item["lease_token"] == tokens[0]]
    assert len(first) >= 2, "the first attempt's report was not retried"
    relet = [s for s in p.seen if s.target.endswith("/lease") and job.id.encode() in s.answer][-1]
    assert relet.answered_at is not None
    assert all(seen.at < relet.answered_at for seen in first), "a report was sent after its lease ended"
    assert done.attempt == 2 and done.errors[0].error == "lease expired"


def _items_of(body: bytes, job_id: str) -> list[tuple[dict[str, Any], None]]:
    data = json.loads(body)
    return [(item, None) for item in data.get("items", [data]) if item.get("id", job_id) == job_id]


# -- what a handler does --------------------------------------------------


async def test_timeout_secs_aborts_the_handler_and_fails_with_the_servers_error(server, api, proxy, adapters) -> None:
    p, url = proxy
    queue = server.queue("timeout")
    job = await api.enqueue("sleep", {"secs": 60}, queue=queue, timeout_secs=1, max_attempts=1)
    async with adapters(url, queue, lease_secs=3) as adapter:
        await adapter.wait("started", job=job.id)
        await adapter.wait("aborted", job=job.id, timeout=10)
        failed = await wait_job(api, job.id, lambda j: j.status is Status.FAILED, what="the job failed")
        await p.wait_for(lambda: bool(calls(p, "fail", job.id)))
    assert failed.error == "timed out after 1 s" and failed.attempt == 1
    assert [item["error"] for _, item, _ in calls(p, "fail", job.id)][:1] == ["timed out after 1 s"]
    assert not adapter.find("returned", job=job.id)


async def test_errors_fail_retryably_and_a_permanent_error_at_once(server, api, adapters) -> None:
    queue = server.queue("errors")
    flaky = await api.enqueue("fail", {"message": "disk full"}, queue=queue, max_attempts=3)
    bad = await api.enqueue("permanent", {"message": "no such image"}, queue=queue, max_attempts=3)
    async with adapters(server.url, queue, lanes=2) as adapter:
        retried = await wait_job(api, flaky.id, lambda j: len(j.errors) >= 1, what="the first attempt failed")
        dead = await wait_job(api, bad.id, lambda j: j.status is Status.FAILED, what="the permanent error")
        await adapter.wait("returned", job=bad.id)
    assert "disk full" in (retried.errors[0].error or "") and retried.status in (Status.PENDING, Status.RUNNING)
    assert dead.attempt == 1 and "no such image" in (dead.error or "")


async def test_snooze_puts_the_job_back_without_using_its_attempt(server, api, adapters) -> None:
    queue = server.queue("snooze")
    job = await api.enqueue("snooze", {"secs": 60}, queue=queue, max_attempts=2)
    async with adapters(server.url, queue) as adapter:
        await adapter.wait("returned", job=job.id)
        snoozed = await wait_job(api, job.id, lambda j: j.status is Status.PENDING, what="the job snoozed")
    assert snoozed.attempt == 1 and snoozed.max_attempts == 3 and snoozed.errors == ()
    assert 50 <= snoozed.scheduled_at.timestamp() - time.time() <= 61
    await api.job_cancel(job.id)


async def test_retry_in_fails_the_attempt_with_its_delay(server, api, adapters) -> None:
    queue = server.queue("retry-in")
    job = await api.enqueue("retry_in", {"secs": 60, "message": "upstream busy"}, queue=queue, max_attempts=3)
    async with adapters(server.url, queue) as adapter:
        await adapter.wait("returned", job=job.id)
        failed = await wait_job(api, job.id, lambda j: j.status is Status.PENDING and j.attempt == 1, what="the retry")
    assert failed.max_attempts == 3 and "upstream busy" in (failed.errors[0].error or "")
    assert 50 <= failed.scheduled_at.timestamp() - time.time() <= 61  # its delay, not the backoff's
    await api.job_cancel(job.id)


async def test_an_unknown_kind_fails_permanently(server, api, adapters) -> None:
    queue = server.queue("unknown")
    job = await api.enqueue("unregistered", {}, queue=queue, max_attempts=5)
    async with adapters(server.url, queue) as adapter:
        failed = await wait_job(api, job.id, lambda j: j.status is Status.FAILED, what="the job failed")
    assert failed.attempt == 1 and "unregistered" in (failed.error or "")
    assert not adapter.find("started", job=job.id)


async def test_progress_reaches_the_server(server, api, adapters) -> None:
    queue = server.queue("progress")
    job = await api.enqueue("progress", {"progress": {"done": 3, "of": 10}, "then_secs": 60}, queue=queue)
    async with adapters(server.url, queue, lease_secs=2) as adapter:
        await adapter.wait("started", job=job.id)
        seen = await wait_job(api, job.id, lambda j: j.last_progress is not None, what="the job's progress")
        assert seen.last_progress == {"done": 3, "of": 10} and seen.progress_at is not None
        await api.job_cancel(job.id)
        await adapter.wait("aborted", job=job.id)


async def test_trace_headers_reach_the_handler(server, api, adapters) -> None:
    queue = server.queue("trace")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"
    job = await api.enqueue("headers", {}, queue=queue, headers={"traceparent": traceparent, "x-tenant": "acme"})
    async with adapters(server.url, queue) as adapter:
        started = await adapter.wait("started", job=job.id)
        done = await wait_job(api, job.id, lambda j: j.status is Status.COMPLETED, what="the job done")
    seen = done.result["headers"]  # type: ignore[index]
    assert started["headers"] == seen
    assert seen["traceparent"].split("-")[1] == trace_id  # the same trace, continued
    assert seen["x-tenant"] == "acme"
