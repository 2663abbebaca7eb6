"""Running the server: the store, the engine, its janitor and listener, the
HTTP app on qftrio's HTTP/1.1 server, and in-process handlers, in one nursery.

Shutdown order: the trigger fires; parked long-polls return empty at once;
the HTTP server stops accepting, closes idle connections and gives requests
in flight ``graceful_timeout_secs``; in-process workers drain within the same
grace; then the janitor and listener are cancelled and the store closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import trio

from .. import errors
from .api import ALL_ROUTES
from .app import create_app
from .auth import Credentials
from .config import Config
from .engine import Engine
from .http11 import serve_asgi
from .protocol import ProtocolFront
from .store.sqlite import open_sqlite_store

__all__ = ["serve", "run_server", "open_engine"]

log = logging.getLogger("qftrio.server")


@contextlib.asynccontextmanager
async def open_engine(config: Config, *, clock: Callable[[], float] | None = None) -> AsyncIterator[Engine]:
    """An engine on the store *config* names."""
    extra = {} if clock is None else {"clock": clock}
    if config.database_url:
        from .store.postgres import open_postgres_store

        async with open_postgres_store(config.database_url, pool_size=config.pool_size) as store:
            yield Engine(store, safety_poll_secs=config.safety_poll_secs, **extra)
    else:
        with _only_process(config.sqlite_path):
            async with open_sqlite_store(config.sqlite_path) as store:
                yield Engine(store, safety_poll_secs=config.safety_poll_secs, **extra)


@contextlib.contextmanager
def _only_process(path: str) -> Iterator[None]:
    """Hold an exclusive lock on the embedded store's file for the block.

    A second server on the same file would run, but its long polls would not
    be woken by the other's enqueues (wake-ups are in-process): it is refused.
    ``flock`` locks are separate from the POSIX locks SQLite itself takes, and
    the descriptor stays open until SQLite has closed the file.

    Raises:
        ConfigError: another process holds the file.
    """
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise errors.ConfigError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise errors.ConfigError(
                f"{path} is in use by another qftrio server: the embedded store serves one process"
                " (several servers share a PostgreSQL database)"
            ) from None
        yield
    finally:
        os.close(fd)


async def serve(
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until *shutdown_trigger* returns (or forever).

    Calls ``task_status.started(binds)`` once listening, with the bound URLs
    (so ``bind="127.0.0.1:0"`` tells the caller its port).

    Raises:
        ConfigError: missing credentials outside dev mode, or a store that
            cannot be opened.
    """
    if config.mode in ("api", "all"):
        Credentials(worker_token=config.worker_token, tenants=config.tenants, dev=config.dev).check_startable()
    if config.dev:
        log.warning(
            "DEVELOPMENT MODE: any valid credential acts as a worker%s. Never expose this server.",
            "; tenant 'default' has the token 'dev'" if not config.tenants else "",
        )
    async with open_engine(config) as engine:
        await run_server(engine, config, shutdown_trigger=shutdown_trigger, task_status=task_status)


async def run_server(
    engine: Engine,
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve` on an engine the caller opened (``config``'s store
    settings are not used)."""
    credentials = Credentials(worker_token=config.worker_token, tenants=config.tenants, dev=config.dev)
    async with trio.open_nursery() as background:
        await background.start(
            lambda task_status: engine.run_janitor(
                interval_secs=config.janitor_interval_secs,
                retention_secs=config.retention_secs,
                task_status=task_status,
            )
        )
        await background.start(engine.run_listener)
        stop = trio.Event()

        async def trigger() -> None:
            if shutdown_trigger is None:
                await trio.sleep_forever()
            else:
                await shutdown_trigger()
            engine.begin_shutdown()
            stop.set()

        async with trio.open_nursery() as front:
            stoppers: list[Callable[[], None]] = []
            if config.handlers and config.mode in ("worker", "all"):
                stoppers = await _start_handlers(front, engine, config)
            if config.mode in ("api", "all"):
                app = ProtocolFront(
                    create_app(engine, credentials, max_body_bytes=config.max_body_bytes),
                    engine,
                    credentials,
                    routes=ALL_ROUTES,
                    max_body_bytes=config.max_body_bytes,
                )
                host, _, port = config.bind.rpartition(":")
                try:
                    binds = await front.start(
                        lambda task_status: serve_asgi(
                            app,
                            host,
                            int(port),
                            shutdown_trigger=trigger,
                            graceful_timeout_secs=config.graceful_timeout_secs,
                            max_body_bytes=config.max_body_bytes,
                            task_status=task_status,
                        )
                    )
                except OSError as exc:
                    raise errors.ConfigError(f"cannot listen on {config.bind}: {exc.strerror or exc}") from None
                log.info("qftrio listening on %s", ", ".join(binds))
                task_status.started(binds)
            else:
                front.start_soon(trigger)
                task_status.started([])
            await stop.wait()
            # the HTTP server drains its requests on its own; in-process workers
            # stop leasing and finish what they hold, within the same grace.
            for stop_worker in stoppers:
                stop_worker()
            front.cancel_scope.deadline = trio.current_time() + config.graceful_timeout_secs
        background.cancel_scope.cancel()


async def _start_handlers(nursery: trio.Nursery, engine: Engine, config: Config) -> list[Callable[[], None]]:
    from ..worker.registry import load_registry
    from ..worker.runtime import Worker
    from .inprocess import EngineTransport

    registry = load_registry(config.handlers or "")
    stoppers = []
    for queue in config.handler_queues:
        worker = Worker(EngineTransport(engine), queue, registry, lanes=config.handler_lanes)
        handle = await nursery.start(worker.run)
        stoppers.append(handle.stop)
    return stoppers
