"""Example handlers. Against a development server (``qftrio serve --dev``,
whose tenant ``default`` has the token ``dev``, which is also accepted as a
worker token there), run them with

    cd examples
    QFTRIO_WORKER_TOKEN=dev qftrio worker images handlers:registry

and enqueue work from another shell, with a tenant token:

    QFTRIO_TOKEN=dev qftrio enqueue resize-image '{"src": "cat.png", "width": 320}' --queue images

Against a production server, use its worker token for the worker and a
tenant's token for ``enqueue``.

Handlers must be safe to run twice (delivery is at-least-once): pass
``job.id`` to other services as an idempotency key.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import trio

import qftrio
from qftrio import Job, PermanentError

registry = qftrio.Registry()

_FORMATS = {"png", "jpg", "jpeg", "webp"}


@registry.handler("resize-image", timeout=30)
async def resize_image(job: Job) -> dict[str, Any]:
    """Pretend to resize an image: validates the payload, "works" for
    ``payload["secs"]`` seconds (default 0.2), and names the output file.

    A malformed payload will never work, so it fails permanently; anything
    else that goes wrong is retried with backoff.
    """
    src = job.payload.get("src")
    width = job.payload.get("width", 256)
    if not isinstance(src, str) or src.rsplit(".", 1)[-1].lower() not in _FORMATS:
        raise PermanentError(f"src must be an image file name ({', '.join(sorted(_FORMATS))}), got {src!r}")
    if not isinstance(width, int) or not 1 <= width <= 10_000:
        raise PermanentError(f"width must be an integer from 1 to 10000, got {width!r}")
    # A real handler would call an image service here. Cancellation (the job
    # was cancelled, or its lease was lost) arrives at this checkpoint.
    await trio.sleep(float(job.payload.get("secs", 0.2)))
    stem, ext = src.rsplit(".", 1)
    return {"output": f"{stem}-{width}w.{ext}", "width": width, "attempt": job.attempt}


@registry.handler("checksum")
def checksum(job: Job) -> dict[str, Any]:
    """A synchronous (CPU-bound) handler: it runs in a worker thread."""
    data = str(job.payload.get("text", "")).encode()
    return {"sha256": hashlib.sha256(data).hexdigest()}


@registry.handler("sleep")
async def sleep(job: Job) -> dict[str, Any]:
    """Sleeps ``payload["secs"]`` seconds; handy to watch heartbeats and
    cancellation. ``payload["fail_attempts"]`` makes the first N attempts
    raise, to watch retries."""
    if job.attempt <= int(job.payload.get("fail_attempts", 0)):
        raise RuntimeError(f"attempt {job.attempt} fails on purpose")
    started = time.time()
    await trio.sleep(float(job.payload.get("secs", 1)))
    return {"slept": round(time.time() - started, 3), "attempt": job.attempt, "worker": job.worker_id}
