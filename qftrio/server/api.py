"""The application API's routes (tenant tokens) and the health check.

Enqueue lives with the worker protocol's hot routes
(:mod:`qftrio.server.protocol`); everything else a tenant calls is here.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from ..models import (
    NAME,
    BulkRequest,
    CountAnswer,
    EmptyBody,
    HealthAnswer,
    JobAnswer,
    JobsListQuery,
    JobWaitQuery,
    JobsPageAnswer,
    QueueStatsAnswer,
    QueuesAnswer,
    QueuesListQuery,
    ScheduleAnswer,
    ScheduleRequest,
    SchedulesAnswer,
    SchedulesListQuery,
    ScheduleTriggerAnswer,
    RateLimitAnswer,
    RateLimitRequest,
    RateLimitsAnswer,
    Status,
    WorkflowAnswer,
    WorkflowCreateRequest,
    WorkflowsListQuery,
    WorkflowsPageAnswer,
    WorkersAnswer,
    parse_time,
)
from . import transitions
from .engine import Engine
from .envelope import Call, Reply, Route
from .protocol import ROUTES as PROTOCOL_ROUTES
from .store.base import BulkAction

__all__ = ["ROUTES", "ALL_ROUTES"]


async def healthz(engine: Engine, call: Call) -> Reply:
    """Whether the server can reach its database."""
    try:
        await engine.store.ping()
    except Exception:
        return 503, {"status": "unavailable"}
    return 200, {"status": "ok"}


def _tenant(call: Call) -> str:
    assert call.tenant is not None
    return call.tenant


async def job_get(engine: Engine, call: Call) -> Reply:
    """A job."""
    return 200, (await engine.job_get(_tenant(call), call.path["job_id"])).to_wire()


async def job_wait(engine: Engine, call: Call) -> Reply:
    """A job once it has ended (completed, failed, cancelled), or as it
    stands when ``timeout_secs`` (0 to 60, default 30) have passed."""
    q: JobWaitQuery = call.query
    return 200, (await engine.job_wait(_tenant(call), call.path["job_id"], q.timeout_secs)).to_wire()


def _waits(call: Call) -> bool:
    return bool(call.query.timeout_secs > 0)


async def jobs_list(engine: Engine, call: Call) -> Reply:
    """A page of the tenant's jobs, newest first, filtered."""
    q: JobsListQuery = call.query
    jobs, cursor = await engine.jobs_list(
        _tenant(call), queue=q.queue, status=q.status, kind=q.kind, limit=q.limit, cursor=q.cursor or None
    )
    return 200, {"jobs": [j.to_wire() for j in jobs], "next_cursor": cursor}


async def job_cancel(engine: Engine, call: Call) -> Reply:
    """Cancel a pending or running job."""
    return 200, (await engine.job_cancel(_tenant(call), call.path["job_id"])).to_wire()


async def job_retry(engine: Engine, call: Call) -> Reply:
    """Send a failed or cancelled job back to pending, with a fresh attempt budget."""
    return 200, (await engine.job_retry(_tenant(call), call.path["job_id"])).to_wire()


async def workflow_create(engine: Engine, call: Call) -> Reply:
    """Create a workflow; its steps without dependencies are enqueued at once."""
    return 201, (await engine.workflow_create(_tenant(call), call.body)).to_wire()


async def workflow_get(engine: Engine, call: Call) -> Reply:
    """A workflow, every step with its job."""
    return 200, (await engine.workflow_get(_tenant(call), call.path["workflow_id"])).to_wire()


async def workflows_list(engine: Engine, call: Call) -> Reply:
    """A page of the tenant's workflows, newest first (steps without their jobs)."""
    q: WorkflowsListQuery = call.query
    workflows, cursor = await engine.workflows_list(_tenant(call), status=q.status, limit=q.limit, cursor=q.cursor or None)
    return 200, {"workflows": [w.to_wire() for w in workflows], "next_cursor": cursor}


async def workflow_cancel(engine: Engine, call: Call) -> Reply:
    """Cancel a running workflow and its unfinished steps."""
    return 200, (await engine.workflow_cancel(_tenant(call), call.path["workflow_id"])).to_wire()


async def queues(engine: Engine, call: Call) -> Reply:
    """A page of the queues the tenant has jobs in or paused, by name, with their backlog."""
    q: QueuesListQuery = call.query
    stats, cursor = await engine.queues_page(_tenant(call), limit=q.limit, cursor=q.cursor or None)
    return 200, {"queues": [s.to_wire() for s in stats], "next_cursor": cursor}


async def queue_stats(engine: Engine, call: Call) -> Reply:
    """A queue's backlog."""
    (stats,) = await engine.queues_stats(_tenant(call), call.path["queue"])
    return 200, stats.to_wire()


async def queue_pause(engine: Engine, call: Call) -> Reply:
    """Pause a queue on every server: leases hand out none of its jobs; running jobs go on and report."""
    return 200, (await engine.queue_pause(_tenant(call), call.path["queue"])).to_wire()


async def queue_resume(engine: Engine, call: Call) -> Reply:
    """Resume a paused queue; its waiting long polls look again at once."""
    return 200, (await engine.queue_resume(_tenant(call), call.path["queue"])).to_wire()


def _as_shown(bound: Any) -> float | None:
    # Jobs show their times rounded to the microsecond: a bound half a
    # microsecond earlier compares a job as the time it shows, so that a
    # job's own created_at, given back, takes it in (after) or leaves it out
    # (before).
    at = parse_time(bound)
    return None if at is None else at - 0.5e-6


def _bulk_request(action: BulkAction) -> type[BulkRequest]:
    """The body of one bulk action: :class:`~qftrio.models.BulkRequest`
    with ``status`` one of the statuses the action applies to, so that
    /openapi.json says which."""
    statuses = tuple(status.value for status in transitions.BULK_STATUSES[action])
    return pydantic.create_model(  # type: ignore[no-any-return, call-overload]
        f"Bulk{action.capitalize()}Request",
        __base__=BulkRequest,
        __doc__=BulkRequest.__doc__,
        status=(Literal[statuses] | None, None),  # type: ignore[valid-type]
    )


async def _bulk(engine: Engine, call: Call, action: BulkAction) -> Reply:
    b: BulkRequest = call.body
    count = await engine.jobs_bulk(
        _tenant(call), action, queue=b.queue, status=None if b.status is None else Status(b.status), kind=b.kind,
        created_after=_as_shown(b.created_after), created_before=_as_shown(b.created_before), limit=b.limit,
    )  # fmt: skip
    return 200, {"count": count}


async def jobs_bulk_retry(engine: Engine, call: Call) -> Reply:
    """Retry the matching failed or cancelled jobs, as one retry each would; answers how many."""
    return await _bulk(engine, call, "retry")


async def jobs_bulk_cancel(engine: Engine, call: Call) -> Reply:
    """Cancel the matching pending or running jobs, as one cancel each would; answers how many."""
    return await _bulk(engine, call, "cancel")


async def jobs_bulk_delete(engine: Engine, call: Call) -> Reply:
    """Delete the matching finished jobs (a workflow's steps are kept with it); answers how many."""
    return await _bulk(engine, call, "delete")


async def rate_limit_set(engine: Engine, call: Call) -> Reply:
    """Declare or change a rate limit: at most ``limit`` claims of the tenant's jobs naming it in any window of ``per_secs``, across every server."""
    body: RateLimitRequest = call.body
    limit, created = await engine.rate_limit_set(_tenant(call), call.path["name"], body.limit, body.per_secs)
    return (201 if created else 200), limit.to_wire()


async def rate_limit_get(engine: Engine, call: Call) -> Reply:
    """A rate limit, and when a job it holds back can next be claimed."""
    return 200, (await engine.rate_limit_get(_tenant(call), call.path["name"])).to_wire()


async def rate_limits_list(engine: Engine, call: Call) -> Reply:
    """The tenant's rate limits, by name."""
    return 200, {"rate_limits": [r.to_wire() for r in await engine.rate_limits_list(_tenant(call))]}


async def rate_limit_delete(engine: Engine, call: Call) -> Reply:
    """Forget a rate limit: jobs naming it are no longer held back by it."""
    await engine.rate_limit_delete(_tenant(call), call.path["name"])
    return 204, None


async def workers(engine: Engine, call: Call) -> Reply:
    """The workers seen in the last few minutes that hold the tenant's running jobs or leased a
    queue holding its jobs, idle ones included: the jobs each holds, its queues, when last seen."""
    return 200, {"workers": [w.to_wire() for w in await engine.workers(_tenant(call))]}


async def schedule_put(engine: Engine, call: Call) -> Reply:
    """Create (201) or replace (200) a cron schedule: each tick enqueues one job, on whichever server."""
    schedule, created = await engine.schedule_put(_tenant(call), call.path["name"], call.body)
    return (201 if created else 200), schedule.to_wire()


async def schedule_get(engine: Engine, call: Call) -> Reply:
    """A schedule: its next and last run, its last job."""
    return 200, (await engine.schedule_get(_tenant(call), call.path["name"])).to_wire()


async def schedules_list(engine: Engine, call: Call) -> Reply:
    """A page of the tenant's schedules, by name."""
    q: SchedulesListQuery = call.query
    found, cursor = await engine.schedules_list(_tenant(call), limit=q.limit, cursor=q.cursor)
    return 200, {"schedules": [s.to_wire() for s in found], "next_cursor": cursor}


async def schedule_delete(engine: Engine, call: Call) -> Reply:
    """Delete a schedule; the jobs it enqueued stay."""
    await engine.schedule_delete(_tenant(call), call.path["name"])
    return 204, None


async def schedule_pause(engine: Engine, call: Call) -> Reply:
    """Pause a schedule: no tick fires until it is resumed."""
    return 200, (await engine.schedule_pause(_tenant(call), call.path["name"])).to_wire()


async def schedule_resume(engine: Engine, call: Call) -> Reply:
    """Resume a schedule from its next tick (the ticks of the pause are not caught up)."""
    return 200, (await engine.schedule_resume(_tenant(call), call.path["name"])).to_wire()


async def schedule_trigger(engine: Engine, call: Call) -> Reply:
    """Enqueue one job of the schedule now, besides its ticks."""
    schedule, job = await engine.schedule_trigger(_tenant(call), call.path["name"])
    return 201, {"schedule": schedule.to_wire(), "job": job.to_wire()}


_SCHEDULE = {"name": NAME}

ROUTES: list[Route] = [
    Route("GET", "/healthz", healthz, "anyone", {200: HealthAnswer, 503: HealthAnswer}),
    Route("GET", "/api/v1/jobs/<job_id>", job_get, "tenant", {200: JobAnswer}, (404,)),
    Route("GET", "/api/v1/jobs/<job_id>/wait", job_wait, "tenant", {200: JobAnswer}, (404, 429), query=JobWaitQuery,
          waits=_waits),
    Route("GET", "/api/v1/jobs", jobs_list, "tenant", {200: JobsPageAnswer}, query=JobsListQuery),
    Route("POST", "/api/v1/jobs/<job_id>/cancel", job_cancel, "tenant", {200: JobAnswer}, (404, 409), body=EmptyBody),
    Route("POST", "/api/v1/jobs/<job_id>/retry", job_retry, "tenant", {200: JobAnswer}, (404, 409), body=EmptyBody),
    Route("POST", "/api/v1/workflows", workflow_create, "tenant", {201: WorkflowAnswer}, body=WorkflowCreateRequest),
    Route("GET", "/api/v1/workflows/<workflow_id>", workflow_get, "tenant", {200: WorkflowAnswer}, (404,)),
    Route("GET", "/api/v1/workflows", workflows_list, "tenant", {200: WorkflowsPageAnswer}, query=WorkflowsListQuery),
    Route(
        "POST", "/api/v1/workflows/<workflow_id>/cancel", workflow_cancel, "tenant", {200: WorkflowAnswer}, (404, 409),
        body=EmptyBody,
    ),  # fmt: skip
    Route("GET", "/api/v1/queues", queues, "tenant", {200: QueuesAnswer}, query=QueuesListQuery),
    Route("GET", "/api/v1/queues/<queue>/stats", queue_stats, "tenant", {200: QueueStatsAnswer}, path_params={"queue": NAME}),
    *(
        Route("POST", f"/api/v1/queues/<queue>/{name}", handler, "tenant", {200: QueueStatsAnswer}, body=EmptyBody,
              path_params={"queue": NAME})
        for name, handler in (("pause", queue_pause), ("resume", queue_resume))
    ),
    *(
        Route("POST", f"/api/v1/jobs/bulk/{name}", handler, "tenant", {200: CountAnswer}, body=_bulk_request(name))
        for name, handler in (("retry", jobs_bulk_retry), ("cancel", jobs_bulk_cancel), ("delete", jobs_bulk_delete))
    ),
    Route("GET", "/api/v1/workers", workers, "tenant", {200: WorkersAnswer}),
    Route("GET", "/api/v1/schedules", schedules_list, "tenant", {200: SchedulesAnswer}, query=SchedulesListQuery),
    Route("PUT", "/api/v1/schedules/<name>", schedule_put, "tenant", {200: ScheduleAnswer, 201: ScheduleAnswer},
          body=ScheduleRequest, path_params=_SCHEDULE),
    Route("GET", "/api/v1/schedules/<name>", schedule_get, "tenant", {200: ScheduleAnswer}, (404,), path_params=_SCHEDULE),
    Route("DELETE", "/api/v1/schedules/<name>", schedule_delete, "tenant", {204: None}, (404,), path_params=_SCHEDULE),
    *(
        Route("POST", f"/api/v1/schedules/<name>/{name}", handler, "tenant", {200: ScheduleAnswer}, (404,),
              body=EmptyBody, path_params=_SCHEDULE)
        for name, handler in (("pause", schedule_pause), ("resume", schedule_resume))
    ),
    Route("POST", "/api/v1/schedules/<name>/trigger", schedule_trigger, "tenant", {201: ScheduleTriggerAnswer}, (404,),
          body=EmptyBody, path_params=_SCHEDULE),
    Route("GET", "/api/v1/rate-limits", rate_limits_list, "tenant", {200: RateLimitsAnswer}),
    Route(
        "PUT", "/api/v1/rate-limits/<name>", rate_limit_set, "tenant", {200: RateLimitAnswer, 201: RateLimitAnswer},
        (409,), body=RateLimitRequest, path_params={"name": NAME},
    ),
    Route(
        "GET", "/api/v1/rate-limits/<name>", rate_limit_get, "tenant", {200: RateLimitAnswer}, (404,),
        path_params={"name": NAME},
    ),
    Route(
        "DELETE", "/api/v1/rate-limits/<name>", rate_limit_delete, "tenant", {204: None}, (404,),
        path_params={"name": NAME},
    ),
]  # fmt: skip

#: Every route of the API, declared once.
ALL_ROUTES: list[Route] = PROTOCOL_ROUTES + ROUTES
