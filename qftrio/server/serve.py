"""Running the server: the store, the engine, its janitor and listener, the
API's front and the dashboard's app on qftrio's HTTP/1.1 server, and
in-process handlers, in one nursery.

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
from ..models import format_time
from .app import create_app
from .auth import Credentials
from .config import Config
from .engine import Engine
from .front import ApiFront
from .http11 import serve_asgi
from .store.sqlite import open_sqlite_store
from ..worker.runtime import DEFAULT_WARN_BLOCKED_SECS, Worker, watch_blocking
from .throttle import Throttle, ThrottleFront

__all__ = ["serve", "run_server", "open_engine"]

log = logging.getLogger("qftrio.server")


@contextlib.asynccontextmanager
async def open_engine(config: Config, *, clock: Callable[[], float] | None = None) -> AsyncIterator[Engine]:
    """An engine on the store *config* names."""
    extra = {} if clock is None else {"clock": clock}
    if config.database_url:
        from .store.pgtrio import read_url
        from .store.postgres import open_postgres_store

        async with open_postgres_store(config.database_url, pool_size=config.pool_size) as store:
            target = read_url(config.database_url)
            log.info("store: PostgreSQL at %s, database %r, as %r", target.where, target.database, target.user)
            yield Engine(store, safety_poll_secs=config.safety_poll_secs, **extra)
    else:
        with _only_process(config.sqlite_path):
            async with open_sqlite_store(config.sqlite_path) as store:
                log.info("store: the embedded SQLite file %s", os.path.abspath(config.sqlite_path))
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
    creates = None if config.database_url or os.path.exists(config.sqlite_path) else config.sqlite_path
    status = _Started(task_status)
    try:
        async with open_engine(config) as engine:
            for tenant, name, body in config.schedules:
                schedule, _ = await engine.schedule_put(tenant, name, body)
                log.info("schedule %s of tenant %s: %r, next run %s", name, tenant, body.cron, format_time(schedule.next_run_at))
            await run_server(engine, config, shutdown_trigger=shutdown_trigger, task_status=status)
    except BaseException:
        if creates is not None and not status.done:
            # A start that failed (a busy port, handlers that do not
            # import) leaves no database file behind it; nothing can have
            # been stored in it yet.
            _remove_sqlite_files(creates)
        raise


class _Started:
    """*task_status*, noting whether the server got as far as starting."""

    def __init__(self, task_status: trio.TaskStatus[list[str]]) -> None:
        self._task_status = task_status
        self.done = False

    def started(self, value: list[str] | None = None) -> None:
        self.done = True
        self._task_status.started([] if value is None else value)


def _remove_sqlite_files(path: str) -> None:
    for name in (path, f"{path}-wal", f"{path}-shm", f"{path}-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


async def run_server(
    engine: Engine,
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve` on an engine the caller opened (``config``'s store
    settings are not used)."""
    throttle = Throttle(
        burst=config.failed_credentials_burst,
        refill_secs=config.failed_credentials_refill_secs,
        clock=trio.current_time,
    )
    credentials = Credentials(
        worker_token=config.worker_token,
        tenants=config.tenants,
        dev=config.dev,
        metrics_token=config.metrics_token,
        throttle=throttle,
    )
    engine.metrics.set_limits(max_queues=config.metrics_queues, max_kinds=config.metrics_kinds)
    engine.max_answer_bytes = config.max_answer_bytes
    engine.session_idle_secs = config.session_idle_secs
    engine.session_lifetime_secs = config.session_lifetime_secs
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
            workers: list[Worker] = []
            if config.handlers and config.mode in ("worker", "all"):
                workers = await _start_handlers(front, engine, config)
                # One watchdog for them all: one blocked loop, one warning.
                background.start_soon(watch_blocking, DEFAULT_WARN_BLOCKED_SECS, workers)
            if config.mode in ("api", "all"):
                api_front = ApiFront(engine, credentials, throttle, max_body_bytes=config.max_body_bytes)
                app = ThrottleFront(create_app(engine, credentials), throttle)
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
                            max_connections_per_address=config.max_connections_per_address,
                            trusted_proxies=config.trusted_proxies,
                            front=api_front,
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
            for worker in workers:
                worker.stop()
            front.cancel_scope.deadline = trio.current_time() + config.graceful_timeout_secs
        background.cancel_scope.cancel()


async def _start_handlers(nursery: trio.Nursery, engine: Engine, config: Config) -> list[Worker]:
    from ..worker.registry import load_registry
    from .inprocess import EngineTransport

    registry = load_registry(config.handlers or "")
    workers = []
    for queue in config.handler_queues:
        worker = Worker(EngineTransport(engine), queue, registry, lanes=config.handler_lanes, warn_blocked_secs=None)
        workers.append(await nursery.start(worker.run))
    return workers
