"""Handlers for the benchmarks: ``qftrio worker QUEUE noop_handlers:registry``
(with ``benchmarks/`` on ``PYTHONPATH``; the benchmarks set it).

* ``noop``: returns ``{}`` at once; with ``QFTRIO_BENCH_NOOP_SLEEP=SECS`` in the
  worker's environment it sleeps that long first (a handler that waits on
  another service), so that the throughput benchmarks can drain sleeping jobs.
* ``stamp``: records when it started. With ``QFTRIO_BENCH_STAMPS=FILE``, appends
  ``<job payload "t"> <time.time() at handler start>`` to FILE, one line per job
  (the enqueuer puts its own ``time.time()`` just before sending in ``"t"``).
"""

from __future__ import annotations

import os
import time

import trio

# Submodule imports on purpose: they work even where ``import qftrio`` resolves
# to a namespace package (a stale editable install), see docs/performance.md.
from qftrio.models import Job
from qftrio.worker.registry import Registry

registry = Registry()

_STAMPS = os.environ.get("QFTRIO_BENCH_STAMPS")
_SLEEP = float(os.environ.get("QFTRIO_BENCH_NOOP_SLEEP") or 0)


@registry.handler("noop")
async def noop(job: Job) -> dict:
    if _SLEEP:
        await trio.sleep(_SLEEP)
    return {}


@registry.handler("stamp")
async def stamp(job: Job) -> dict:
    started = time.time()
    if _STAMPS:
        with open(_STAMPS, "a") as f:
            f.write(f"{job.payload.get('t', 0)!r} {started!r} {job.id}\n")
    return {}
