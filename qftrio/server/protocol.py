"""The hot routes: enqueue (single and batch), lease, heartbeat, complete and
fail (single and batch; snooze, rarer, sits with them), nearly every request
a busy server answers. They are served as every route is, by
:class:`~qftrio.server.front.ApiFront`.
"""

from __future__ import annotations

from typing import Any

import pydantic
import trio

from .. import errors
from ..models import (
    NAME,
    CompleteItem,
    CompleteManyRequest,
    CompleteRequest,
    EnqueueBatchRequest,
    EnqueueRequest,
    FailItem,
    FailManyRequest,
    FailRequest,
    HeartbeatAnswer,
    HeartbeatItem,
    HeartbeatManyRequest,
    HeartbeatRequest,
    JobAnswer,
    JobsAnswer,
    LeaseRequest,
    LeasesAnswer,
    Outcome,
    ProgressItem,
    ProgressRequest,
    ReportResultsAnswer,
    SnoozeItem,
    SnoozeManyRequest,
    SnoozeRequest,
    StepsAddRequest,
    WorkflowAnswer,
    format_time,
)
from .engine import Engine
from .envelope import Call, Caller, Handler, Reply, Route
from .store.base import HeartbeatResult, ReportResult

__all__ = ["ROUTES"]

_CONFLICT_MESSAGE = "the lease token is not the job's current one, or the job was cancelled"


def _heartbeat_wire(result: HeartbeatResult) -> dict[str, Any]:
    assert result.status is not None
    out: dict[str, Any] = {"status": result.status.value}
    if result.locked_until is not None:
        out["locked_until"] = format_time(result.locked_until)
    return out


def _refuse(outcome: Outcome, conflict: str) -> None:
    """Raise the error answer of a report that did not land (the single
    routes; the batch routes give each item :meth:`Outcome.code`)."""
    if outcome is Outcome.NOT_FOUND:
        raise errors.NotFound("job not found")
    if outcome is Outcome.CONFLICT:
        raise errors.Conflict(conflict, code="lease_lost")


def _report_reply(result: ReportResult) -> Reply:
    _refuse(result.outcome, _CONFLICT_MESSAGE)
    return result.outcome.code(), None


# -- the routes ----------------------------------------------------------------


async def enqueue(engine: Engine, call: Call) -> Reply:
    """Enqueue a job (200 with the first job for a repeated idempotency key)."""
    assert call.tenant is not None
    (inserted,) = await engine.enqueue(call.tenant, [call.body])
    return (201 if inserted.created else 200), inserted.to_wire()


async def enqueue_batch(engine: Engine, call: Call) -> Reply:
    """Enqueue up to 1000 jobs in one transaction."""
    assert call.tenant is not None
    inserted = await engine.enqueue(call.tenant, call.body.jobs)
    return 201, {"jobs": [i.to_wire() for i in inserted]}


async def lease(engine: Engine, call: Call) -> Reply:
    """Claim jobs of a queue, waiting up to ``wait_secs`` for one."""
    body: LeaseRequest = call.body
    leases = await engine.lease(
        call.path["queue"],
        max_jobs=body.max_jobs,
        lease_secs=body.lease_secs,
        wait_secs=body.wait_secs,
        worker_id=body.worker_id,
    )
    return 200, {"jobs": [lease.to_wire() for lease in leases]}


async def heartbeat(engine: Engine, call: Call) -> Reply:
    """Extend a lease, or learn that the job no longer runs."""
    body: HeartbeatRequest = call.body
    (result,) = await engine.heartbeat([HeartbeatItem(call.path["job_id"], body.lease_token, body.extend_secs)])
    _refuse(result.outcome, "the lease token is not the job's current one")
    return result.outcome.code(heartbeat=True), _heartbeat_wire(result)


async def progress(engine: Engine, call: Call) -> Reply:
    """Record how far a job's handler has got (latest wins), extending nothing."""
    body: ProgressRequest = call.body
    (result,) = await engine.progress([ProgressItem(call.path["job_id"], body.lease_token, body.progress)])
    _refuse(result.outcome, "the lease token is not the job's current one")
    return result.outcome.code(heartbeat=True), _heartbeat_wire(result)


async def complete(engine: Engine, call: Call) -> Reply:
    """Complete a job with its result."""
    body: CompleteRequest = call.body
    (result,) = await engine.complete([CompleteItem(call.path["job_id"], body.lease_token, body.result)])
    return _report_reply(result)


async def fail(engine: Engine, call: Call) -> Reply:
    """Fail a job: retried after a backoff while attempts are left, else dead-lettered."""
    body: FailRequest = call.body
    (result,) = await engine.fail(
        [FailItem(call.path["job_id"], body.lease_token, body.error, body.retryable, body.retry_in_secs)]
    )
    return _report_reply(result)


async def snooze(engine: Engine, call: Call) -> Reply:
    """Put a job back to pending for ``delay_secs``, its attempt not used up."""
    body: SnoozeRequest = call.body
    (result,) = await engine.snooze([SnoozeItem(call.path["job_id"], body.lease_token, body.delay_secs)])
    return _report_reply(result)


async def steps_add(engine: Engine, call: Call) -> Reply:
    """Add steps to the workflow of a running step (fan-out), their results
    collected under a context key if asked (fan-in)."""
    return 201, (await engine.steps_add(call.path["job_id"], call.body)).to_wire()


# Batch forms of the three reports: one request, one transaction, a result
# per item with the status code the single route would give.


async def heartbeat_many(engine: Engine, call: Call) -> Reply:
    """Heartbeat many leases."""
    items = call.body.items
    results = await engine.heartbeat([HeartbeatItem(i.id, i.lease_token, i.extend_secs, i.progress) for i in items])
    out = []
    for item, result in zip(items, results):
        answer = {"id": item.id, "code": result.outcome.code(heartbeat=True)}
        if result.outcome is Outcome.OK:
            answer.update(_heartbeat_wire(result))
        out.append(answer)
    return 200, {"results": out}


async def complete_many(engine: Engine, call: Call) -> Reply:
    """Complete many jobs."""
    items = call.body.items
    results = await engine.complete([CompleteItem(i.id, i.lease_token, i.result) for i in items])
    return 200, {"results": [{"id": i.id, "code": r.outcome.code()} for i, r in zip(items, results)]}


async def fail_many(engine: Engine, call: Call) -> Reply:
    """Fail many jobs."""
    items = call.body.items
    results = await engine.fail([FailItem(i.id, i.lease_token, i.error, i.retryable, i.retry_in_secs) for i in items])
    return 200, {"results": [{"id": i.id, "code": r.outcome.code()} for i, r in zip(items, results)]}


async def snooze_many(engine: Engine, call: Call) -> Reply:
    """Snooze many jobs."""
    items = call.body.items
    results = await engine.snooze([SnoozeItem(i.id, i.lease_token, i.delay_secs) for i in items])
    return 200, {"results": [{"id": i.id, "code": r.outcome.code()} for i, r in zip(items, results)]}


def _long_poll(call: Call) -> bool:
    return call.body.wait_secs > 0


def _hot(
    path: str,
    handler: Handler,
    caller: Caller,
    body: type[pydantic.BaseModel],
    answers: dict[int, type[pydantic.BaseModel] | None],
    errors: tuple[int, ...] = (),
    **more: Any,
) -> Route:
    return Route("POST", path, handler, caller, answers, errors, body=body, **more)


ROUTES: list[Route] = [
    _hot("/api/v1/jobs", enqueue, "tenant", EnqueueRequest, {200: JobAnswer, 201: JobAnswer}),
    _hot("/api/v1/jobs/batch", enqueue_batch, "tenant", EnqueueBatchRequest, {201: JobsAnswer}),
    _hot("/api/v1/queues/<queue>/lease", lease, "worker", LeaseRequest, {200: LeasesAnswer}, path_params={"queue": NAME}, waits=_long_poll),
    _hot("/api/v1/jobs/<job_id>/heartbeat", heartbeat, "worker", HeartbeatRequest, {200: HeartbeatAnswer}, (404, 409)),
    _hot("/api/v1/jobs/<job_id>/progress", progress, "worker", ProgressRequest, {200: HeartbeatAnswer}, (404, 409)),
    _hot("/api/v1/jobs/<job_id>/complete", complete, "worker", CompleteRequest, {204: None}, (404, 409)),
    _hot("/api/v1/jobs/<job_id>/fail", fail, "worker", FailRequest, {204: None}, (404, 409)),
    _hot("/api/v1/jobs/<job_id>/snooze", snooze, "worker", SnoozeRequest, {204: None}, (404, 409)),
    _hot("/api/v1/jobs/<job_id>/steps", steps_add, "worker", StepsAddRequest, {201: WorkflowAnswer}, (404, 409, 422)),
    _hot("/api/v1/leases/heartbeat", heartbeat_many, "worker", HeartbeatManyRequest, {200: ReportResultsAnswer}),
    _hot("/api/v1/leases/complete", complete_many, "worker", CompleteManyRequest, {200: ReportResultsAnswer}),
    _hot("/api/v1/leases/fail", fail_many, "worker", FailManyRequest, {200: ReportResultsAnswer}),
    _hot("/api/v1/leases/snooze", snooze_many, "worker", SnoozeManyRequest, {200: ReportResultsAnswer}),
]
