"""The janitor: the loop every server runs beside its requests, which fires
due schedules, reaps expired leases, compacts the store's counts, prunes old
jobs and purges old sightings and ended dashboard sessions."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

import trio

from .. import errors
from ..models import Status
from .metrics import Metrics
from .store.base import RetryPolicy, Store
from .waker import Waker


class Engine(Protocol):
    """What the janitor uses of :class:`~qftrio.server.engine.Engine`,
    named here so that this module does not import the engine back."""

    store: Store
    clock: Callable[[], float]
    policy: RetryPolicy
    metrics: Metrics
    waker: Waker
    PURGE_EVERY_SECS: float
    WORKERS_SEEN_SECS: float

    async def fire_schedules(self) -> int: ...

    async def reap_expired(self) -> int: ...

__all__ = ["reap_expired", "run_janitor"]

log = logging.getLogger("qftrio.engine")


async def reap_expired(engine: Engine) -> int:
    """Take back the jobs whose lease ran out (a failed attempt each,
    retried or dead-lettered), counting them and waking the polls they made
    work for; returns how many."""
    reaped = await engine.store.jobs_reap_expired(now=engine.clock(), retry_at=engine.policy.retry_at)
    metrics = engine.metrics
    for r in reaped:
        # a lost lease or a timeout is a failed attempt, retried or dead-lettered
        metrics.of(metrics.failed, r.queue, r.kind).inc()
        if r.status is Status.FAILED:
            metrics.of(metrics.dead_lettered, r.queue, r.kind).inc()
    engine.waker.after_change(
        {r.queue for r in reaped if r.status is Status.PENDING}, freed=any(r.keyed for r in reaped)
    )
    return len(reaped)


async def run_janitor(
    engine: Engine,
    *,
    interval_secs: float,
    retention_secs: float | None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:meth:`Engine.run_janitor`'s loop, until cancelled."""
    task_status.started()
    purged_at = -math.inf
    while True:
        try:
            await engine.fire_schedules()
            await engine.reap_expired()
            await engine.store.counts_fold()
            if retention_secs is not None:
                await engine.store.jobs_prune(before=engine.clock() - retention_secs)
            now = engine.clock()
            if now - purged_at >= engine.PURGE_EVERY_SECS:
                await engine.store.sightings_purge(before=now - engine.WORKERS_SEEN_SECS)
                await engine.store.sessions_purge(now=now)
                purged_at = now
        except errors.Unavailable as exc:
            log.warning("janitor round failed: %s; retrying", exc)
        except Exception:
            log.warning("janitor round failed; retrying", exc_info=True)
        await trio.sleep(interval_secs)
