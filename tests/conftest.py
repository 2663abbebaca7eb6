"""Fixtures shared by the suites: stores of every backend, engines, and a
real server on a real port.

Under pytest-xdist each worker process takes a PostgreSQL database of its own
(see :func:`pytest_configure`), so that workers never empty each other's
tables; temporary directories are per worker already, and every server binds
a free port.
"""

from __future__ import annotations

import dataclasses
import os
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio.server.config import Config
from qftrio.server.engine import Engine
from qftrio.server.serve import run_server
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import open_sqlite_store

def pytest_configure(config: pytest.Config) -> None:
    """Point ``QFTRIO_TEST_DATABASE_URL`` of an xdist worker at a fresh
    database of its own on the same server, before any test module reads it
    (and before any process a test starts inherits it)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    url = os.environ.get("QFTRIO_TEST_DATABASE_URL")
    if not worker or not url:
        return
    import psycopg
    from psycopg import sql

    parts = urllib.parse.urlsplit(url)
    name = f"{parts.path.lstrip('/') or 'postgres'}_{worker}"
    with psycopg.connect(url, autocommit=True, connect_timeout=30) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    os.environ["QFTRIO_TEST_DATABASE_URL"] = parts._replace(path=f"/{name}").geturl()
    _worker_databases.append((url, name))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Drop the worker's database, so that a server given by the developer
    is left as it was found."""
    import psycopg
    from psycopg import sql

    for url, name in _worker_databases:
        with psycopg.connect(url, autocommit=True, connect_timeout=30) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


#: ``(server URL, database)`` of the database :func:`pytest_configure` made.
_worker_databases: list[tuple[str, str]] = []


#: A fixed wall-clock origin for engines driven by Trio's clock.
EPOCH = 1_800_000_000.0

BACKENDS = ["sqlite", "postgres"]


async def _open_store(backend: str, tmp_path: Path) -> AsyncIterator[Store]:
    if backend == "sqlite":
        async with open_sqlite_store(tmp_path / "qftrio.db") as store:
            yield store
    else:
        if not os.environ.get("QFTRIO_TEST_DATABASE_URL"):
            pytest.skip("QFTRIO_TEST_DATABASE_URL is not set")
        from .pg import open_test_postgres_store

        async with open_test_postgres_store() as store:
            yield store


@pytest.fixture(params=BACKENDS)
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh, empty store of each backend."""
    async for store in _open_store(request.param, tmp_path):
        yield store


@pytest.fixture
async def engine(storage: Store) -> Engine:
    """An engine whose wall clock follows Trio's clock."""
    return Engine(storage, clock=lambda: EPOCH + trio.current_time())


class ServerClock:
    """The server's wall clock: real time plus an offset tests can advance,
    so that leases expire and retries come due without waiting."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.frozen_at: float | None = None

    def __call__(self) -> float:
        return (time.time() if self.frozen_at is None else self.frozen_at) + self.offset

    def advance(self, secs: float) -> None:
        self.offset += secs

    def freeze(self) -> None:
        """Stop following real time (advance still moves it), for a test
        that reads ages to the second."""
        self.frozen_at = time.time()


@dataclasses.dataclass
class RunningServer:
    url: str
    engine: Engine
    clock: ServerClock
    worker_token: str = "worker-secret"
    tenants: dict[str, str] = dataclasses.field(default_factory=lambda: {"acme": "acme-secret", "globex": "globex-secret"})

    def headers(self, who: str = "acme") -> dict[str, str]:
        token = self.worker_token if who == "worker" else self.tenants[who]
        return {"Authorization": f"Bearer {token}"}


def server_config(**overrides: object) -> Config:
    values: dict[str, object] = dict(
        bind="127.0.0.1:0",
        worker_token="worker-secret",
        tenants={"acme": "acme-secret", "globex": "globex-secret"},
        retention_secs=None,
        janitor_interval_secs=0.05,
        graceful_timeout_secs=2.0,
    )
    values.update(overrides)
    return Config(**values)  # type: ignore[arg-type]


async def serve_store(storage: Store, nursery: trio.Nursery, **overrides: Any) -> AsyncIterator[RunningServer]:
    """A real server on *storage*, in *nursery*, until the iteration ends
    (*overrides*: settings of :func:`server_config`)."""
    clock = ServerClock()
    engine = Engine(storage, clock=clock, safety_poll_secs=1.0)
    config = server_config(**overrides)
    stop = trio.Event()
    stopped = trio.Event()

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await run_server(engine, config, shutdown_trigger=stop.wait, task_status=task_status)
        finally:
            stopped.set()

    binds = await nursery.start(run)
    yield RunningServer(url=binds[0], engine=engine, clock=clock, tenants=dict(config.tenants))
    stop.set()
    # The server is done before its store closes (its listener, on the
    # store's loop, closes first).
    await stopped.wait()


@pytest.fixture
async def server(storage: Store, nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    """A real server over real HTTP on a free port, on each backend."""
    async for running in serve_store(storage, nursery):
        yield running


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client
