"""Acknowledged means durable: ``kill -9`` of the server loses no 2xx job."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import trio

from .processes import free_port, spawn, stop, wait_healthy

pytestmark = pytest.mark.slow

TENANT = {"Authorization": "Bearer acme-secret-token-1"}


def serve_args(db: Path, port: int) -> list[str]:
    return [
        "serve", "--db", str(db), "--bind", f"127.0.0.1:{port}",
        "--worker-token", "worker-secret-token-1", "--tenant", "acme=acme-secret-token-1",
    ]  # fmt: skip


async def test_kill_9_during_an_enqueue_storm_loses_no_acknowledged_job(tmp_path: Path) -> None:
    db, port = tmp_path / "storm.db", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn(serve_args(db, port), log=tmp_path / "server.log")
    acknowledged: list[str] = []
    try:
        await wait_healthy(url)

        async def storm(client: httpx.AsyncClient, n: int) -> None:
            i = 0
            while True:
                i += 1
                try:
                    if i % 5 == 0:
                        body = {"jobs": [{"kind": "k", "payload": {"n": n, "i": i, "j": j}} for j in range(10)]}
                        r = await client.post("/api/v1/jobs/batch", json=body, headers=TENANT)
                        if r.status_code == 201:
                            acknowledged.extend(job["id"] for job in r.json()["jobs"])
                    else:
                        r = await client.post("/api/v1/jobs", json={"kind": "k", "payload": {"n": n, "i": i}}, headers=TENANT)
                        if r.status_code == 201:
                            acknowledged.append(r.json()["id"])
                except httpx.TransportError:
                    return

        async with httpx.AsyncClient(base_url=url, timeout=5) as client, trio.open_nursery() as nursery:
            for n in range(16):
                nursery.start_soon(storm, client, n)
            with trio.fail_after(60):
                while len(acknowledged) < 400:
                    await trio.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(proc.wait)
    finally:
        stop(proc)
    assert proc.returncode == -signal.SIGKILL

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn(serve_args(db, port), log=tmp_path / "server.log")
    try:
        await wait_healthy(url)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            stats = (await client.get("/api/v1/queues/default/stats", headers=TENANT)).json()
            assert stats["counts"]["pending"] >= len(acknowledged)
            stored: set[str] = set()
            cursor = None
            while True:
                params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
                page = (await client.get("/api/v1/jobs", params=params, headers=TENANT)).json()
                stored.update(job["id"] for job in page["jobs"])
                cursor = page["next_cursor"]
                if cursor is None:
                    break
        missing = set(acknowledged) - stored
        assert not missing, f"{len(missing)} acknowledged jobs lost"
    finally:
        assert stop(proc) == 0
