"""Fixtures of the fault suite: qftrio servers and workers as real processes,
on a real SQLite file or on a PostgreSQL cluster of the suite's own (so that
a test may stop and restart it without disturbing the rest of the suite).

Each test starts what it needs on ``127.0.0.1`` and the :class:`Rig` kills
whatever is left at the end. Waits are for state, each bounded.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import trio

from qftrio import Client
from qftrio.models import Job

from ..processes import ROOT, free_port, spawn, wait_healthy

T = TypeVar("T")

WORKER_TOKEN = "faults-worker-token"
TENANT_TOKEN = "faults-tenant-token"
TENANT = "faults"

HANDLERS = textwrap.dedent(
    '''
    """Handlers of the fault suite. Each run leaves a mark file
    ``<job id>.<attempt>`` in $FAULTS_MARKS, so a test can see what ran."""

    import os

    import trio

    from qftrio import PermanentError
    from qftrio.worker import Registry

    registry = Registry()
    MARKS = os.environ["FAULTS_MARKS"]


    def mark(job):
        open(os.path.join(MARKS, f"{job.id}.{job.attempt}"), "w").close()


    def result(job):
        return {"attempt": job.attempt, "worker": job.worker_id}


    @registry.handler("ok")
    async def ok(job):
        mark(job)
        return result(job)


    @registry.handler("bad")
    async def bad(job):
        mark(job)
        raise PermanentError("this job cannot succeed")


    @registry.handler("flaky")
    async def flaky(job):
        mark(job)
        if job.attempt == 1:
            raise RuntimeError("the first attempt fails")
        return result(job)


    @registry.handler("hold")
    async def hold(job):
        """Runs until the file ``<job id>.go`` appears."""
        mark(job)
        while not os.path.exists(os.path.join(MARKS, f"{job.id}.go")):
            await trio.sleep(0.02)
        return result(job)
    '''
)


@dataclasses.dataclass
class Server:
    """One ``qftrio serve`` process."""

    name: str
    url: str
    proc: subprocess.Popen
    log: Path

    def kill(self) -> None:
        """``kill -9``, and reap it."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


class Rig:
    """Servers and workers started on demand; all killed at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.marks = tmp / "marks"
        self.marks.mkdir()
        (tmp / "fault_handlers.py").write_text(HANDLERS)
        self.env = {"FAULTS_MARKS": str(self.marks), "QUEUEFLOW_WORKER_TOKEN": WORKER_TOKEN}
        self.procs: list[subprocess.Popen] = []

    def sqlite(self) -> list[str]:
        """``qftrio serve`` arguments naming the test's SQLite file."""
        return ["--db", str(self.tmp / "faults.db")]

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        proc = spawn(args, env=self.env, cwd=self.tmp, log=self.tmp / f"{name}.log")
        self.procs.append(proc)
        return proc

    async def servers(self, store: list[str], *names: str) -> list[Server]:
        """Start one ``qftrio serve`` per name on the store *store* names
        (its command-line arguments), all at once, and wait until each is
        healthy."""
        started = []
        for name in names:
            url = f"http://127.0.0.1:{free_port()}"
            args = ["serve", "--bind", url.removeprefix("http://"), *store, "--worker-token", WORKER_TOKEN,
                    "--tenant", f"{TENANT}={TENANT_TOKEN}"]  # fmt: skip
            started.append(Server(name, url, self._spawn(name, args), self.tmp / f"{name}.log"))
        async with trio.open_nursery() as nursery:
            for server in started:
                nursery.start_soon(self._wait_healthy, server)
        return started

    async def _wait_healthy(self, server: Server) -> None:
        try:
            await wait_healthy(server.url, timeout=60)
        except trio.TooSlowError:
            raise AssertionError(f"{server.name} did not come up:\n{self.log(server.name)}") from None

    def worker(
        self, name: str, queue: str, url: str, *, lease_secs: int = 2, lanes: int = 2, batch: int = 1
    ) -> subprocess.Popen:
        """Start ``qftrio worker QUEUE`` on the suite's handlers."""
        return self._spawn(
            name,
            ["worker", queue, "fault_handlers:registry", "--url", url, "--lease-secs", str(lease_secs),
             "--wait-secs", "1", "--lanes", str(lanes), "--batch", str(batch), "--worker-id", name],
        )  # fmt: skip

    def ran(self, job_id: str) -> set[int]:
        """The attempts of *job_id* whose handler started."""
        return {int(p.suffix[1:]) for p in self.marks.glob(f"{job_id}.*") if p.suffix[1:].isdigit()}

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # so that a stopped one dies at once
                proc.kill()
                proc.wait()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
async def app() -> AsyncIterator[Callable[[str], Client]]:
    """``app(url)``: a tenant client of the server at *url*, closed at the end."""
    clients: list[Client] = []

    def make(url: str) -> Client:
        clients.append(Client(url, TENANT_TOKEN, timeout=5))
        return clients[-1]

    yield make
    for client in clients:
        await client.aclose()


def worker_client(url: str) -> Client:
    """A client holding the worker token: the test acting as a worker."""
    return Client(url, WORKER_TOKEN, timeout=5)


# -- PostgreSQL --------------------------------------------------------------


class PgCluster:
    """A throwaway PostgreSQL cluster (``scripts/pg-cluster``) that tests may
    stop and start; each test takes a fresh database of it."""

    SCRIPT = str(ROOT / "scripts" / "pg-cluster")

    def __init__(self, directory: str, port: int) -> None:
        self.directory = directory
        self.port = port
        self._names = itertools.count(1)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        subprocess.run([self.SCRIPT, "start", self.directory, str(self.port)], check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run([self.SCRIPT, "stop", self.directory], check=True, capture_output=True)

    def psql(self, database: str, sql: str) -> str:
        """Run *sql* as the superuser; its output, unaligned."""
        done = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database, "-Atqc", sql],
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip()

    def new_database(self) -> str:
        """Create an empty database; its URL."""
        name = f"faults_{os.getpid()}_{next(self._names)}"
        self.psql("postgres", f"CREATE DATABASE {name}")
        return self.url(name)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """The suite's own PostgreSQL, when PostgreSQL tests are on
    (``QFTRIO_TEST_DATABASE_URL`` set, as ``scripts/test`` does)."""
    if not os.environ.get("QFTRIO_TEST_DATABASE_URL"):
        pytest.skip("QFTRIO_TEST_DATABASE_URL is not set: PostgreSQL tests are off")
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed")
    directory = tempfile.mkdtemp(prefix="qftrio-faults-pg-", dir="/tmp")
    cluster = PgCluster(directory, free_port())
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            Path(f"{directory}.initdb.log").unlink(missing_ok=True)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, rig: Rig) -> list[str]:
    """``qftrio serve`` arguments naming a fresh store of each backend."""
    if request.param == "sqlite":
        return rig.sqlite()
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    return ["--database-url", cluster.new_database()]


# -- waiting -----------------------------------------------------------------


async def wait_for(check: Callable[[], Awaitable[T | None]], *, timeout: float, what: str) -> T:
    """Poll *check* until it returns something truthy; that value. Fails
    the test after *timeout* seconds, naming *what* it waited for."""
    try:
        with trio.fail_after(timeout):
            while True:
                value = await check()
                if value:
                    return value
                await trio.sleep(0.05)
    except trio.TooSlowError:
        raise AssertionError(f"still waiting after {timeout}s for {what}") from None


async def all_jobs(client: Client, queue: str) -> list[Job]:
    """Every job of *queue*, all pages."""
    jobs: list[Job] = []
    cursor = None
    while True:
        page, cursor = await client.jobs_list(queue=queue, limit=500, cursor=cursor)
        jobs += page
        if cursor is None:
            return jobs
