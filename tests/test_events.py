"""The live event stream (DESIGN §3, "Waiting and watching"):
``GET /api/v1/events`` over real HTTP on every backend, and across two
servers on one PostgreSQL database. On the real clock: the stores' threads
and sockets make Trio's autojump clock fire the clients' timeouts; every
wait here ends by the work (an event read, a stream counted), never a
guess."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager, suppress
from typing import Any

import httpx
import pytest
import trio

from qftrio import errors
from qftrio.server.engine import Engine
from qftrio.server.events import MAX_WRITE, EventStreams, Subscriber, chunks
from qftrio.server.store.base import Store

from .conftest import RunningServer, serve_store
from .test_job_wait import two_servers  # noqa: F401 (a fixture)
from .test_protocol import enqueue, lease, report


class Events:
    """The events of one open stream, parsed as a browser's EventSource
    does: ``(event, data)``, comments apart."""

    def __init__(self, response: httpx.Response, lines: AsyncIterator[str]) -> None:
        self.response = response
        self.lines = lines
        self.comments = 0

    async def next(self) -> tuple[str, Any]:
        event, data = "message", []
        async for line in self.lines:
            if not line:
                if data:
                    return event, json.loads("\n".join(data))
                continue
            if line.startswith(":"):
                self.comments += 1
            field, _, value = line.partition(": ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        raise EOFError

    async def job(self, **want: Any) -> dict[str, Any]:
        """The next ``job`` event, which must have *want*'s fields."""
        event, data = await self.next()
        assert event == "job", (event, data)
        assert {key: data[key] for key in want} == want, data
        return data


@asynccontextmanager
async def events(http: httpx.AsyncClient, server: RunningServer, who: str = "acme", **query: Any) -> AsyncIterator[Events]:
    async with http.stream("GET", "/api/v1/events", params=query, headers=server.headers(who)) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"] == "text/event-stream"
        lines = r.aiter_lines()
        try:
            yield Events(r, lines)
        finally:
            # Closed first, so that reading on ends httpx's generators,
            # which would each warn when collected if left suspended.
            await r.aclose()
            with suppress(httpx.HTTPError, httpx.StreamError):
                async for _ in lines:
                    pass


async def open_streams(engine: Engine, n: int) -> None:
    """Until *n* streams are open on *engine* (and, when *n* is more than
    none, each registered and heard: a change made now reaches it): its
    state, not a time."""
    while len(engine.events) != n or engine.events.live != n:
        await trio.sleep(0.001)


async def test_a_stream_sees_every_change_of_a_job(http, server) -> None:
    async with events(http, server) as stream:
        job = await enqueue(http, server, queue="q", kind="k")
        await stream.job(id=job["id"], queue="q", kind="k", status="pending", attempt=0, progress=None)
        (leased,) = await lease(http, server, queue="q", lease_secs=300)
        await stream.job(id=job["id"], status="running", attempt=1)
        r = await http.post(
            f"/api/v1/jobs/{job['id']}/progress", json={"lease_token": leased["lease_token"], "progress": {"done": 3}},
            headers=server.headers("worker"),
        )
        assert r.status_code in (200, 204), r.text
        await stream.job(id=job["id"], status="running", progress={"done": 3})
        await report(http, server, job["id"], "fail", lease_token=leased["lease_token"], error="boom")
        retry = await stream.job(id=job["id"], status="pending", attempt=1)
        assert isinstance(retry["at"], float)
        cancelled = await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
        assert cancelled.status_code == 200
        await stream.job(id=job["id"], status="cancelled")


async def comment(stream: Events) -> None:
    """Until the stream sends its next comment line."""
    seen = stream.comments
    async for line in stream.lines:
        if line.startswith(":"):
            stream.comments += 1
        if stream.comments > seen:
            return
    raise EOFError


async def test_a_stream_sees_only_its_tenants_matching_jobs(http, server) -> None:
    async with events(http, server, queue="q", kind="k") as stream:
        await enqueue(http, server, queue="other", kind="k")
        await enqueue(http, server, queue="q", kind="other")
        r = await http.post("/api/v1/jobs", json={"kind": "k", "config": {"queue": "q"}}, headers=server.headers("globex"))
        assert r.status_code == 201
        job = await enqueue(http, server, queue="q", kind="k")
        # The first event is the one job that matches: the others made none.
        await stream.job(id=job["id"], status="pending")
    async with events(http, server, job=job["id"]) as stream:
        await enqueue(http, server, queue="q", kind="k")
        await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
        await stream.job(id=job["id"], status="cancelled")
    # Another tenant's job, named: the stream sees nothing of it.
    async with events(http, server, who="globex", job=job["id"]) as stream:
        await http.post(f"/api/v1/jobs/{job['id']}/retry", headers=server.headers())
        mine = await http.post("/api/v1/jobs", json={"kind": "k"}, headers=server.headers("globex"))
        async with events(http, server, who="globex") as everything:
            await http.post(f"/api/v1/jobs/{mine.json()['id']}/cancel", headers=server.headers("globex"))
            await everything.job(id=mine.json()["id"], status="cancelled")
        assert stream.comments == 0
    await open_streams(server.engine, 0)


async def test_a_heartbeat_that_changes_nothing_sends_no_event(http, server) -> None:
    job = await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=300)
    async with events(http, server) as stream:
        r = await report(http, server, job["id"], "heartbeat", lease_token=leased["lease_token"], extend_secs=60)
        assert r.status_code == 200, r.text
        await report(http, server, job["id"], "complete", lease_token=leased["lease_token"])
        await stream.job(id=job["id"], status="completed")


async def test_bad_filters_are_422_naming_the_field_and_a_worker_token_403(http, server) -> None:
    for field, bad in (("stats_secs", "0"), ("stats_secs", "61"), ("stats_secs", "often"), ("job", "nope"),
                       ("queue", "no queue"), ("kind", "x" * 200), ("since", "1")):  # fmt: skip
        r = await http.get("/api/v1/events", params={field: bad}, headers=server.headers())
        assert r.status_code == 422 and field in r.json()["error"]["message"], r.text
    r = await http.get("/api/v1/events", headers=server.headers("worker"))
    assert r.status_code == 403
    assert len(server.engine.events) == 0


async def test_streams_past_a_tenants_cap_are_429(http, server, monkeypatch) -> None:
    monkeypatch.setattr(server.engine.events, "per_tenant", 2)
    async with events(http, server), events(http, server):
        r = await http.get("/api/v1/events", headers=server.headers())
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_streams"
        assert r.headers["retry-after"] == "1"
        async with events(http, server, who="globex"):
            assert len(server.engine.events) == 3
    await open_streams(server.engine, 0)


async def test_a_client_that_goes_away_ends_its_stream(http, server) -> None:
    async with events(http, server):
        await open_streams(server.engine, 1)
    # Bounded by the work: the server notices the closed connection.
    await open_streams(server.engine, 0)


async def test_a_consumer_that_falls_behind_gets_overflow_and_the_end(http, server, monkeypatch) -> None:
    monkeypatch.setattr(server.engine.events, "MAX_BEHIND", 3)
    async with events(http, server) as stream:
        # Ten jobs in one commit: ten changes at once, more than it may hold.
        jobs = [{"kind": "k", "config": {"queue": "q"}} for _ in range(10)]
        r = await http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=server.headers())
        assert r.status_code == 201, r.text
        seen = []
        while True:
            event, data = await stream.next()
            if event != "job":
                break
            seen.append(data)
        assert event == "overflow" and data == {"max_behind": 3}
        assert len(seen) <= 3 + 1  # those it held, and the one being written
        with pytest.raises(EOFError):
            await stream.next()
    await open_streams(server.engine, 0)


async def test_a_commits_changes_reach_the_stream_all_and_in_order(http, server) -> None:
    async with events(http, server, queue="q") as stream:
        # More changes in one commit than one write of the stream carries.
        jobs = [{"kind": "k", "payload": {"n": n}, "config": {"queue": "q"}} for n in range(MAX_WRITE * 2 + 88)]
        r = await http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=server.headers())
        assert r.status_code == 201, r.text
        ids = [job["id"] for job in r.json()["jobs"]]
        assert [(await stream.job(status="pending"))["id"] for _ in ids] == ids


async def test_events_ready_at_once_are_one_chunk_in_order_and_overflow_comes_after_those_held() -> None:
    async def never() -> Any:
        raise AssertionError("not called")

    def change(n: int) -> dict[str, Any]:
        return {"id": str(n), "tenant": "acme", "queue": "q", "kind": "k", "status": "pending", "attempt": 0, "at": 1.0}

    def ids(chunk: bytes) -> list[str]:
        return [json.loads(line[len(b"data: "):])["id"] for line in chunk.split(b"\n") if line.startswith(b"data: ")]

    streams = EventStreams(per_tenant=1)
    subscriber = streams.open("acme", queue=None, kind=None, job=None)
    for n in range(MAX_WRITE + 10):
        streams.changed(change(n))
    async with aclosing(chunks(subscriber, keepalive_secs=60, keep=never, fill=never)) as stream:
        assert ids(await anext(stream)) == [str(n) for n in range(MAX_WRITE)]
        assert ids(await anext(stream)) == [str(n) for n in range(MAX_WRITE, MAX_WRITE + 10)]
        streams.close_one(subscriber)
        with pytest.raises(StopAsyncIteration):
            await anext(stream)

    # One more than it may hold: the stream writes those it held, then
    # the overflow, and ends.
    subscriber = Subscriber("acme", None, None, None, behind=3)
    for n in range(5):
        subscriber.offer(change(n))
    assert subscriber.overflowed
    async with aclosing(chunks(subscriber, keepalive_secs=60, keep=never, fill=never)) as stream:
        assert ids(await anext(stream)) == ["0", "1", "2"]
        assert await anext(stream) == b'event: overflow\ndata: {"max_behind":3}\n\n'
        with pytest.raises(StopAsyncIteration):
            await anext(stream)


async def test_stats_and_comments_come_on_time(http, server, monkeypatch) -> None:
    monkeypatch.setattr(server.engine, "EVENTS_KEEPALIVE_SECS", 0.05)
    await enqueue(http, server, queue="q")
    async with events(http, server, queue="q", stats_secs=1) as stream:
        for _ in range(3):
            await comment(stream)
        event, data = await stream.next()
        assert event == "stats" and data["queue"] == "q" and data["counts"]["pending"] == 1, data


async def test_a_large_progress_is_on_the_stream_whole(http, server) -> None:
    job = await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=300)
    big = {"log": "x" * 8000}
    async with events(http, server) as stream:
        r = await report(http, server, job["id"], "progress", lease_token=leased["lease_token"], progress=big)
        assert r.status_code == 200, r.text
        data = await stream.job(id=job["id"], progress=big)
        assert "progress_omitted" not in data


async def test_shutdown_ends_every_stream(storage: Store, nursery: trio.Nursery) -> None:
    async for server in serve_store(storage, nursery):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            async with events(http, server) as stream:
                await open_streams(server.engine, 1)
                server.engine.begin_shutdown()
                with pytest.raises(EOFError):
                    await stream.next()
            r = await http.get("/api/v1/events", headers=server.headers())
            assert r.status_code == 503
    assert len(server.engine.events) == 0


@pytest.mark.postgres
async def test_a_stream_on_one_server_sees_the_changes_made_through_another(two_servers) -> None:  # noqa: F811
    a, b = two_servers
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as on_a, httpx.AsyncClient(base_url=b.url, timeout=30) as on_b:
        async with events(on_b, b) as stream:
            job = await enqueue(on_a, a)
            await stream.job(id=job["id"], status="pending")
            (leased,) = await lease(on_a, a, lease_secs=300)
            await stream.job(id=job["id"], status="running", attempt=1)
            await report(on_a, a, job["id"], "complete", lease_token=leased["lease_token"])
            await stream.job(id=job["id"], status="completed")
        # Its registration is gone with it: A's changes notify nothing now.
        await open_streams(b.engine, 0)
        assert await a.engine.store._db.fetchval("SELECT count(*) FROM qftrio_event_streams") == 0


# -- the clients ------------------------------------------------------------------


async def test_client_events_is_an_async_iterator_of_the_stream(http, server) -> None:
    from qftrio import Client
    from qftrio.client import Event, InvalidArgument

    seen: list[Event] = []
    async with Client(server.url, server.tenants["acme"]) as client:

        async def read() -> None:
            async with aclosing(client.events(queue="q", stats_secs=1)) as stream:
                async for event in stream:
                    seen.append(event)
                    if event.kind == "job" and event.data["status"] == "cancelled":
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await open_streams(server.engine, 1)
            job = await enqueue(http, server, queue="q")
            await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
        with pytest.raises(InvalidArgument, match="stats_secs"):
            await client.events(stats_secs=0).__anext__()
    jobs = [e.data for e in seen if e.kind == "job"]
    assert [(j["id"], j["status"]) for j in jobs] == [(job["id"], "pending"), (job["id"], "cancelled")]
    assert all(e.stats.queue == "q" for e in seen if e.kind == "stats")
    await open_streams(server.engine, 0)


async def test_sync_client_events_is_a_plain_iterator_and_refusals_raise(http, server, monkeypatch) -> None:
    from qftrio import SyncClient

    monkeypatch.setattr(server.engine.events, "per_tenant", 1)
    client = SyncClient(server.url, server.tenants["acme"])

    def first_two() -> list[dict[str, Any]]:
        stream = client.events(kind="k")
        try:
            return [next(stream).data, next(stream).data]
        finally:
            stream.close()

    try:
        async with trio.open_nursery() as nursery:
            got: list[list[dict[str, Any]]] = []
            nursery.start_soon(lambda: _into(got, trio.to_thread.run_sync(first_two)))
            await open_streams(server.engine, 1)
            with pytest.raises(errors.TooManyRequests):
                await trio.to_thread.run_sync(lambda: next(client.events()))
            job = await enqueue(http, server, kind="k")
            await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
        ((pending, cancelled),) = got
        assert (pending["status"], cancelled["status"]) == ("pending", "cancelled")
    finally:
        client.close()
    await open_streams(server.engine, 0)


async def _into(into: list[Any], call: Any) -> None:
    into.append(await call)


# -- the command line ---------------------------------------------------------------


@asynccontextmanager
async def cli(server: RunningServer, *argv: str) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """``qftrio *argv*`` against *server* as acme, in a process of its own;
    yields the reader of its next line of output."""
    import os
    import sys

    from .processes import ROOT

    argv = (sys.executable, "-m", "qftrio", *argv, "--url", server.url, "--token", server.tenants["acme"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout, proc.stderr
        buffered = b""

        async def line() -> str:
            nonlocal buffered
            while b"\n" not in buffered:
                chunk = await stdout.receive_some()
                if not chunk:
                    raise EOFError((await stderr.receive_some()).decode())
                buffered += chunk
            first, _, buffered = buffered.partition(b"\n")
            return first.decode()

        yield line
    finally:
        proc.terminate()
        await proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                await pipe.aclose()


async def test_qftrio_events_prints_a_json_line_per_event(http, server) -> None:
    async with cli(server, "events", "--queue", "q") as line:
        await open_streams(server.engine, 1)
        job = await enqueue(http, server, queue="q")
        await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
        first, second = json.loads(await line()), json.loads(await line())
    assert first["event"] == "job" and first["data"]["id"] == job["id"] and first["data"]["status"] == "pending"
    assert second["data"]["status"] == "cancelled"
    await open_streams(server.engine, 0)


async def test_qftrio_events_refuses_a_bad_filter_in_one_line() -> None:
    import sys

    from .processes import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "qftrio", "events", "--stats", "0", "--token", "t"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "stats_secs" in done.stderr, done.stderr


async def test_qftrio_stats_watch_on_a_queue_reads_the_stream(http, server) -> None:
    await enqueue(http, server, queue="q")
    async with cli(server, "stats", "q", "--watch", "--interval", "1") as line:
        await open_streams(server.engine, 1)
        first, second = json.loads(await line()), json.loads(await line())
    assert first["queue"] == second["queue"] == "q" and second["counts"]["pending"] == 1
    assert first["completed_per_sec"] is None and second["completed_per_sec"] == 0
