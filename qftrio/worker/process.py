"""A worker pool process: ``qftrio worker QUEUE module:registry``.

Exit codes: 0 after a graceful stop (SIGINT/SIGTERM: finish held jobs), 130
when a second signal cancelled everything, 2 when the setup cannot work and
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

import trio

from .. import errors
from .._gc import settle_after_imports
from ..client import Client
from .registry import Registry, load_registry
from .runtime import Worker, validate_options
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
    queue: str,
    registry_ref: str,
    lanes: int | None = None,
    batch: int | None = None,
    lease_secs: int = 60,
    wait_secs: float = 20,
    worker_id: str | None = None,
) -> int:
    """Import the registry at *registry_ref* (``module:attr``) and run a
    :class:`~qftrio.worker.runtime.Worker` on *queue* of the server at *url*
    until a signal stops it. Returns the process's exit status."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        registry = load_registry(registry_ref)
        validate_options(
            queue, registry, lanes=lanes, batch=batch, lease_secs=lease_secs, wait_secs=wait_secs, worker_id=worker_id
        )
    except errors.ConfigError as exc:
        _say(str(exc))
        return EXIT_CONFIG
    settle_after_imports()
    options = dict(lanes=lanes, batch=batch, lease_secs=lease_secs, wait_secs=wait_secs, worker_id=worker_id)
    try:
        return trio.run(_main, url, token, queue, registry, options)
    except errors.ConfigError as exc:
        _say(str(exc))
        return EXIT_CONFIG
    except KeyboardInterrupt:  # before the signal handlers were in place
        return EXIT_CANCELLED


async def _main(url: str, token: str, queue: str, registry: Registry, options: dict) -> int:
    fatal: list[errors.QftrioError] = []
    cancelled = False
    # A call slower than half a lease is of no use to a heartbeat; long polls
    # get their wait on top of this.
    timeout = max(2.0, min(10.0, options["lease_secs"] / 2))
    async with Client(url, token, timeout=timeout) as client:
        worker = Worker(HttpTransport(client), queue, registry, **options)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    try:
                        await worker.run()
                    except (errors.ApiError, UnexpectedAnswer) as exc:
                        fatal.append(exc)
                    finally:
                        nursery.cancel_scope.cancel()

                nursery.start_soon(run)
                log.info("worker %s: leasing from %r at %s", worker.worker_id, queue, url)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not worker.statistics().stopping:
                        held = worker.statistics().held
                        log.info("%s: finishing %d held job(s); send it again to quit now", name, held)
                        worker.stop()
                    else:
                        log.warning("%s: cancelling held jobs; their leases will expire", name)
                        cancelled = True
                        worker.cancel()
    if fatal:
        _say(_explain(url, fatal[0]))
        return EXIT_CONFIG
    return EXIT_CANCELLED if cancelled else 0


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
