"""The worker protocol against the engine of this process
(``qftrio serve --handlers``): the worker runtime's
:class:`~qftrio.worker.transport.Transport`, with the same semantics as over
HTTP and no HTTP. Batching still pays: one store transaction carries many
reports."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import Any

from .. import errors
from ..models import (
    to_datetime,
    CompleteItem, FailItem, HeartbeatItem, HeartbeatReply, Lease, ReportReply, SnoozeItem, StepsAddRequest, Workflow, refuse_nul,
)
from ..worker.transport import Transport
from .engine import Engine

__all__ = ["EngineTransport"]

log = logging.getLogger("qftrio.worker")


class EngineTransport(Transport):
    """The protocol against *engine*, in the same process."""

    coalesce_secs = 0.001

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def _call(self, what: str, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except errors.QftrioError:
            raise
        except Exception as exc:
            # The store is the only thing in here that fails for reasons of its
            # own (a locked or vanished database). The runtime retries what it
            # sees as a transport error, which is what this is to it.
            log.warning("engine %s failed: %s: %s", what, type(exc).__name__, exc)
            raise errors.TransportError(f"engine {what}: {type(exc).__name__}: {exc}") from None

    async def lease(
        self, queue: str, *, max_jobs: int, lease_secs: int, wait_secs: float, worker_id: str | None
    ) -> list[Lease]:
        return await self._call(
            "lease",
            self.engine.lease(queue, max_jobs=max_jobs, lease_secs=lease_secs, wait_secs=wait_secs, worker_id=worker_id),
        )

    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        results = await self._call("heartbeat", self.engine.heartbeat(items))
        return [
            HeartbeatReply(
                job_id=item.job_id,
                outcome=r.outcome,
                status=r.status.value if r.status is not None else None,
                locked_until=to_datetime(r.locked_until),
            )
            for item, r in zip(items, results, strict=True)
        ]

    # What the HTTP routes' models refuse, refused here too, so that both
    # stores keep the same results and errors in-process as over HTTP.

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        for item in items:
            refuse_nul(item.result, "result")
        results = await self._call("complete", self.engine.complete(items))
        return [ReportReply(job_id=i.job_id, outcome=r.outcome) for i, r in zip(items, results, strict=True)]

    async def fail(self, items: Sequence[FailItem]) -> list[ReportReply]:
        for item in items:
            refuse_nul(item.error, "error")
        results = await self._call("fail", self.engine.fail(items))
        return [ReportReply(job_id=i.job_id, outcome=r.outcome) for i, r in zip(items, results, strict=True)]

    async def snooze(self, items: Sequence[SnoozeItem]) -> list[ReportReply]:
        results = await self._call("snooze", self.engine.snooze(items))
        return [ReportReply(job_id=i.job_id, outcome=r.outcome) for i, r in zip(items, results, strict=True)]

    async def steps_add(self, job_id: str, body: StepsAddRequest) -> Workflow:
        return await self._call("steps_add", self.engine.steps_add(job_id, body))  # type: ignore[no-any-return]
