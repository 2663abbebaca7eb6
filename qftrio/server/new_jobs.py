"""The job an enqueue request asks for, as the stores insert it: an enqueue's
and a schedule's tick alike."""

from __future__ import annotations

from ..models import EnqueueRequest, parse_time
from .store.base import NewJob

__all__ = ["new_job"]


def new_job(tenant: str, job: EnqueueRequest, now: float, *, schedule: str | None = None) -> NewJob:
    """The job an enqueue request asks for at *now* (a schedule's tick: the
    tick's time, its ``delay_secs`` counted from it)."""
    cfg = job.config
    if cfg.scheduled_at is not None:
        scheduled_at = parse_time(cfg.scheduled_at) or 0.0
    elif cfg.delay_secs:
        scheduled_at = now + cfg.delay_secs
    else:
        scheduled_at = now
    return NewJob(
        tenant=tenant,
        queue=cfg.queue,
        kind=job.kind,
        payload=job.payload,
        priority=cfg.priority,
        max_attempts=cfg.max_attempts,
        scheduled_at=scheduled_at,
        idempotency_key=cfg.idempotency_key,
        timeout_secs=cfg.timeout_secs,
        backoff=None if cfg.backoff is None else cfg.backoff.model_dump(),
        headers=cfg.headers or None,
        schedule=schedule,
        concurrency=None if cfg.concurrency is None else cfg.concurrency.model_dump(),
        rate_limit=cfg.rate_limit,
        unique=None if cfg.unique is None else cfg.unique.model_dump(),
    )
