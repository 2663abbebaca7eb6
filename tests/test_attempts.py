"""A job's attempt history (``attempts``): how each claim ended, on both
stores, over real HTTP. The server's own janitor is idle here (its round is
an hour), so that each test decides when a lease is taken back."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio.models import MAX_ATTEMPTS_KEPT, CompleteItem, parse_time, to_datetime
from qftrio.server.store import sql
from qftrio.server.store.base import Store
from qftrio.server.store.postgres import PostgresStore
from qftrio.server.store.sqlite import open_sqlite_store

from .conftest import RunningServer, serve_store
from .pg import connection, pg_url


@pytest.fixture
async def server(storage: Store, nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    async for running in serve_store(storage, nursery, janitor_interval_secs=3600):
        running.clock.freeze()
        yield running


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


async def enqueue(http: httpx.AsyncClient, server: RunningServer, **config: Any) -> str:
    r = await http.post("/api/v1/jobs", json={"kind": "k", "config": {"queue": "tries", **config}}, headers=server.headers())
    assert r.status_code == 201, r.text
    assert r.json()["attempts"] == []
    return str(r.json()["id"])


async def lease(http: httpx.AsyncClient, server: RunningServer, worker_id: str, lease_secs: int = 60) -> tuple[dict[str, Any], str]:
    r = await http.post(
        "/api/v1/queues/tries/lease", json={"worker_id": worker_id, "lease_secs": lease_secs}, headers=server.headers("worker")
    )
    (leased,) = r.json()["jobs"]
    return leased["job"], leased["lease_token"]


async def report(http: httpx.AsyncClient, server: RunningServer, job_id: str, what: str, **body: Any) -> None:
    r = await http.post(f"/api/v1/jobs/{job_id}/{what}", json=body, headers=server.headers("worker"))
    assert r.status_code == 204, r.text


async def attempts(http: httpx.AsyncClient, server: RunningServer, job_id: str) -> list[dict[str, Any]]:
    r = await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())
    return list(r.json()["attempts"])


def ended(entries: list[dict[str, Any]]) -> list[tuple[int, str, str, str | None]]:
    """Each entry's number, worker, outcome and error."""
    return [(e["attempt"], e["worker_id"], e["outcome"], e["error"]) for e in entries]


async def test_a_completed_attempt(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server)
    claimed_at = server.clock()
    job, token = await lease(http, server, "w1")
    (running,) = job["attempts"]
    assert (running["attempt"], running["worker_id"], running["outcome"]) == (1, "w1", "running")
    assert parse_time(running["claimed_at"]) == pytest.approx(claimed_at, abs=1e-6)
    assert running["ended_at"] is None and running["error"] is None
    server.clock.advance(3)
    await report(http, server, job_id, "complete", lease_token=token, result={"ok": 1})
    (done,) = await attempts(http, server, job_id)
    assert ended([done]) == [(1, "w1", "completed", None)]
    assert parse_time(done["ended_at"]) - parse_time(done["claimed_at"]) == pytest.approx(3, abs=1e-6)
    # a replayed completion ends nothing twice
    await report(http, server, job_id, "complete", lease_token=token, result={"ok": 1})
    assert await attempts(http, server, job_id) == [done]


async def test_failed_retryable_then_permanently(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server, max_attempts=5)
    _, token = await lease(http, server, "w1")
    await report(http, server, job_id, "fail", lease_token=token, error="boom", retry_in_secs=10)
    assert ended(await attempts(http, server, job_id)) == [(1, "w1", "failed", "boom")]
    server.clock.advance(11)
    _, token = await lease(http, server, "w2")
    await report(http, server, job_id, "fail", lease_token=token, error="bad input", retryable=False)
    r = await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())
    job = r.json()
    assert job["status"] == "failed" and job["attempt"] == 2 < job["max_attempts"]
    assert ended(job["attempts"]) == [(1, "w1", "failed", "boom"), (2, "w2", "failed", "bad input")]
    assert [e["error"] for e in job["errors"]] == ["boom", "bad input"]  # the error history stays as it was


async def test_a_timed_out_attempt(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server, timeout_secs=5, max_attempts=2)
    await lease(http, server, "w1")
    server.clock.advance(6)
    assert await server.engine.reap_expired() == 1
    assert ended(await attempts(http, server, job_id)) == [(1, "w1", "timed_out", "timed out after 5 s")]


async def test_an_attempt_lost_to_the_janitor(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server, max_attempts=1)
    await lease(http, server, "w1", lease_secs=1)
    server.clock.advance(2)
    assert await server.engine.reap_expired() == 1
    (lost,) = await attempts(http, server, job_id)
    assert ended([lost]) == [(1, "w1", "lost", "lease expired")]
    assert parse_time(lost["ended_at"]) == pytest.approx(server.clock(), abs=1e-6)


async def test_an_attempt_lost_to_a_claim(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server)
    _, stale = await lease(http, server, "w1", lease_secs=1)
    server.clock.advance(2)
    job, token = await lease(http, server, "w2")
    assert ended(job["attempts"]) == [(1, "w1", "lost", "lease expired"), (2, "w2", "running", None)]
    # the stale token's completion changes nothing; the current one's ends attempt 2
    r = await http.post(f"/api/v1/jobs/{job_id}/complete", json={"lease_token": stale}, headers=server.headers("worker"))
    assert r.status_code == 409
    await report(http, server, job_id, "complete", lease_token=token)
    assert ended(await attempts(http, server, job_id)) == [(1, "w1", "lost", "lease expired"), (2, "w2", "completed", None)]


async def test_a_snoozed_attempt(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server)
    _, token = await lease(http, server, "w1")
    await report(http, server, job_id, "snooze", lease_token=token, delay_secs=0)
    assert ended(await attempts(http, server, job_id)) == [(1, "w1", "snoozed", None)]
    job, _ = await lease(http, server, "w1")
    assert ended(job["attempts"]) == [(1, "w1", "snoozed", None), (2, "w1", "running", None)]


async def test_cancelled_while_running_and_while_pending(http: httpx.AsyncClient, server: RunningServer) -> None:
    running_id = await enqueue(http, server)
    await lease(http, server, "w1")
    pending_id = await enqueue(http, server)
    for job_id in (running_id, pending_id):
        r = await http.post(f"/api/v1/jobs/{job_id}/cancel", headers=server.headers())
        assert r.status_code == 200
    assert ended(r.json()["attempts"]) == []  # never claimed: no attempt
    assert ended(await attempts(http, server, running_id)) == [(1, "w1", "cancelled", None)]


async def test_a_bulk_cancel_ends_the_running_attempts(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server)
    _, token = await lease(http, server, "w1")
    r = await http.post("/api/v1/jobs/bulk/cancel", json={"queue": "tries"}, headers=server.headers())
    assert r.status_code == 200, r.text
    assert ended(await attempts(http, server, job_id)) == [(1, "w1", "cancelled", None)]
    # the late heartbeat is told so, and the history stays as it is
    r = await http.post(
        f"/api/v1/jobs/{job_id}/heartbeat", json={"lease_token": token, "extend_secs": 5}, headers=server.headers("worker")
    )
    assert r.json()["status"] == "cancelled"
    assert ended(await attempts(http, server, job_id)) == [(1, "w1", "cancelled", None)]


async def test_a_retried_job_keeps_its_history(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server, max_attempts=1)
    _, token = await lease(http, server, "w1")
    await report(http, server, job_id, "fail", lease_token=token, error="boom")
    r = await http.post(f"/api/v1/jobs/{job_id}/retry", headers=server.headers())
    assert r.status_code == 200 and ended(r.json()["attempts"]) == [(1, "w1", "failed", "boom")]
    job, token = await lease(http, server, "w2")
    assert ended(job["attempts"]) == [(1, "w1", "failed", "boom"), (1, "w2", "running", None)]
    # the second claim's number is the first's again, and its completion its own entry
    await report(http, server, job_id, "complete", lease_token=token)
    assert ended(await attempts(http, server, job_id)) == [(1, "w1", "failed", "boom"), (1, "w2", "completed", None)]


async def test_only_the_newest_attempts_are_kept(http: httpx.AsyncClient, server: RunningServer) -> None:
    job_id = await enqueue(http, server)
    claims = MAX_ATTEMPTS_KEPT + 3
    for _ in range(claims):
        _, token = await lease(http, server, "w1")
        await report(http, server, job_id, "snooze", lease_token=token, delay_secs=0)
    kept = await attempts(http, server, job_id)
    assert [e["attempt"] for e in kept] == list(range(claims - MAX_ATTEMPTS_KEPT + 1, claims + 1))
    assert {e["outcome"] for e in kept} == {"snoozed"}
    # the cap holds for the running attempt a claim appends too, and for its completion
    job, token = await lease(http, server, "w1")
    assert len(job["attempts"]) == MAX_ATTEMPTS_KEPT and job["attempts"][-1]["outcome"] == "running"
    assert job["attempts"][0]["attempt"] == claims - MAX_ATTEMPTS_KEPT + 2
    await report(http, server, job_id, "complete", lease_token=token)
    kept = await attempts(http, server, job_id)
    assert len(kept) == MAX_ATTEMPTS_KEPT and kept[-1]["outcome"] == "completed"
    assert [e["attempt"] for e in kept] == list(range(claims - MAX_ATTEMPTS_KEPT + 2, claims + 2))


async def _write_completed_entry(storage: Store, tmp_path: Path, job_id: str) -> None:
    # Into the stored history, as the versions that wrote a completed
    # attempt there wrote it.
    if isinstance(storage, PostgresStore):
        async with connection(str(pg_url())) as conn:
            await conn.execute(
                "UPDATE qftrio_jobs SET attempts = qftrio_attempt_end(attempts, attempt, worker_id, claimed_at,"
                " 'completed', NULL, updated_at) WHERE id = $1",
                job_id,
            )
        return
    with contextlib.closing(sqlite3.connect(tmp_path / "qftrio.db")) as conn:
        conn.execute(
            "UPDATE jobs SET attempts = json_insert(attempts, '$[#]', json_object('attempt', attempt, 'worker_id',"
            " worker_id, 'claimed_at', json(printf('%!.17g', claimed_at)), 'ended_at', json(printf('%!.17g', updated_at)),"
            " 'outcome', 'completed', 'error', NULL)) WHERE id = ?",
            (job_id,),
        )
        conn.commit()


async def _sql_wire_attempts(storage: Store, job_id: str) -> list[dict[str, Any]] | None:
    # The job's attempts as PostgreSQL's own wire form writes them (an
    # application's enqueue of a unique job answers it), or None on SQLite.
    if not isinstance(storage, PostgresStore):
        return None
    async with connection(str(pg_url())) as conn:
        wire = await conn.fetchval("SELECT qftrio_job_wire(j) FROM qftrio_jobs AS j WHERE j.id = $1", job_id)
    return list(wire["attempts"])


async def test_a_completed_attempt_is_one_entry_whichever_version_completed_it(
    http: httpx.AsyncClient, server: RunningServer, storage: Store, tmp_path: Path
) -> None:
    job_id = await enqueue(http, server)
    _, token = await lease(http, server, "w1")
    server.clock.advance(2)
    await report(http, server, job_id, "complete", lease_token=token)
    (done,) = await attempts(http, server, job_id)
    assert ended([done]) == [(1, "w1", "completed", None)]
    assert await _sql_wire_attempts(storage, job_id) in (None, [done])
    await _write_completed_entry(storage, tmp_path, job_id)
    assert await attempts(http, server, job_id) == [done]
    assert await _sql_wire_attempts(storage, job_id) in (None, [done])


async def test_jobs_kept_before_histories_start_empty_and_a_running_one_shows_its_claim(tmp_path) -> None:
    # An embedded store one version behind: a pending job, and one running
    # under a lease, written as that version wrote them.
    path = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        scripts = sql.migrations("sqlite")
        (version,) = [n for n, (v, _, _) in enumerate(scripts, 1) if v == "0013"]
        for number, (_, _, script) in enumerate(scripts[: version - 1], 1):
            conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
        for job_id, status, attempt in (("01a00000-0000-7000-8000-000000000001", "pending", 0),
                                         ("01a00000-0000-7000-8000-000000000002", "running", 1)):  # fmt: skip
            conn.execute(
                "INSERT INTO jobs (id, tenant, queue, kind, payload, priority, max_attempts, scheduled_at, status,"
                " attempt, created_at, updated_at, worker_id, lease_token, claimed_at, locked_until)"
                " VALUES (?, 't', 'q', 'k', '{}', 0, 5, 1.0, ?, ?, 1.0, 2.0, 'old-worker', 'tok', 2.0, 9e9)",
                (job_id, status, attempt),
            )
        conn.commit()
    async with open_sqlite_store(path) as store:
        pending = await store.job_get("01a00000-0000-7000-8000-000000000001")
        running = await store.job_get("01a00000-0000-7000-8000-000000000002")
        assert pending is not None and pending.attempts == ()
        assert running is not None and [(e.attempt, e.worker_id, e.claimed_at, e.outcome.value) for e in running.attempts] == [
            (1, "old-worker", to_datetime(2.0), "running")
        ]
        (done,) = await store.jobs_complete([CompleteItem(running.id, "tok", {})], now=3.0)
        assert done.applied
        ended = await store.job_get(running.id)
        assert ended is not None and [(e.attempt, e.worker_id, e.ended_at, e.outcome.value) for e in ended.attempts] == [
            (1, "old-worker", to_datetime(3.0), "completed")
        ]
