"""Embedding a qftrio worker in your own Trio program.

The worker is one more task in your nursery: it starts with
``await nursery.start(worker.run)``, which hands back the worker itself, with
``stop()`` (lease nothing more, finish held jobs) and ``cancel()`` (stop now).
Here the program also serves its own purpose, a heartbeat line every few
seconds, and stops gracefully on Ctrl+C, at once on a second one.

    QFTRIO_URL=http://127.0.0.1:8000 QFTRIO_WORKER_TOKEN=... python embed.py
"""

from __future__ import annotations

import logging
import os
import signal

import trio

import qftrio
from handlers import registry
from qftrio import Client, HttpTransport, Worker, WorkerEvent

log = logging.getLogger("embed")


def on_event(event: WorkerEvent) -> None:
    # Called for every worker event; must not block. Feed your metrics here.
    if event.type in ("failed", "lost", "unreported"):
        log.warning("job trouble: %s", event)


async def report_progress(worker: Worker) -> None:
    while True:
        stats = worker.statistics()
        log.info("holding %d job(s), %d running", stats.held, stats.running)
        await trio.sleep(5)


async def main() -> None:
    env = os.environ.get
    url = env("QFTRIO_URL") or env("QUEUEFLOW_URL") or "http://127.0.0.1:8000"
    token = env("QFTRIO_WORKER_TOKEN") or env("QUEUEFLOW_WORKER_TOKEN") or "dev"
    async with Client(url, token) as client:
        worker = Worker(HttpTransport(client), "images", registry, lanes=8, lease_secs=30, on_event=on_event)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def run_worker() -> None:
                    try:
                        await worker.run()
                    except (qftrio.Unauthorized, qftrio.Forbidden) as exc:
                        log.error("the server refused the worker token: %s", exc)
                    finally:
                        # The worker is done (drained, cancelled, or refused
                        # by the server): so is the rest of this program.
                        nursery.cancel_scope.cancel()

                nursery.start_soon(run_worker)
                nursery.start_soon(report_progress, worker)
                async for _ in signals:
                    if worker.statistics().stopping:
                        worker.cancel()
                    else:
                        log.info("stopping: finishing held jobs (again to quit now)")
                        worker.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trio.run(main)
