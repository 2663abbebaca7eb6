"""``qftrio.SyncClient`` against a real server over real HTTP (the ``server``
fixture of conftest: every backend available), called from threads as
Django and Flask views call it; and the Flask example, through Flask's test
client, against the same server.

The tests run in Trio, beside the server: every blocking call goes to a
thread (``trio.to_thread.run_sync``), so the server keeps serving.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import functools
import importlib.util
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

import qftrio
from qftrio import errors
from qftrio.client import CompleteItem, FailItem, HeartbeatItem
from qftrio.models import Outcome, Status, WorkflowStatus

from .conftest import RunningServer
from .test_client import dripping
from .test_http_client import ScriptedServer, answer, certificate, echo, start
from .test_workflows import DIAMOND

ROOT = Path(__file__).resolve().parent.parent
UNKNOWN = "00000000-0000-0000-0000-000000000000"

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """*fn* run in a thread of its own, as a web server's thread would."""
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


@pytest.fixture
def tenant(server: RunningServer) -> Iterator[qftrio.SyncClient]:
    with qftrio.SyncClient(server.url, server.tenants["acme"], timeout=5) as client:
        yield client


@pytest.fixture
def worker(server: RunningServer) -> Iterator[qftrio.SyncClient]:
    with qftrio.SyncClient(server.url, server.worker_token, timeout=5) as client:
        yield client


# -- every call ---------------------------------------------------------------------


async def test_the_application_api(tenant: qftrio.SyncClient) -> None:
    def calls() -> None:
        assert tenant.health()["status"] == "ok"
        job = tenant.enqueue("resize-image", {"src": "a.png"}, queue="images", priority=3, max_attempts=2)
        assert (job.kind, job.queue, job.priority, job.max_attempts) == ("resize-image", "images", 3, 2)
        assert job.status is Status.PENDING and job.payload == {"src": "a.png"}
        assert tenant.job_get(job.id) == job
        assert tenant.enqueue("other", {"x": 1}, idempotency_key="k", queue="images").id == (
            tenant.enqueue("other", idempotency_key="k", queue="images").id
        )
        later = job.created_at + datetime.timedelta(hours=1)
        scheduled = tenant.enqueue("later", scheduled_at=later, queue="images")
        assert scheduled.scheduled_at == later

        batch = tenant.enqueue_many(
            [{"kind": "a", "payload": {"n": 1}, "config": {"queue": "q1"}}, {"kind": "b", "queue": "images"}]
        )
        assert [(j.kind, j.queue) for j in batch] == [("a", "q1"), ("b", "images")]

        seen: list[str] = []
        cursor = None
        while True:
            page, cursor = tenant.jobs_list(queue="images", limit=2, cursor=cursor)
            seen += [j.id for j in page]
            if cursor is None:
                break
        assert len(seen) == 4 and seen[-1] == job.id
        pending, _ = tenant.jobs_list(queue="images", status=Status.PENDING, kind="resize-image")
        assert [j.id for j in pending] == [job.id]

        assert tenant.job_cancel(job.id).status is Status.CANCELLED
        assert tenant.job_retry(job.id).status is Status.PENDING

        assert {"images", "q1"} <= {q.queue for q in tenant.queues()}
        assert tenant.queue_stats("images").counts["pending"] == 4
        assert tenant.queue_pause("images").paused and tenant.queue_stats("images").paused
        assert not tenant.queue_resume("images").paused
        assert tenant.jobs_bulk("cancel", queue="images", kind="other") == 1
        assert tenant.jobs_bulk("delete", queue="images", status="cancelled") == 1
        assert tenant.workers() == []

    await in_thread(calls)


async def test_the_worker_protocol(tenant: qftrio.SyncClient, worker: qftrio.SyncClient) -> None:
    def calls() -> None:
        jobs = tenant.enqueue_many([{"kind": "x", "queue": "proto"} for _ in range(5)])
        leases = {lease.job.id: lease for lease in worker.lease("proto", max_jobs=5, lease_secs=30, worker_id="w-1")}
        a, b, c, d, e = (leases[j.id] for j in jobs)
        assert a.job.status is Status.RUNNING and a.job.worker_id == "w-1"
        assert [(w.worker_id, w.jobs) for w in tenant.workers()] == [("w-1", 5)]

        status, locked_until = worker.heartbeat(a.job.id, a.lease_token, 60)
        assert status == "running" and locked_until is not None and locked_until > a.job.locked_until
        worker.complete(a.job.id, a.lease_token, {"ok": True})
        worker.fail(b.job.id, b.lease_token, "never", retryable=False)

        beats = worker.heartbeat_many([HeartbeatItem(c.job.id, c.lease_token, 60), HeartbeatItem(UNKNOWN, "t", 60)])
        assert [(r.job_id, r.outcome) for r in beats] == [(c.job.id, Outcome.OK), (UNKNOWN, Outcome.NOT_FOUND)]
        done = worker.complete_many([CompleteItem(c.job.id, c.lease_token, {"n": 1}), CompleteItem(d.job.id, "stale")])
        assert [r.outcome for r in done] == [Outcome.OK, Outcome.CONFLICT]
        failed = worker.fail_many([FailItem(d.job.id, d.lease_token, "again"), FailItem(e.job.id, e.lease_token, "x")])
        assert [r.outcome for r in failed] == [Outcome.OK, Outcome.OK]

        states = [tenant.job_get(j.id).status for j in jobs]
        assert states == [Status.COMPLETED, Status.FAILED, Status.COMPLETED, Status.PENDING, Status.PENDING]
        assert tenant.job_get(a.job.id).result == {"ok": True}

    await in_thread(calls)


async def test_a_long_poll_outlasts_the_timeout_and_wakes_on_enqueue(
    server: RunningServer, tenant: qftrio.SyncClient
) -> None:
    with qftrio.SyncClient(server.url, server.worker_token, timeout=0.5) as impatient:
        assert await in_thread(impatient.lease, "poll", wait_secs=1) == []
        async with trio.open_nursery() as nursery:
            leased: list[qftrio.Lease] = []

            async def poll() -> None:
                leased.extend(await in_thread(impatient.lease, "poll", wait_secs=30))

            nursery.start_soon(poll)
            await trio.sleep(0.2)  # the poll is (most likely) parked; if not, it finds the job at once
            job = await in_thread(tenant.enqueue, "x", queue="poll")
        assert [lease.job.id for lease in leased] == [job.id]


async def test_workflows(tenant: qftrio.SyncClient) -> None:
    def calls() -> None:
        wf = tenant.workflow_create("via-sync-client", DIAMOND, context={"x": 1})
        assert wf.status is WorkflowStatus.RUNNING and wf.context == {"x": 1}
        assert tenant.workflow_get(wf.id) == wf
        listed, cursor = tenant.workflows_list(status="running", limit=10)
        assert [w.id for w in listed] == [wf.id] and cursor is None
        assert tenant.workflow_cancel(wf.id).status is WorkflowStatus.CANCELLED

    await in_thread(calls)


# -- errors ---------------------------------------------------------------------------


async def test_error_answers_carry_status_and_code(server: RunningServer, tenant: qftrio.SyncClient) -> None:
    def calls() -> None:
        with pytest.raises(errors.NotFound) as not_found:
            tenant.job_get(UNKNOWN)
        assert (not_found.value.status_code, not_found.value.code) == (404, "not_found")

        job = tenant.enqueue("x")
        tenant.job_cancel(job.id)
        with pytest.raises(errors.Conflict) as conflict:
            tenant.job_cancel(job.id)
        assert (conflict.value.status_code, conflict.value.code) == (409, "conflict")

        with pytest.raises(errors.InvalidInput) as invalid:
            tenant.jobs_list(limit=5000)  # the server's rule
        assert (invalid.value.status_code, invalid.value.code) == (422, "invalid") and "limit" in invalid.value.message

        with pytest.raises(errors.Forbidden):
            tenant.lease("q")
        with qftrio.SyncClient(server.url, "nonsense") as wrong, pytest.raises(errors.Unauthorized):
            wrong.job_get(job.id)

    await in_thread(calls)


async def test_bad_input_is_refused_before_sending(tenant: qftrio.SyncClient) -> None:
    def calls() -> None:
        with pytest.raises(errors.InvalidInput, match="kind"):
            tenant.enqueue("not a kind")
        with pytest.raises(errors.InvalidInput, match="payload.ratio: nan is not a JSON number"):
            tenant.enqueue("x", payload={"ratio": float("nan")})
        with pytest.raises(errors.InvalidInput, match="action"):
            tenant.jobs_bulk("purge")
        assert tenant.jobs_list() == ([], None)
        with pytest.raises(errors.NotFound):
            tenant.job_get("../../queues")  # one path segment, never another route

    await in_thread(calls)
    with pytest.raises(errors.ConfigError, match="not a usable server URL"):
        qftrio.SyncClient("ftp://example.com")
    with pytest.raises(errors.ConfigError, match="the token cannot be sent") as info:
        qftrio.SyncClient("http://127.0.0.1:1", "secret\r\nX-Evil: 1")
    assert "secret" not in str(info.value)


async def test_an_unreachable_server_is_a_transport_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with qftrio.SyncClient(f"http://127.0.0.1:{port}", timeout=2) as client:
        with pytest.raises(errors.TransportError, match=f"GET http://127.0.0.1:{port}/healthz: cannot connect"):
            await in_thread(client.health)


async def test_a_silent_or_dripping_server_times_out(nursery: trio.Nursery) -> None:
    async def silent(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        await trio.sleep_forever()
        return False

    for reply in (silent, dripping):
        scripted = await start(nursery, reply)
        with qftrio.SyncClient(scripted.url, timeout=0.5) as client:
            with pytest.raises(errors.TransportError, match="timed out"):
                await in_thread(client.health)
    nursery.cancel_scope.cancel()


async def test_answers_that_are_not_qftrio_s(nursery: trio.Nursery) -> None:
    async def reply(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        if b"/healthz" in head:  # a proxy's own error
            gone = answer(b"upstream went away", "502 Bad Gateway")
            await stream.send_all(gone.replace(b"application/json", b"text/plain"))
        else:
            await stream.send_all(answer(b'{"not": "a job"}'))
        return True

    scripted = await start(nursery, reply)
    with qftrio.SyncClient(scripted.url) as client:
        with pytest.raises(errors.ApiError, match="upstream went away") as info:
            await in_thread(client.health)
        assert info.value.status_code == 502
        with pytest.raises(errors.UnexpectedAnswer, match="GET .*/api/v1/jobs/x: the answer is not qftrio's"):
            await in_thread(client.job_get, "x")
    with qftrio.SyncClient(scripted.url, max_body_size=10) as client:
        with pytest.raises(errors.TransportError, match="larger than 10 bytes"):
            await in_thread(client.job_get, "x")
    nursery.cancel_scope.cancel()


async def test_https_and_proxies(
    nursery: trio.Nursery, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(*certificate)
    scripted = ScriptedServer(echo)
    listeners = await nursery.start(
        functools.partial(trio.serve_ssl_over_tcp, scripted._handle, 0, server_context, host="127.0.0.1")
    )
    url = f"https://127.0.0.1:{listeners[0].transport_listener.socket.getsockname()[1]}"
    # Trusted as the async client trusts it (SSL_CERT_FILE), and checked.
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    with qftrio.SyncClient(url) as client:
        assert await in_thread(client.health) == {"target": "/healthz", "body": ""}
    monkeypatch.delenv("SSL_CERT_FILE")
    with qftrio.SyncClient(url) as client:
        with pytest.raises(errors.TransportError, match="TLS handshake failed"):
            await in_thread(client.health)

    proxy = await start(nursery, echo)  # it sees the absolute URL sent to a proxy
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with qftrio.SyncClient("http://qftrio.invalid:8000") as client:
        assert await in_thread(client.health) == {"target": "http://qftrio.invalid:8000/healthz", "body": ""}
    nursery.cancel_scope.cancel()


async def test_a_transport_of_the_caller_s_own(server: RunningServer) -> None:
    import httpx

    sent: list[str] = []

    class Recording(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            sent.append(f"{request.method} {request.url.path}")
            return super().handle_request(request)

    with qftrio.SyncClient(server.url, server.tenants["acme"], transport=Recording()) as client:
        job = await in_thread(client.enqueue, "x", queue="own")
        assert (await in_thread(client.job_get, job.id)).queue == "own"
    assert sent == ["POST /api/v1/jobs", f"GET /api/v1/jobs/{job.id}"]


# -- threads and closing --------------------------------------------------------------


async def test_one_client_shared_by_many_threads(tenant: qftrio.SyncClient) -> None:
    def view(n: int) -> tuple[str, int]:
        job = tenant.enqueue("from-a-thread", {"n": n}, queue="threads")
        return job.id, tenant.job_get(job.id).payload["n"]

    def many_threads() -> list[tuple[str, int]]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            return list(pool.map(view, range(200)))

    made = await in_thread(many_threads)
    assert [n for _, n in made] == list(range(200))
    assert len({job_id for job_id, _ in made}) == 200
    assert (await in_thread(tenant.queue_stats, "threads")).counts["pending"] == 200


async def test_threads_share_kept_alive_connections_up_to_the_limit(nursery: trio.Nursery) -> None:
    held = 0
    three_at_once = trio.Event()

    async def ok(stream: trio.SocketStream, head: bytes, body: bytes) -> bool:
        # No answer until three calls are in flight at once: calls made one
        # at a time would wait here until their timeout.
        nonlocal held
        held += 1
        if held == 3:
            three_at_once.set()
        await three_at_once.wait()
        await stream.send_all(answer(b'{"status": "ok"}'))
        return True

    scripted: ScriptedServer = await start(nursery, ok)
    with qftrio.SyncClient(scripted.url, max_connections=3, timeout=30) as client:

        def many_threads() -> list[dict[str, Any]]:
            with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
                return list(pool.map(lambda _: client.health(), range(600)))

        assert await in_thread(many_threads) == [{"status": "ok"}] * 600
    assert len(scripted.requests) == 600
    assert scripted.most_open == 3 and scripted.connections == 3  # kept alive, reused, never more
    nursery.cancel_scope.cancel()


async def test_closing(server: RunningServer) -> None:
    client = qftrio.SyncClient(server.url, server.tenants["acme"])
    assert (await in_thread(client.health))["status"] == "ok"
    client.close()
    client.close()  # idempotent
    with pytest.raises(errors.TransportError, match="the client is closed"):
        await in_thread(client.health)
    with qftrio.SyncClient(server.url, server.tenants["acme"]) as scoped:
        await in_thread(scoped.health)
    with pytest.raises(errors.TransportError, match="the client is closed"):
        await in_thread(scoped.enqueue, "x")


async def test_closing_while_other_threads_call(server: RunningServer) -> None:
    client = qftrio.SyncClient(server.url, server.tenants["acme"], max_connections=2, timeout=5)
    calls = threading.Semaphore(0)

    def caller() -> str:
        while True:
            try:
                client.health()
            except errors.TransportError as exc:  # and nothing else, httpx's own errors least of all
                return str(exc)
            calls.release()

    def close_midway() -> list[str]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
            ends = [pool.submit(caller) for _ in range(6)]
            for _ in range(60):
                calls.acquire()
            client.close()
            return [end.result() for end in ends]

    ends = await in_thread(close_midway)
    assert ends == [f"GET {server.url}/healthz: the client is closed"] * 6


def test_methods_match_the_async_client() -> None:
    # Both are made from the same descriptions: the same names, arguments
    # and docs, the one awaitable, the other not.
    import inspect

    names = sorted(set(dir(qftrio.Client)) - set(dir(object)) - {"aclose", "__aenter__", "__aexit__"})
    names = [n for n in names if not n.startswith("_")]
    assert names == [n for n in sorted(dir(qftrio.SyncClient)) if not n.startswith("_") and n != "close"]
    assert len(names) == 42
    async_client = qftrio.Client("http://127.0.0.1:1")
    with qftrio.SyncClient("http://127.0.0.1:1") as sync_client:
        for name in names:
            async_method, sync_method = getattr(async_client, name), getattr(sync_client, name)
            if name == "events":  # a stream: an async iterator, a plain one
                assert inspect.isasyncgenfunction(async_method) and inspect.isgeneratorfunction(sync_method)
                params = inspect.signature(async_method).parameters
                assert params == inspect.signature(sync_method).parameters
                continue
            assert inspect.iscoroutinefunction(async_method) and not inspect.iscoroutinefunction(sync_method)
            assert inspect.signature(async_method) == inspect.signature(sync_method)
            assert async_method.__doc__ == sync_method.__doc__ == getattr(qftrio.Client, name).__doc__


# -- the Flask example ------------------------------------------------------------------


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def doc_blocks(heading: str) -> list[str]:
    """The Python blocks of docs/client.md's section under *heading*."""
    text = (ROOT / "docs" / "client.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


async def test_the_flask_example_enqueues_and_reports(server: RunningServer, tenant: qftrio.SyncClient) -> None:
    app = load_example("flask_app").create_app(server.url, server.tenants["acme"])
    try:
        web = app.test_client()
        made = await in_thread(web.post, "/images", json={"src": "cat.png", "width": 320})
        assert made.status_code == 202
        job_id = made.get_json()["job_id"]
        job = await in_thread(tenant.job_get, job_id)
        assert (job.kind, job.queue, job.payload) == ("resize-image", "images", {"src": "cat.png", "width": 320})
        shown = await in_thread(web.get, f"/images/{job_id}")
        assert shown.status_code == 200
        assert shown.get_json() == {"job_id": job_id, "status": "pending", "result": None, "error": None}

        refused = await in_thread(web.post, "/images", json={"width": 320})
        assert refused.status_code == 400 and "src" in refused.get_json()["error"]
        missing = await in_thread(web.get, f"/images/{UNKNOWN}")
        assert missing.status_code == 404
    finally:
        app.extensions["qftrio"].close()


async def test_the_flask_example_says_when_the_queue_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = load_example("flask_app").create_app(f"http://127.0.0.1:{port}", "t")
    try:
        answer = await in_thread(app.test_client().post, "/images", json={"src": "cat.png"})
        assert answer.status_code == 503 and answer.get_json()["error"]
    finally:
        app.extensions["qftrio"].close()


def test_the_docs_show_the_web_examples_as_they_are() -> None:
    for name, heading in (("flask_app", "### Flask"), ("django_views", "### Django")):
        source = (ROOT / "examples" / f"{name}.py").read_text()
        compile(source, name, "exec")  # Django is not installed here: its example is only compiled
        shown = doc_blocks(heading)
        assert len(shown) == 2 and all(block in source for block in shown), name
