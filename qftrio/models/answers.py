"""Answers, as /openapi.json documents them: the server writes them with the
records' ``to_wire``; these models are their schema, and the contract test
holds every answer to it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .records import ATTEMPT_FORM, JOB_FORM, SCHEDULE_FORM, AttemptEntry, ErrorEntry, HeartbeatStatus, StepStatus, Time, WorkflowStatus



class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Answer):
    code: str
    message: str


class ErrorAnswer(_Answer):
    """An error: its code and a sentence saying what was wrong."""

    error: ErrorDetail


class ErrorEntryAnswer(_Answer):
    attempt: int
    error: str
    at: Time


#: One claim of a job, as :class:`AttemptEntry` declares it.
AttemptEntryAnswer = ATTEMPT_FORM.answer_model(
    "AttemptEntryAnswer", "One claim of a job: who claimed it and when, when and how it ended.", _Answer, {}
)


#: A job, as :class:`Job` declares it.
JobAnswer = JOB_FORM.answer_model(
    "JobAnswer", "A job.", _Answer, {ErrorEntry: ErrorEntryAnswer, AttemptEntry: AttemptEntryAnswer}
)


#: A schedule, as :class:`Schedule` declares it.
ScheduleAnswer = SCHEDULE_FORM.answer_model("ScheduleAnswer", "A cron schedule.", _Answer, {})


class SchedulesAnswer(_Answer):
    """A page of the tenant's schedules, by name, and the cursor of the next page."""

    schedules: list[ScheduleAnswer]
    next_cursor: str | None


class ScheduleTriggerAnswer(_Answer):
    """The schedule, and the job a trigger enqueued."""

    schedule: ScheduleAnswer
    job: JobAnswer


class JobsAnswer(_Answer):
    """Jobs, in the order asked for."""

    jobs: list[JobAnswer]


class JobsPageAnswer(_Answer):
    """A page of jobs, newest first, and the cursor of the next page."""

    jobs: list[JobAnswer]
    next_cursor: str | None


class LeaseAnswer(_Answer):
    job: JobAnswer
    lease_token: str


class LeasesAnswer(_Answer):
    """The jobs claimed, in lease order (possibly none)."""

    jobs: list[LeaseAnswer]


class HeartbeatAnswer(_Answer):
    """The job's status; ``locked_until`` when the lease was extended."""

    status: HeartbeatStatus
    locked_until: Time | None = None


class ReportResultAnswer(_Answer):
    id: str
    code: Literal[200, 204, 404, 409]
    status: HeartbeatStatus | None = None
    locked_until: Time | None = None


class ReportResultsAnswer(_Answer):
    """One result per item, in order, with the status the single route would answer."""

    results: list[ReportResultAnswer]


class CountsAnswer(_Answer):
    """Jobs by status; ``scheduled`` counts the pending ones whose time has
    not come (up to 10,000: 10,000 means that many or more)."""

    pending: int
    running: int
    completed: int
    failed: int
    cancelled: int
    scheduled: int


class HeldBackAnswer(_Answer):
    """Of the pending jobs whose time has come, those flow control holds
    back: by a concurrency key at its limit, by a rate limit with no unit
    left (a job held back by both counts in both; each up to 10,000)."""

    concurrency: int
    rate_limit: int


class QueueStatsAnswer(_Answer):
    """A queue's backlog, as the tenant sees it. ``next_available_at`` is
    when a scheduled job, a running lease or a rate limit's next unit next
    makes work available."""

    queue: str
    counts: CountsAnswer
    held_back: HeldBackAnswer
    oldest_ready_at: Time | None
    next_available_at: Time | None
    paused: bool


class QueuesAnswer(_Answer):
    """A page of the queues the tenant has jobs in or paused, by name, and
    the cursor of the next page."""

    queues: list[QueueStatsAnswer]
    next_cursor: str | None


class CountAnswer(_Answer):
    """How many jobs a bulk action changed."""

    count: int


class RateLimitAnswer(_Answer):
    """A rate limit: at most ``limit`` claims in any window of ``per_secs``;
    ``next_available_at`` is when a held-back job can next be claimed (null
    while units are left)."""

    name: str
    limit: int
    per_secs: float
    next_available_at: Time | None


class RateLimitsAnswer(_Answer):
    """The tenant's rate limits, by name."""

    rate_limits: list[RateLimitAnswer]


class WorkerAnswer(_Answer):
    worker_id: str
    jobs: int
    job_ids: list[str]
    queues: list[str]
    last_seen_at: Time


class WorkersAnswer(_Answer):
    """The workers seen in the last few minutes that hold the tenant's
    running jobs or leased a queue holding its jobs, most jobs first, then
    the latest seen first."""

    workers: list[WorkerAnswer]


class WorkflowStepAnswer(_Answer):
    name: str
    kind: str
    payload: dict[str, Any]
    depends_on: list[str]
    max_attempts: int
    status: StepStatus
    job_id: str | None
    #: The step that added it at run time, else ``None``.
    added_by: str | None = None
    job: JobAnswer | None = None


class WorkflowAnswer(_Answer):
    """A workflow and its steps."""

    id: str
    tenant: str
    name: str
    status: WorkflowStatus
    context: dict[str, Any]
    steps: list[WorkflowStepAnswer]
    created_at: Time
    updated_at: Time


class WorkflowsPageAnswer(_Answer):
    """A page of workflows, newest first, and the cursor of the next page."""

    workflows: list[WorkflowAnswer]
    next_cursor: str | None


class HealthAnswer(_Answer):
    """Whether the server can reach its database."""

    status: Literal["ok", "unavailable"]
