"""A workflow survives ``kill -9`` of the server: no step lost, none doubled.

Workers complete steps over HTTP while the server process is killed three
times mid-stream and restarted on the same database (a SQLite file, or
PostgreSQL when ``QFTRIO_TEST_DATABASE_URL`` is set). A completion and the
steps it unblocks are one transaction, so after every crash either both are
there or neither is; workers replay what they could not report, and expired
leases come back through the janitor.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from .processes import free_port, spawn, stop, wait_healthy

pytestmark = [
    pytest.mark.slow,
    # A request cut off by the kill leaves httpx's request-body async
    # generator (``ByteStream.__aiter__``) unfinished; its finalizer then
    # complains at garbage collection. The client's, not the server's.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

TENANT = {"Authorization": "Bearer acme-secret-token-1"}
WORKER = {"Authorization": "Bearer worker-secret-token-1"}
LAYERS, WIDTH = 6, 8


def serve_args(database: list[str], port: int) -> list[str]:
    return [
        "serve", *database, "--bind", f"127.0.0.1:{port}",
        "--worker-token", "worker-secret-token-1", "--tenant", "acme=acme-secret-token-1",
    ]  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """``qftrio serve`` options naming an empty database of each backend."""
    if request.param == "sqlite":
        return ["--db", str(tmp_path / "wf.db")]
    from .pg import pg_url, reset_database

    url = pg_url()
    if url is None:
        pytest.skip("QFTRIO_TEST_DATABASE_URL is not set")
    await reset_database(url)
    return ["--database-url", url]


def layered_steps() -> list[dict]:
    """LAYERS layers of WIDTH steps; each step waits for the whole layer before."""
    steps = []
    for layer in range(LAYERS):
        deps = [f"l{layer - 1}s{j}" for j in range(WIDTH)] if layer else []
        steps += [{"name": f"l{layer}s{j}", "kind": "k", "depends_on": deps, "max_attempts": 20} for j in range(WIDTH)]
    return steps


class Server:
    def __init__(self, database: list[str], tmp_path: Path) -> None:
        self.database = database
        self.log = tmp_path / "server.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    async def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = spawn(serve_args(self.database, port), log=self.log)
        await wait_healthy(self.url)

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(self.proc.wait)
        assert self.proc.returncode == -signal.SIGKILL


async def test_kill_9_mid_workflow_neither_loses_nor_doubles_a_step(database: list[str], tmp_path: Path) -> None:
    server = Server(database, tmp_path)
    await server.start()
    seen: dict[str, list[dict]] = {}  # step -> the contexts its job was leased with
    completed: list[str] = []
    reporting = [0]  # completions in flight
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            r = await client.post(
                f"{server.url}/api/v1/workflows", json={"name": "layers", "steps": layered_steps()}, headers=TENANT
            )
            assert r.status_code == 201
            workflow_id = r.json()["id"]

            async def call(method: str, path: str, **kwargs) -> httpx.Response:
                """Retry through crashes and restarts (the URL changes)."""
                while True:
                    try:
                        return await client.request(method, f"{server.url}{path}", headers=WORKER, **kwargs)
                    except httpx.TransportError:
                        await trio.sleep(0.05)

            async def worker(done: trio.Event) -> None:
                while not done.is_set():
                    r = await call("POST", "/api/v1/queues/default/lease", json={"lease_secs": 2, "wait_secs": 0.5})
                    if r.status_code != 200 or not r.json()["jobs"]:
                        continue
                    (item,) = r.json()["jobs"]
                    job = item["job"]
                    seen.setdefault(job["step"], []).append(job["context"])
                    await trio.sleep(0.01)
                    body = {"lease_token": item["lease_token"], "result": {job["step"]: job["attempt"]}}
                    reporting[0] += 1
                    try:
                        r = await call("POST", f"/api/v1/jobs/{job['id']}/complete", json=body)
                    finally:
                        reporting[0] -= 1
                    # 409: the crash lost the lease, and the janitor handed the step out again
                    if r.status_code == 204:
                        completed.append(job["step"])

            done = trio.Event()
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(worker, done)
                for threshold in (6, 20, 33):
                    with trio.fail_after(60):
                        # kill with a completion on the wire: between the
                        # step's report and the start of the steps it unblocks
                        while len(completed) < threshold or not reporting[0]:
                            await trio.sleep(0)
                    await server.kill()
                    await server.start()
                with trio.fail_after(120):
                    while True:
                        r = await client.get(f"{server.url}/api/v1/workflows/{workflow_id}", headers=TENANT)
                        if r.json()["status"] != "running":
                            break
                        await trio.sleep(0.1)
                done.set()

            wf = r.json()
            assert wf["status"] == "completed"
            assert {s["status"] for s in wf["steps"]} == {"completed"}
            # one job per step, never a second one
            job_ids = [s["job_id"] for s in wf["steps"]]
            assert len(set(job_ids)) == LAYERS * WIDTH
            listed = (await client.get(f"{server.url}/api/v1/jobs", params={"limit": 1000}, headers=TENANT)).json()
            assert sorted(j["id"] for j in listed["jobs"] if j["workflow_id"] == workflow_id) == sorted(job_ids)
            assert set(wf["context"]) == {s["name"] for s in wf["steps"]}
            # every step ran after its whole previous layer, and saw its results
            for layer in range(1, LAYERS):
                before = {f"l{layer - 1}s{j}" for j in range(WIDTH)}
                for j in range(WIDTH):
                    for context in seen[f"l{layer}s{j}"]:
                        assert before <= set(context), (layer, j, context)
    finally:
        if server.proc is not None:
            assert stop(server.proc) in (0, -signal.SIGKILL)
