"""Every decision of a job's life, once: pure functions, no I/O.

A store reads what a decision needs (a row's status, whether the caller's
lease token is the row's current one, its attempt count), calls the function
here, and executes what it answers through a guarded write ("set this if the
job is still running and the token is current"). Both stores call the same
functions, so a rule changes in one place; ``tests/test_transitions.py`` holds
the rules, and the store conformance suite checks that each backend executes
them.

Reports (complete / fail / snooze / heartbeat) of a job that exists:

=====================  ===============  ======================  ==============  ================
row state              complete(token)  fail(token)             snooze(token)   heartbeat(token)
=====================  ===============  ======================  ==============  ================
token not current      CONFLICT         CONFLICT                CONFLICT        CONFLICT
running                OK (completed)   OK (pending or failed)  OK (pending)    OK, extended
completed              OK (replay)      CONFLICT                CONFLICT        OK, status only
pending (after fail)   CONFLICT         OK (replay)             OK (replay)     OK, status only
failed                 CONFLICT         OK (replay)             CONFLICT        OK, status only
cancelled              CONFLICT         CONFLICT                CONFLICT        OK, status only
=====================  ===============  ======================  ==============  ================

The table is :func:`complete`, :func:`fail`, :func:`snooze` and
:func:`heartbeat`. A heartbeat never extends a lease past the attempt's
deadline (``timeout_secs``); when the deadline passes, the janitor ends the
attempt (:func:`reap`, :func:`timed_out`).

Lease tokens (docs/protocol.md, "Worker protocol"): a claim gives the job a
fresh token. It stays on the row after complete, fail and cancel, so that
replays and late heartbeats are told apart from stale callers; it stays
valid after the lease runs out, until the job is claimed again (the claim
records the lost attempt as :data:`LOST_ATTEMPT`) or taken back by the janitor
(:func:`reap`), which replace or clear it: stale from then on.
A job's ``worker_id`` is kept after it ends, so that one can see where it ran.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from .. import errors
from ..models import AttemptOutcome, HeartbeatItem, Status, WorkflowStatus, timeout_error
from .store.base import LEASE_EXPIRED, HeartbeatResult, Outcome, ReportResult, RetryAt


class _Report(Protocol):
    @property
    def job_id(self) -> str: ...
    @property
    def lease_token(self) -> str: ...


I = TypeVar("I", bound=_Report)
C = TypeVar("C", bound=tuple[Any, ...])
R = TypeVar("R", ReportResult, HeartbeatResult)

__all__ = [
    "complete",
    "fail",
    "Failed",
    "snooze",
    "timed_out",
    "attempt_over",
    "timeout_error",
    "heartbeat",
    "one_per_lease",
    "answers",
    "lease_order",
    "turns",
    "share",
    "fair_order",
    "within_limits",
    "rate_window",
    "LOST_ATTEMPT",
    "cancel",
    "workflow_cancel",
    "steps_add",
    "Retry",
    "retry",
    "not_the_failed_step",
    "BULK_STATUSES",
    "bulk_statuses",
    "deletable",
    "Expired",
    "Reap",
    "reap",
    "sibling_cancelled",
    "Advance",
    "advance",
    "UNFINISHED",
]

#: Job statuses a workflow's end cancels (and a cancel accepts).
UNFINISHED = (Status.PENDING, Status.RUNNING)

_NOT_FOUND_REPORT = ReportResult(outcome=Outcome.NOT_FOUND)
_CONFLICT_REPORT = ReportResult(outcome=Outcome.CONFLICT)
_NOT_FOUND_BEAT = HeartbeatResult(outcome=Outcome.NOT_FOUND)
_CONFLICT_BEAT = HeartbeatResult(outcome=Outcome.CONFLICT)


# -- reports ----------------------------------------------------------------


def attempt_over(status: Status | None, deadline: float | None, now: float) -> bool:
    """Whether a job in *status* is running past its attempt's *deadline*:
    the attempt is over at that instant, whether or not the janitor has
    taken the job back yet. Its token is then no longer current for a
    heartbeat, a completion or a snooze (each store asks the same in its
    statements), and a fail ends the attempt as the janitor would
    (:func:`fail`)."""
    return status is Status.RUNNING and deadline is not None and now >= deadline


def heartbeat(
    status: Status | None, current: bool, *, extend_secs: float, now: float, deadline: float | None = None
) -> HeartbeatResult:
    """The answer to a heartbeat of a job in *status* (None: unknown job),
    *current* telling whether its token is the job's current one. A result
    with ``locked_until`` set is a lease to extend to that time (and
    ``updated_at`` to *now*), if the job is still running under that token:
    never past the attempt's *deadline* (``timeout_secs`` after its claim;
    PostgreSQL's heartbeat statements cap it the same way, ``least``)."""
    if status is None:
        return _NOT_FOUND_BEAT
    if not current:
        return _CONFLICT_BEAT
    if status is Status.RUNNING:
        until = now + extend_secs if deadline is None else min(now + extend_secs, deadline)
        return HeartbeatResult(outcome=Outcome.OK, status=Status.RUNNING, locked_until=until)
    return HeartbeatResult(outcome=Outcome.OK, status=status)


def progress(status: Status | None, current: bool) -> HeartbeatResult:
    """The answer to a progress report of a job in *status* (None: unknown
    job), *current* telling whether its token is the job's current one: a
    heartbeat's answer, extending nothing. The progress is recorded when the
    answer's status is running."""
    if status is None:
        return _NOT_FOUND_BEAT
    if not current:
        return _CONFLICT_BEAT
    return HeartbeatResult(outcome=Outcome.OK, status=status)


def one_per_lease(items: Sequence[I]) -> tuple[list[I], list[int]]:
    """A batch's reports, one per lease (job and token): a lease reported
    twice in one batch is decided once, for its first complete or fail, or
    its longest heartbeat (extended once, by the longer extension). Returns
    the reports to decide and, for each of *items*, the index of its answer
    among them; :func:`answers` then answers every item."""
    index: dict[tuple[str, str], int] = {}
    unique: list[I] = []
    slot = []
    for item in items:
        key = (item.job_id, item.lease_token)
        k = index.get(key)
        if k is None:
            k = index[key] = len(unique)
            unique.append(item)
        elif isinstance(item, HeartbeatItem) and item.extend_secs > unique[k].extend_secs:  # type: ignore[attr-defined]
            unique[k] = item
        slot.append(k)
    return unique, slot


def answers(results: Sequence[R], slot: Sequence[int]) -> list[R]:
    """Every item's answer, from the answers to :func:`one_per_lease`'s
    reports: a repeat of a report that applied is its replay (OK, the same
    status, ``applied`` False: the metrics count the job once); a repeated
    heartbeat is answered as its lease was."""
    out = []
    seen: set[int] = set()
    for k in slot:
        result = results[k]
        if k in seen and isinstance(result, ReportResult) and result.applied:
            result = ReportResult(outcome=Outcome.OK, queue=result.queue, status=result.status)  # type: ignore[assignment]
        seen.add(k)
        out.append(result)
    return out


def lease_order(priority: int, scheduled_at: float, created_at: float) -> tuple[float, float, float]:
    """The sort key of lease order: priority first (higher first), then the
    earliest scheduled, then the earliest created. A claim hands out jobs in
    this order; each store's claim statements sort by the same columns
    (``ORDER BY priority DESC, scheduled_at, created_at``)."""
    return (-priority, scheduled_at, created_at)


def turns(tenants: Sequence[str], turn: int) -> list[str]:
    """The tenants with ready jobs on a queue, in the order a lease serves
    them: sorted, then rotated by *turn* (each claim of a store takes the
    next), so that every tenant comes first in turn, whatever its jobs'
    priorities or times."""
    ordered = sorted(tenants)
    if not ordered:
        return []
    start = turn % len(ordered)
    return ordered[start:] + ordered[:start]


def share(limit: int, tenants: int) -> int:
    """How many ready jobs a lease of *limit* takes from each of *tenants*
    at most (all of them for a single tenant: today's order). A lease left
    short by a tenant with fewer ready jobs than its share is filled by a
    claim after it."""
    return -(-limit // max(1, min(tenants, limit)))


def fair_order(candidates: Sequence[C], served: Sequence[str]) -> list[C]:
    """*candidates* ``(id, tenant, priority, scheduled_at, created_at)`` in the
    order a lease hands them out: each tenant's first job in lease order, in
    the turn of *served*, then each one's second, and so on. For a single
    tenant, lease order itself. A tenant not in *served* (its only claimable
    jobs are expired leases) comes after those that are."""
    position = {tenant: i for i, tenant in enumerate(served)}
    by_tenant: dict[str, list[C]] = {}
    for c in candidates:
        by_tenant.setdefault(c[1], []).append(c)
    keyed = []
    for tenant, jobs in by_tenant.items():
        jobs.sort(key=lambda c: lease_order(c[2], c[3], c[4]))
        keyed += [((rank, position.get(tenant, len(position)), tenant), c) for rank, c in enumerate(jobs)]
    keyed.sort(key=lambda k: k[0])
    return [c for _, c in keyed]


def within_limits(
    ordered: Sequence[C], running: dict[tuple[str, str], int], units: dict[tuple[str, str], int]
) -> tuple[list[C], bool]:
    """The candidates ``(id, tenant, priority, scheduled_at, created_at,
    concurrency_key, concurrency_limit, rate_limit)`` a lease takes, in
    *ordered*'s order: one with a concurrency key only while fewer than its
    limit of the tenant's jobs with that key run (*running*, plus those
    taken before it); one naming a rate limit only while units of it are
    left (*units*, less those taken before it; a limit no longer declared
    holds nothing back). And whether any was held back."""
    taken: dict[tuple[str, str], int] = {}
    spent: dict[tuple[str, str], int] = {}
    out = []
    for c in ordered:
        key, limit, rate = c[5], c[6], c[7]
        slot = (c[1], key)
        if key is not None and running.get(slot, 0) + taken.get(slot, 0) >= limit:
            continue
        if rate is not None and (c[1], rate) in units and spent.get((c[1], rate), 0) >= units[c[1], rate]:
            continue
        if key is not None:
            taken[slot] = taken.get(slot, 0) + 1
        if rate is not None:
            spent[c[1], rate] = spent.get((c[1], rate), 0) + 1
        out.append(c)
    return out, len(out) < len(ordered)


def rate_window(
    stamps: Sequence[float], limit: int, per_secs: float, now: float
) -> tuple[list[float], int, float | None]:
    """A rate limit's state at *now* from the times of its claims: the
    newest *limit* of them (oldest first), what a claim keeps; how many
    units are left (*limit* less the claims in the window ending at *now*);
    and when the next one frees up if none is. The newest, not only those
    of the window: claims need not commit in the order of their times, and
    a claim of an earlier time must still count those of its own window."""
    kept = sorted(stamps)[-limit:]
    window = [t for t in kept if t > now - per_secs]
    left = max(0, limit - len(window))
    return kept, left, None if left else window[len(window) - limit] + per_secs


#: What a claim records for the attempt a job lost when its lease ran out
#: and a claim takes it (a running job is claimable then only): the error of
#: that attempt, written by each store's claim statement when the row it
#: claims was running.
LOST_ATTEMPT = LEASE_EXPIRED


def complete(status: Status | None, current: bool, *, queue: str | None = None) -> ReportResult:
    """The answer to a completion. ``applied`` set: complete the job (result
    stored, ``locked_until`` cleared), if it is still running under that
    token."""
    return _report(status, current, queue, after=Status.COMPLETED)


def _report(status: Status | None, current: bool, queue: str | None, *, after: Status) -> ReportResult:
    """A report that moves a running job to *after*: applied when running
    under the token, a replay when the job is in *after* already, else
    refused."""
    if status is None:
        return _NOT_FOUND_REPORT
    if not current:
        return _CONFLICT_REPORT
    if status is Status.RUNNING:
        return ReportResult(outcome=Outcome.OK, queue=queue, status=after, applied=True)
    if status is after:
        return ReportResult(outcome=Outcome.OK, queue=queue, status=after)
    return _CONFLICT_REPORT


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Failed:
    """What a fail decided: the answer, and when ``result.applied`` the
    write: status ``result.status``, scheduled at ``retry_at`` (None: left
    as it was, the job is dead-lettered), ``locked_until`` cleared, the error
    recorded for the attempt."""

    result: ReportResult
    retry_at: float | None = None
    #: The error to record instead of the worker's: the attempt timed out.
    error: str | None = None


def fail(
    status: Status | None,
    current: bool,
    *,
    queue: str | None = None,
    attempt: int = 0,
    max_attempts: int = 0,
    retryable: bool = True,
    retry_at: RetryAt,
    now: float,
    backoff: dict[str, Any] | None = None,
    retry_in_secs: float | None = None,
    deadline: float | None = None,
    timeout_secs: int | None = None,
) -> Failed:
    """The answer to a fail: a retry when the engine's *retry_at* gives a
    time (by the job's own *backoff*, if it has one), else a dead letter.
    A worker's *retry_in_secs* replaces the backoff's delay, never the
    decision to retry. A fail that comes when the attempt is over (past its
    *deadline*) fails it as timed out, exactly as the janitor would
    (:func:`reap`): whichever comes first, the outcome is the same."""
    if status is None:
        return Failed(result=_NOT_FOUND_REPORT)
    if not current:
        return Failed(result=_CONFLICT_REPORT)
    if status is Status.RUNNING:
        late = attempt_over(status, deadline, now)
        when = retry_at(attempt, max_attempts, retryable or late, now, backoff)
        if when is not None and retry_in_secs is not None and not late:
            when = now + retry_in_secs
        after = Status.FAILED if when is None else Status.PENDING
        result = ReportResult(outcome=Outcome.OK, queue=queue, status=after, applied=True)
        return Failed(result=result, retry_at=when, error=timeout_error(timeout_secs) if late else None)
    if status in (Status.PENDING, Status.FAILED):
        return Failed(result=ReportResult(outcome=Outcome.OK, queue=queue, status=status))
    return Failed(result=_CONFLICT_REPORT)


def snooze(status: Status | None, current: bool, *, queue: str | None = None) -> ReportResult:
    """The answer to a snooze. ``applied`` set: the job goes back to pending
    at the delay asked for, ``max_attempts`` raised by one so that the
    attempt is not used up (as Oban does: ``attempt`` still counts claims),
    ``locked_until`` cleared, the token kept, if it is still running under
    that token. Same answers as :func:`fail`: a replay (pending, current
    token) is OK; a completed, failed or cancelled job is a conflict."""
    return _report(status, current, queue, after=Status.PENDING)


# -- the application's changes ------------------------------------------------


def cancel(job_id: str, status: Status) -> None:
    """Raise :class:`~qftrio.errors.Conflict` unless a job in *status* can
    be cancelled. Cancelling keeps the lease token (the running attempt's
    next heartbeat is told ``cancelled``, not ``conflict``) and clears
    ``locked_until``: the job is no longer running."""
    if status not in UNFINISHED:
        raise errors.Conflict(f"job {job_id} is {status.value}; only pending or running jobs can be cancelled")


def workflow_cancel(workflow_id: str, status: WorkflowStatus) -> None:
    """Raise :class:`~qftrio.errors.Conflict` unless a workflow in *status*
    can be cancelled: only a running one (its end cancels its unfinished
    steps)."""
    if status is not WorkflowStatus.RUNNING:
        raise errors.Conflict(f"workflow {workflow_id} is {status.value}; only running workflows can be cancelled")


def steps_add(status: Status, current: bool, *, replay: bool) -> bool:
    """Whether a running step's add of steps (``POST /api/v1/jobs/{id}/steps``)
    is written: the lease token rules of :func:`complete`. A *replay* (these
    very steps added by this step already) changes nothing while the token
    is current, whatever the job's status since; else the job must be
    running under the token. Raises :class:`~qftrio.errors.Conflict`
    (``lease_lost``) otherwise."""
    if not current:
        raise errors.Conflict("the lease token is not the job's current one", code="lease_lost")
    if replay:
        return False
    if status is not Status.RUNNING:
        raise errors.Conflict(
            f"the job is {status.value}: only a running step adds steps (was it cancelled with its workflow?)",
            code="lease_lost",
        )
    return True


class Retry(enum.Enum):
    """What retrying a job does."""

    #: Back to pending, attempt 0, ready now, lease token cleared.
    RESET = "reset"
    #: The failed step of a failed workflow: resume the workflow.
    RESUME = "resume"
    #: Another step of a failed workflow: a conflict naming the failed step
    #: (:func:`not_the_failed_step`, once the store has found it).
    NOT_THE_FAILED_STEP = "not_the_failed_step"


def retry(
    job_id: str, status: Status, *, workflow_id: str | None = None, workflow_status: WorkflowStatus | None = None
) -> Retry:
    """What retrying a job in *status* does (a workflow step's: by its
    workflow's status). Raises :class:`~qftrio.errors.Conflict` for a job
    that is neither failed nor cancelled, and for any step of a cancelled
    workflow: a cancelled workflow is final."""
    if status not in (Status.FAILED, Status.CANCELLED):
        raise errors.Conflict(f"job {job_id} is {status.value}; only failed or cancelled jobs can be retried")
    if workflow_status is WorkflowStatus.CANCELLED:
        raise errors.Conflict(
            f"job {job_id} is a step of workflow {workflow_id}, which was cancelled; "
            "a cancelled workflow does not resume"
        )
    if workflow_status is WorkflowStatus.FAILED:
        return Retry.RESUME if status is Status.FAILED else Retry.NOT_THE_FAILED_STEP
    return Retry.RESET


def not_the_failed_step(workflow_id: str, step: str, failed_job_id: str) -> errors.Conflict:
    """The conflict of :attr:`Retry.NOT_THE_FAILED_STEP`."""
    return errors.Conflict(
        f"workflow {workflow_id} failed at step {step!r}; retry that step's job ({failed_job_id}) to resume it"
    )


#: The statuses each bulk action acts on: those the single-job call accepts.
BULK_STATUSES: dict[str, tuple[Status, ...]] = {
    "retry": (Status.FAILED, Status.CANCELLED),
    "cancel": UNFINISHED,
    "delete": (Status.COMPLETED, Status.FAILED, Status.CANCELLED),
}


def bulk_statuses(action: str, status: Status | None) -> tuple[Status, ...]:
    """The statuses a bulk *action* filtered by *status* (None: any) acts
    on. Raises :class:`~qftrio.errors.InvalidInput` naming a status the
    action never applies to (retrying a running job, deleting a pending one)."""
    allowed = BULK_STATUSES[action]
    if status is None:
        return allowed
    if status not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise errors.InvalidInput(f"status: {action} applies to {names} jobs, not {Status(status).value}")
    return (Status(status),)


def deletable(status: Status, workflow_id: str | None) -> bool:
    """Whether a bulk delete removes a job: a finished one, outside any
    workflow (a workflow's jobs go only with the whole workflow, as when
    pruning)."""
    return status in BULK_STATUSES["delete"] and workflow_id is None


# -- the janitor ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Expired:
    """A running job whose lease ran out, as the janitor found it."""

    job_id: str
    queue: str
    attempt: int
    max_attempts: int
    locked_until: float
    workflow_id: str | None = None
    step: str | None = None
    #: The step's place in its workflow (creation order), for ties.
    position: int = 0
    #: The attempt's deadline and the job's own policies (``config``).
    deadline: float | None = None
    timeout_secs: int | None = None
    backoff: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Reap:
    """What the janitor does to one expired job: status ``status``,
    ``locked_until`` and the lease token cleared, ``error`` recorded for the
    attempt. ``worker_id`` stays."""

    job_id: str
    queue: str
    status: Status  # PENDING, FAILED, or CANCELLED (a sibling of the failed step)
    error: str
    #: When a timed-out job runs again (None: ``scheduled_at`` unchanged).
    retry_at: float | None = None
    #: How its attempt ends in the job's history: ``lost`` (its lease
    #: expired, whatever became of the job) or ``timed_out``.
    outcome: AttemptOutcome = AttemptOutcome.LOST


def timed_out(locked_until: float, deadline: float | None) -> bool:
    """Whether a running job whose lease ran out timed out: its lease ran
    to its deadline (a heartbeat never extends it further). One whose lease
    ran out before that lost its lease. A claim never takes a timed-out
    job (the janitor fails it) and each store's claim statements ask the
    same (``locked_until < deadline``)."""
    return deadline is not None and locked_until >= deadline


def sibling_cancelled(step: str) -> str:
    """The error of an expired step cancelled because a sibling that expired
    in the same round failed its workflow."""
    return f"{LEASE_EXPIRED}; cancelled with its workflow, which failed at step {step!r}"


def reap(expired: Sequence[Expired], *, retry_at: RetryAt, now: float) -> tuple[list[Reap], dict[str, str]]:
    """One janitor round over the *expired* jobs: each goes back to pending
    with attempts left, else is dead-lettered with ``lease expired``. A job
    that :func:`timed_out` fails with :func:`timeout_error` instead, as a
    fail would: retried at the time *retry_at* gives (its backoff), else
    dead-lettered.

    A workflow with a dead-lettered step fails. When several of its steps
    expire in one round, the one whose lease ran out first (ties: the
    earlier step in the workflow's order) is its failed step, the one to
    retry; the workflow's other steps expired in the round are cancelled with
    an error naming the failed step (:func:`sibling_cancelled`).

    Returns the decisions in the order of *expired*, and the workflows to
    fail, ``{workflow id: failed step's job id}``.
    """
    retries: dict[str, float | None] = {}
    for job in expired:
        if timed_out(job.locked_until, job.deadline):
            retries[job.job_id] = retry_at(job.attempt, job.max_attempts, True, now, job.backoff)
    failed_step: dict[str, Expired] = {}
    for job in expired:
        exhausted = retries[job.job_id] is None if job.job_id in retries else job.attempt >= job.max_attempts
        if job.workflow_id is not None and exhausted:
            first = failed_step.get(job.workflow_id)
            if first is None or (job.locked_until, job.position) < (first.locked_until, first.position):
                failed_step[job.workflow_id] = job
    out = []
    for job in expired:
        first = failed_step.get(job.workflow_id) if job.workflow_id is not None else None
        if first is not None and first is not job:
            out.append(Reap(job_id=job.job_id, queue=job.queue, status=Status.CANCELLED, error=sibling_cancelled(first.step or "")))
        elif job.job_id in retries:
            when = retries[job.job_id]
            out.append(
                Reap(
                    job_id=job.job_id, queue=job.queue, status=Status.FAILED if when is None else Status.PENDING,
                    error=timeout_error(job.timeout_secs), retry_at=when, outcome=AttemptOutcome.TIMED_OUT,
                )  # fmt: skip
            )
        elif job.attempt < job.max_attempts:
            out.append(Reap(job_id=job.job_id, queue=job.queue, status=Status.PENDING, error=LEASE_EXPIRED))
        else:
            out.append(Reap(job_id=job.job_id, queue=job.queue, status=Status.FAILED, error=LEASE_EXPIRED))
    return out, {workflow_id: job.job_id for workflow_id, job in failed_step.items()}


# -- workflows ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Advance:
    """What a step's completion does to its workflow."""

    #: Steps to enqueue now, in workflow order.
    ready: tuple[str, ...]
    #: The workflow completes with this step.
    completed: bool


def advance(
    workflow_status: WorkflowStatus, *, steps_completed: int, steps_total: int, unblocked: Sequence[tuple[int, str, int, str]]
) -> Advance:
    """A step of a workflow in *workflow_status* completed; *steps_completed*
    counts it. *unblocked* holds ``(position, name, remaining dependencies,
    state)`` of the steps that depended on it, their count already lowered.
    Those with nothing left to wait for are enqueued, in workflow order. A
    workflow that is not running advances nothing (its step's job was
    cancelled with it); its dependents wait for a resume."""
    if workflow_status is not WorkflowStatus.RUNNING:
        return Advance(ready=(), completed=False)
    ready = tuple(name for _, name, remaining, state in sorted(unblocked) if remaining == 0 and state == "waiting")
    return Advance(ready=ready, completed=steps_completed >= steps_total)
