"""A worker pool process: ``qftrio worker QUEUE[,QUEUE...] module:registry``.

Each queue gets a :class:`~qftrio.worker.runtime.Worker` of its own, with its
own lanes, lease loop, heartbeats and reports, on one shared client and one
blocked-loop watchdog: a backlog on one queue never takes the lanes of
another (a workflow's steps on ``default`` keep running while ``images``
drains), as with ``qftrio serve --handlers --queue A --queue B``.

Exit codes: 0 after a graceful stop (SIGINT/SIGTERM: finish held jobs), 130
when held jobs were cancelled (a second signal, or ``--shutdown-timeout``
ran out), 2 when the setup cannot work and
retrying would not change it: an unimportable registry or one with no
handlers, a bad option, a refused credential, a lease request the server
refuses (a ``--worker-id`` over its cap), a URL where no qftrio server
answers. Problems are one line on stderr, never a traceback; transport errors
and 5xx answers are retried.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

import trio

from .. import errors
from .._gc import settle_after_imports
from ..client import Client
from .registry import Registry, load_registry
from .runtime import DEFAULT_WARN_BLOCKED_SECS, Worker, validate_options, watch_blocking
from ..errors import UnexpectedAnswer
from .transport import HttpTransport

__all__ = ["run_worker_process"]

log = logging.getLogger("qftrio.worker")

#: Exit status after a second signal: like a shell's for SIGINT.
EXIT_CANCELLED = 130
EXIT_CONFIG = 2


def _say(message: str) -> None:
    print(f"qftrio worker: {message}", file=sys.stderr, flush=True)


def run_worker_process(
    *,
    url: str,
    token: str,
    queues: Sequence[str],
    registry_ref: str,
    lanes: int | None = None,
    batch: int | None = None,
    lease_secs: int = 60,
    wait_secs: float = 20,
    worker_id: str | None = None,
    shutdown_timeout: float | None = None,
    warn_blocked_secs: float | None = DEFAULT_WARN_BLOCKED_SECS,
) -> int:
    """Import the registry at *registry_ref* (``module:attr``) and run a
    :class:`~qftrio.worker.runtime.Worker` on each of *queues* of the server
    at *url* until a signal stops them. Returns the process's exit status."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        if not queues:
            raise errors.ConfigError("no queue to lease from")
        twice = sorted({queue for queue in queues if queues.count(queue) > 1})
        if twice:
            raise errors.ConfigError(f"queue {twice[0]!r} is given twice")
        registry = load_registry(registry_ref)
        options = dict(
            lanes=lanes,
            batch=batch,
            lease_secs=lease_secs,
            wait_secs=wait_secs,
            worker_id=worker_id,
            shutdown_timeout=shutdown_timeout,
        )
        for queue in queues:
            validate_options(queue, registry, warn_blocked_secs=warn_blocked_secs, **options)  # type: ignore[arg-type]
    except errors.ConfigError as exc:
        _say(str(exc))
        return EXIT_CONFIG
    settle_after_imports()
    try:
        return trio.run(_main, url, token, list(queues), registry, options, warn_blocked_secs)
    except errors.ConfigError as exc:
        _say(str(exc))
        return EXIT_CONFIG
    except KeyboardInterrupt:  # before the signal handlers were in place
        return EXIT_CANCELLED


async def _main(
    url: str, token: str, queues: list[str], registry: Registry, options: dict, warn_blocked_secs: float | None
) -> int:
    fatal: list[errors.QftrioError] = []
    # A call slower than half a lease is of no use to a heartbeat; long polls
    # get their wait on top of this.
    timeout = max(2.0, min(10.0, options["lease_secs"] / 2))
    async with Client(url, token, timeout=timeout) as client:
        transport = HttpTransport(client)
        # One watchdog for all: one blocked loop is one warning.
        workers = [Worker(transport, queue, registry, warn_blocked_secs=None, **options) for queue in queues]
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def run(worker: Worker) -> None:
                    try:
                        await worker.run()
                    except (errors.ApiError, UnexpectedAnswer) as exc:
                        fatal.append(exc)
                        for other in workers:
                            other.cancel()

                async def run_all() -> None:
                    try:
                        async with trio.open_nursery() as running:
                            for worker in workers:
                                running.start_soon(run, worker)
                    finally:
                        nursery.cancel_scope.cancel()

                nursery.start_soon(run_all)
                if warn_blocked_secs is not None:
                    nursery.start_soon(watch_blocking, warn_blocked_secs, workers)
                log.info("worker %s: leasing from %s at %s", workers[0].worker_id, ", ".join(map(repr, queues)), url)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not workers[0].statistics().stopping:
                        held = sum(worker.statistics().held for worker in workers)
                        log.info("%s: finishing %d held job(s); send it again to quit now", name, held)
                        for worker in workers:
                            worker.stop()
                    else:
                        log.warning("%s: cancelling held jobs; their leases will expire", name)
                        for worker in workers:
                            worker.cancel()
    if fatal:
        _say(_explain(url, fatal[0]))
        return EXIT_CONFIG
    return EXIT_CANCELLED if any(worker.statistics().cancelled for worker in workers) else 0


def _explain(url: str, exc: errors.QftrioError) -> str:
    """One line for an error that stopped the worker."""
    if isinstance(exc, UnexpectedAnswer):
        return f"the server at {url} does not answer as qftrio does: {exc}"
    assert isinstance(exc, errors.ApiError)
    if isinstance(exc, errors.Unauthorized):
        what = "refused the worker token"
    elif isinstance(exc, errors.Forbidden):
        what = "does not accept this token as a worker token"
    elif isinstance(exc, errors.NotFound):
        what = "has no qftrio worker routes (is it qftrio, serving workers?)"
    else:
        what = "refused the lease request"
    message = exc.message.strip().split("\n", 1)[0][:200]
    return f"the server at {url} {what} ({exc.status_code}: {message})"
