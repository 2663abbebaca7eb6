"""Helpers to test your handlers in your own Trio tests (pytest-trio, or
``trio.run``).

Call a handler directly, without a server::

    async def test_resize_rejects_gifs():
        with pytest.raises(qftrio.PermanentError):
            await qftrio.testing.call_handler(registry, "resize-image", {"src": "a.gif"})

Or run it for real: a server on the embedded SQLite store in a temporary
directory, on a free port, and a worker leasing over HTTP, exactly as in
production::

    async def test_resize_end_to_end():
        async with qftrio.testing.open_test_server() as server:
            job = await server.run_job(registry, "resize-image", {"src": "a.png"}, queue="images")
            assert job.status is qftrio.Status.COMPLETED
            assert job.result["output"] == "a-256w.png"

These use real sockets and threads, so run them on Trio's real clock (not
``autojump_clock``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import trio

from .client import Client
from .models import TERMINAL, UTC, Job, Status
from .worker.registry import Registry
from .worker.runtime import Worker, WorkerEvent, open_worker, unwrap_single
from .worker.transport import HttpTransport

__all__ = ["TestServer", "open_test_server", "make_job", "call_handler", "wait_for_job"]


def make_job(kind: str, payload: Mapping[str, Any] | None = None, **fields: Any) -> Job:
    """A :class:`~qftrio.models.Job` as a handler would receive it (running,
    attempt 1); any field can be overridden."""
    now = datetime.datetime.now(UTC)
    values: dict[str, Any] = dict(
        id=str(uuid.uuid4()),
        tenant="test",
        queue="default",
        kind=kind,
        payload=dict(payload or {}),
        status=Status.RUNNING,
        priority=0,
        attempt=1,
        max_attempts=5,
        scheduled_at=now,
        created_at=now,
        updated_at=now,
        locked_until=now + datetime.timedelta(seconds=60),
        worker_id="test-worker",
    )
    values.update(fields)
    return Job(**values)


async def call_handler(
    registry: Registry, kind: str, payload: Mapping[str, Any] | None = None, **job_fields: Any
) -> dict[str, Any] | None:
    """Call *registry*'s handler for *kind* with a :func:`make_job` job and
    return what it returns; what it raises propagates. Synchronous handlers
    run in a thread, as the worker runs them; the handler's ``timeout``
    applies (:class:`trio.TooSlowError`).

    Raises:
        KeyError: no handler for *kind*.
    """
    handler = registry.get(kind)
    if handler is None:
        raise KeyError(f"no handler for kind {kind!r} (registered: {', '.join(registry.kinds) or 'none'})")
    job = make_job(kind, payload, **job_fields)
    with trio.fail_after(handler.timeout) if handler.timeout is not None else contextlib.nullcontext():
        if handler.is_async:
            return await handler.fn(job)
        return await trio.to_thread.run_sync(handler.fn, job)


async def wait_for_job(
    client: Client, job_id: str, *, statuses: frozenset[Status] | set[Status] = TERMINAL, timeout: float = 30
) -> Job:
    """Poll until the job's status is one of *statuses* (default: terminal)
    and return it.

    Raises:
        trio.TooSlowError: not within *timeout* seconds.
    """
    with trio.fail_after(timeout):
        while True:
            job = await client.job_get(job_id)
            if job.status in statuses:
                return job
            await trio.sleep(0.02)


@dataclasses.dataclass(kw_only=True)
class TestServer:
    """A running test server.

    Attributes:
        url: its base URL (``http://127.0.0.1:PORT``).
        worker_token: the worker credential.
        tenant: the tenant's name; *tenant_token* its credential.
        path: the temporary directory holding its database.
    """

    __test__ = False  # not a pytest test class, whatever its name says

    url: str
    worker_token: str
    tenant: str
    tenant_token: str
    path: Path

    def client(self, *, worker: bool = False, timeout: float = 10) -> Client:
        """A new :class:`~qftrio.client.Client` with the tenant's token (or
        the worker token); close it, e.g. with ``async with``."""
        return Client(self.url, self.worker_token if worker else self.tenant_token, timeout=timeout)

    @contextlib.asynccontextmanager
    async def open_worker(self, registry: Registry, queue: str = "default", **options: Any) -> AsyncIterator[Worker]:
        """Run a :class:`~qftrio.worker.runtime.Worker` over HTTP for the
        block; it drains on a normal exit. Options as the Worker's (defaults
        here: ``lease_secs=10``, ``wait_secs=1``)."""
        options.setdefault("lease_secs", 10)
        options.setdefault("wait_secs", 1)
        options.setdefault("worker_id", "test-worker")
        async with self.client(worker=True) as client:
            async with open_worker(HttpTransport(client), queue, registry, **options) as worker:
                yield worker

    async def run_job(
        self,
        registry: Registry,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        queue: str = "default",
        max_attempts: int = 1,
        timeout: float = 30,
        on_event: Any = None,
        **worker_options: Any,
    ) -> Job:
        """Enqueue one job, run a worker with *registry* until the job is
        finished (completed, failed or cancelled), and return the job as the
        server has it then.

        *max_attempts* defaults to 1, so that a handler that raises gives a
        ``failed`` job at once instead of retries with backoff; raise it to
        test retries.
        """
        events: list[WorkerEvent] = []

        def record(event: WorkerEvent) -> None:
            events.append(event)
            if on_event is not None:
                on_event(event)

        async with self.client() as client:
            job = await client.enqueue(kind, payload, queue=queue, max_attempts=max_attempts)
            async with self.open_worker(registry, queue, on_event=record, **worker_options):
                return await wait_for_job(client, job.id, timeout=timeout)


@contextlib.asynccontextmanager
async def open_test_server(
    *, worker_token: str = "test-worker-token", tenant: str = "test", tenant_token: str = "test-tenant-token", **config: Any
) -> AsyncIterator[TestServer]:
    """Serve qftrio on the embedded store in a temporary directory, on a
    free port of 127.0.0.1, for the duration of the block.

    *config* overrides fields of :class:`qftrio.server.config.Config`, e.g.
    ``handlers="myapp.jobs:registry"`` to run handlers in-process.
    """
    from .server.config import Config
    from .server.serve import serve

    with tempfile.TemporaryDirectory(prefix="qftrio-test-") as tmp:
        values: dict[str, Any] = dict(
            bind="127.0.0.1:0",
            sqlite_path=str(Path(tmp) / "qftrio.db"),
            worker_token=worker_token,
            tenants={tenant: tenant_token},
            retention_secs=None,
            janitor_interval_secs=0.1,
            graceful_timeout_secs=1.0,
        )
        values.update(config)
        cfg = Config(**values)
        cfg.validate()
        stop = trio.Event()
        with unwrap_single():
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(functools.partial(serve, cfg, shutdown_trigger=stop.wait))
                try:
                    yield TestServer(
                        url=binds[0], worker_token=worker_token, tenant=tenant, tenant_token=tenant_token, path=Path(tmp)
                    )
                finally:
                    stop.set()
