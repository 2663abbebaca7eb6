"""Schedules' firing: every due tick of every schedule enqueues one job,
whichever server's janitor round wins the tick (the store's transaction
decides), and a trigger enqueues one besides the ticks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..models import EnqueueRequest
from .new_jobs import new_job
from .store.base import Inserted, NewJob, Store

__all__ = ["SCHEDULES_BATCH", "fire_due", "job_of_schedule"]

#: Due schedules per transaction of a janitor round.
SCHEDULES_BATCH = 100


def job_of_schedule(tenant: str, name: str, job: dict[str, Any], tick: float) -> NewJob:
    """The job schedule *name* of *tenant* enqueues at *tick*, from the job
    it keeps (the request as it was checked when the schedule was put)."""
    return new_job(tenant, EnqueueRequest.model_validate(job), tick, schedule=name)


async def fire_due(
    store: Store,
    clock: Callable[[], float],
    enqueued: Callable[[Sequence[Inserted]], None],
    *,
    batch: int = SCHEDULES_BATCH,
) -> int:
    """Fire every due tick, *batch* schedules per transaction, telling
    *enqueued* of each transaction's jobs; returns how many it enqueued."""
    fired = 0
    while True:
        taken, inserted = await store.schedules_fire(now=clock(), limit=batch, job_of=job_of_schedule)
        enqueued(inserted)
        fired += len(inserted)
        if taken < batch:
            return fired
