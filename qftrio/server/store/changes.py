"""Every change of a job, written once, over named statements.

A change (cancel, retry, a workflow's advance, a bulk batch, the janitor's
round) is a *plan*: a generator that yields :class:`Call` requests (a named
statement, its arguments, the shape of answer wanted) and receives each
answer, already mapped, as psycopg 3 writes its protocol as generators that
a blocking or an asyncio waiter drives. It decides nothing itself: every
decision is :mod:`qftrio.server.transitions`'. It never knows the backend.

Each backend drives a plan inside one transaction of its own
(``SqliteStore``: synchronously on its store thread, ``PostgresStore``: on
one pooled connection, from Trio), so "one transaction per change"
holds: a workflow step's completion, its context merge and the steps it
unblocks commit together. What a backend provides, by the names of its
``queries/<backend>.sql``:

* the statement of each name a plan yields, taking the same arguments in
  the same order (``$1``, ``$2`` on PostgreSQL; ``?1``, ``?2`` on SQLite). A
  list argument is an array (SQLite reads it with ``json_each``), a dict a
  JSON value. A statement a backend has no use for is empty: SQLite, whose
  one writer owns the file, locks nothing and notifies no other server;
* its answers mapped to shared records: ids as ``str``, the columns named by
  ``Call.json`` decoded, a job row as a :class:`~qftrio.models.Job`.

A JSON value a plan only passes on (a workflow's context carried into the
jobs of its steps) is passed as the backend answered it, never decoded.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

from ... import errors
from ...models import (
    SCHEDULE_FORM, STATUS_OF, FailItem, Job, Schedule, SnoozeItem, Status, StepStatus, Workflow, WorkflowStatus,
    WorkflowStep, to_datetime,
)
from .. import schedules, transitions
from ..workflows import Existing, check_added
from .base import (
    WORKFLOW_QUEUE,
    BulkAction,
    BulkBatch,
    Inserted,
    JobOfSchedule,
    NewJob,
    NewSchedule,
    NewStep,
    NewSteps,
    NewWorkflow,
    Page,
    Reaped,
    ReportResult,
    RetryAt,
    bulk_changed,
    issued,
    new_ids,
)

__all__ = ["Want", "Call", "Plan"]

T = TypeVar("T")


class Want(enum.Enum):
    """The shape of a statement's answer."""

    NOTHING = "nothing"  # run it (for each row of ``args`` when ``many``)
    VALUE = "value"  # the first column of the first row, or None
    ROW = "row"  # the first row as a tuple, or None
    ROWS = "rows"  # every row, as tuples
    JOB = "job"  # the first row as a Job, or None
    JOBS = "jobs"  # every row as a Job
    #: Not a statement: ``args`` are ``(jobs, now)``, inserted by the store's
    #: own insert path (``Store.jobs_insert``), answering its ``Inserted``.
    INSERTED = "inserted"


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One statement a plan wants run, and what it wants back."""

    name: str
    #: The arguments, in order (with ``many``: a sequence of such tuples).
    args: Sequence[Any]
    want: Want = Want.NOTHING
    #: Columns of the answer holding JSON the plan reads.
    json: tuple[int, ...] = ()
    #: ``args`` is a sequence of argument tuples: the statement runs once for each.
    many: bool = False


#: A change: yields calls, receives their answers, returns its result.
Plan = Generator[Call, Any, T]


def _value(name: str, *args: Any) -> Call:
    return Call(name, args, Want.VALUE)


def _row(name: str, *args: Any, json: tuple[int, ...] = ()) -> Call:
    return Call(name, args, Want.ROW, json)


def _rows(name: str, *args: Any, json: tuple[int, ...] = ()) -> Call:
    return Call(name, args, Want.ROWS, json)


def _run(name: str, *args: Any) -> Call:
    return Call(name, args)


def notify(queues: Sequence[str] | set[str]) -> Plan[None]:
    """Wake the long-polls of other servers on *queues* once the change
    commits (nothing to do on a store one process owns)."""
    if queues:
        yield _run("notify_queues", sorted(queues))


# -- one job ------------------------------------------------------------------


def _lock_owned(job_id: str, tenant: str) -> Plan[tuple[Status, str | None] | None]:
    """Lock a tenant's job (a step's workflow first: the lock order) and
    answer its status and workflow id, or None if unknown."""
    if not issued(job_id):
        return None
    # a step's workflow never changes: reading it unlocked is safe
    workflow_id = yield _value("job_workflow", job_id, tenant)
    if workflow_id is not None:
        yield _run("workflow_lock", workflow_id)
    status = yield _value("job_lock_status", job_id, tenant)
    return None if status is None else (STATUS_OF[status], workflow_id)


def job_cancel(job_id: str, tenant: str, now: float) -> Plan[Job | None]:
    """``Store.job_cancel``."""
    owned = yield from _lock_owned(job_id, tenant)
    if owned is None:
        return None
    status, workflow_id = owned
    transitions.cancel(job_id, status)
    job: Job = yield Call("job_cancel", (job_id, now), Want.JOB)
    if workflow_id is not None:  # a step cancelled by hand cancels its workflow
        yield from end_workflow(workflow_id, WorkflowStatus.CANCELLED, now)
    return job


def job_retry(job_id: str, tenant: str, now: float) -> Plan[Job | None]:
    """``Store.job_retry``."""
    owned = yield from _lock_owned(job_id, tenant)
    if owned is None:
        return None
    status, workflow_id = owned
    workflow_status = None
    if workflow_id is not None:
        workflow_status = WorkflowStatus((yield _value("workflow_status", workflow_id)))
    plan = transitions.retry(job_id, status, workflow_id=workflow_id, workflow_status=workflow_status)
    if plan is transitions.Retry.NOT_THE_FAILED_STEP:
        assert workflow_id is not None
        step, failed_id = yield _row("failed_step", workflow_id)
        raise transitions.not_the_failed_step(workflow_id, step, failed_id)
    if plan is transitions.Retry.RESUME:
        assert workflow_id is not None
        yield from resume_workflow(workflow_id, job_id, now)
        return (yield Call("job_get", (job_id,), Want.JOB))
    job: Job = yield Call("job_reset", (job_id, now), Want.JOB)
    yield from notify([job.queue])
    return job


# -- workflows ----------------------------------------------------------------
# Lock order: a workflow's row (FOR UPDATE, in id order) before any of its jobs.


#: Steps enqueued by one statement, at most: SQLite reads the id of each
#: step from the array of ids by its index (``json_extract``), a walk of the
#: array, so that a chunk costs its size squared; chunks keep it linear.
ENQUEUE_CHUNK = 500


def _enqueue_steps(workflow_id: str, tenant: str, names: Sequence[str], context: Any, now: float) -> Plan[None]:
    """Give the waiting steps *names* their jobs, carrying *context*."""
    ids = new_ids(len(names), now)
    for at in range(0, len(names), ENQUEUE_CHUNK):
        chunk = slice(at, at + ENQUEUE_CHUNK)
        args = (workflow_id, list(names[chunk]), tenant, WORKFLOW_QUEUE, now, context, ids[chunk])
        yield _run("enqueue_steps", *args)
        yield _run("steps_enqueued", *args)


def step_completed(workflow_id: str, step: str | None, result: Any, now: float) -> Plan[bool]:
    """Record that *step*'s job completed with *result* (the workflow row
    locked): merge it into the context, count it, and do what
    :func:`transitions.advance` decides. Touches only the steps that depend
    on *step*. Returns whether it enqueued any job."""
    row = yield _row("workflow_step_completed", workflow_id, result if isinstance(result, dict) else {}, now)
    if row is None:
        return False
    tenant, status, context, total, completed = row
    collected = yield _row("step_collected", workflow_id, step)
    if collected is not None and collected[1] == 0:
        # the last of the steps collected under this key: the whole list,
        # in the order added, goes into the context once
        context = yield _value("collect_write", workflow_id, collected[0], now)
    unblocked = yield _rows("steps_unblock", workflow_id, step)
    advance = transitions.advance(
        WorkflowStatus(status), steps_completed=completed, steps_total=total, unblocked=unblocked
    )
    yield from _enqueue_steps(workflow_id, tenant, advance.ready, context, now)
    if advance.completed:
        yield _run("workflow_complete", workflow_id)
    return bool(advance.ready)


def end_workflow(workflow_id: str, status: WorkflowStatus, now: float) -> Plan[None]:
    """Fail or cancel a running workflow with its unfinished steps (a no-op
    if it is not running; its row locked). A running step's worker learns it
    on its next heartbeat, as for any cancelled job."""
    if (yield _value("workflow_end", workflow_id, status.value, now)) is None:
        return
    yield _run("workflow_jobs_cancel", workflow_id, now)
    yield _run("workflow_steps_cancel", workflow_id)


def resume_workflow(workflow_id: str, failed_job_id: str, now: float) -> Plan[None]:
    """Run a failed workflow again from its failed step (its row locked):
    the job pending with a fresh budget, and every step the failure
    cancelled waiting again, its job (if it had one) pending at once."""
    tenant, context = yield _row("workflow_resume", workflow_id, now)
    yield _run("workflow_jobs_resume", workflow_id, failed_job_id, now, context)
    waiting = yield _rows("workflow_steps_wait_again", workflow_id)
    ready = [name for _, name, remaining in sorted(waiting) if remaining == 0]
    yield from _enqueue_steps(workflow_id, tenant, ready, context, now)
    yield from notify([WORKFLOW_QUEUE])


def workflow_create(workflow: NewWorkflow, now: float) -> Plan[Workflow]:
    """``Store.workflow_create``."""
    workflow_id, *root_ids = new_ids(1 + len(workflow.steps), now)
    steps = workflow.steps
    roots = {s.name: i for s, i in zip((s for s in steps if not s.depends_on), root_ids)}
    yield _run("workflow_insert", workflow_id, workflow.tenant, workflow.name, workflow.context, len(steps), now)
    yield Call(
        "workflow_step_insert",
        [
            (
                workflow_id, s.name, i, s.kind, s.payload, list(s.depends_on), s.max_attempts,
                "enqueued" if s.name in roots else "waiting", len(s.depends_on), roots.get(s.name),
            )  # fmt: skip
            for i, s in enumerate(steps)
        ],
        many=True,
    )
    edges = [(workflow_id, dep, s.name) for s in steps for dep in s.depends_on]
    if edges:
        yield Call("workflow_edge_insert", edges, many=True)
    yield Call(
        "step_job_insert",
        [
            (roots[s.name], workflow.tenant, WORKFLOW_QUEUE, s.kind, s.payload, s.max_attempts, now, workflow_id, s.name,
             workflow.context)  # fmt: skip
            for s in steps
            if s.name in roots
        ],
        many=True,
    )
    yield from notify([WORKFLOW_QUEUE])
    loaded = yield from workflow_get(workflow_id)
    assert loaded is not None
    return loaded


def steps_add(added: NewSteps, now: float) -> Plan[Workflow | None]:
    """``Store.steps_add``: the workflow's row locked, then the adding
    step's job; :func:`transitions.steps_add` and
    :func:`~qftrio.server.workflows.check_added` decide; the steps written
    waiting, each on the adding step (an edge) and on its dependencies
    among them, and the adding step's dependents on each of them."""
    if not issued(added.job_id):
        return None
    found = yield _row("step_of_job", added.job_id)
    if found is None:
        return None
    workflow_id, adding = found
    if workflow_id is None:
        raise errors.InvalidInput(f"job {added.job_id} is not a workflow step; only a step adds steps")
    yield _run("workflow_lock", workflow_id)
    status, current = yield _row("step_lease", added.job_id, added.lease_token)
    names = [s.name for s in added.steps]
    wanted = list(dict.fromkeys(names + [dep for s in added.steps for dep in s.depends_on]))
    existing = {
        name: Existing(
            step=NewStep(name=name, kind=kind, payload=payload, depends_on=tuple(deps), max_attempts=max_attempts),
            added_by=added_by, collect=collect,
            completed=job_status is not None and STATUS_OF[job_status] is Status.COMPLETED,
        )  # fmt: skip
        for name, kind, payload, deps, max_attempts, added_by, collect, job_status in (
            yield _rows("steps_named", workflow_id, wanted, json=(2, 3))
        )
    }
    steps_total, steps_added = yield _row("workflow_steps_total", workflow_id)
    dependents = [name for (name,) in (yield _rows("step_dependents", workflow_id, adding))]
    owner = None if added.collect is None else (yield _value("collect_owner", workflow_id, added.collect))
    replay = check_added(
        added, adding, existing, steps_added=steps_added, dependents=len(dependents), collect_owner=owner
    )
    if transitions.steps_add(STATUS_OF[status], bool(current), replay=replay):
        inner = set(names)
        yield Call(
            "added_step_insert",
            [
                (
                    workflow_id, s.name, steps_total + i, s.kind, s.payload, list(s.depends_on), s.max_attempts,
                    1 + sum(dep in inner for dep in s.depends_on), adding, added.collect,
                )  # fmt: skip
                for i, s in enumerate(added.steps)
            ],
            many=True,
        )
        edges = [(workflow_id, adding, name) for name in names]
        edges += [(workflow_id, dep, s.name) for s in added.steps for dep in s.depends_on if dep in inner]
        edges += [(workflow_id, name, dependent) for name in names for dependent in dependents]
        yield Call("workflow_edge_insert", edges, many=True)
        if dependents:
            yield _run("steps_wait_more", workflow_id, dependents, len(names))
        yield _run("workflow_grow", workflow_id, len(names), now)
        if added.collect is not None:
            yield _run("collect_add", workflow_id, added.collect, adding, len(names))
    return (yield from workflow_get(workflow_id, jobs=False))


def workflow_get(workflow_id: str, *, tenant: str | None = None, jobs: bool = True) -> Plan[Workflow | None]:
    """``Store.workflow_get``."""
    if not issued(workflow_id):
        return None
    row = yield _row("workflow_get", workflow_id, json=(4,))
    if row is None or (tenant is not None and row[1] != tenant):
        return None
    return (yield from build_workflows([row], jobs=jobs))[0]


def workflow_cancel(workflow_id: str, tenant: str, now: float) -> Plan[Workflow | None]:
    """``Store.workflow_cancel``."""
    if not issued(workflow_id):
        return None
    status = yield _value("workflow_owned_lock", workflow_id, tenant)
    if status is None:
        return None
    transitions.workflow_cancel(workflow_id, WorkflowStatus(status))
    yield from end_workflow(workflow_id, WorkflowStatus.CANCELLED, now)
    return (yield from workflow_get(workflow_id))


def workflows_page(
    tenant: str, status: WorkflowStatus | None, limit: int, before: tuple[float, str] | None, max_bytes: int | None
) -> Plan[Page[Workflow]]:
    """``Store.workflows_page``: the keys of *limit* + 1 workflows, then the
    workflows that fit in *max_bytes* (:func:`fitting`)."""
    after_at, after_id = (None, None) if before is None else (float(before[0]), before[1])
    keys = yield _rows(
        "workflows_page", tenant, None if status is None else WorkflowStatus(status).value, after_at, after_id,
        limit + 1,
    )  # fmt: skip
    ids = yield from fitting("workflow_bytes", [key[1] for key in keys[:limit]], max_bytes)
    rows = {row[0]: row for row in (yield _rows("workflows_by_ids", ids, json=(4,)))}
    workflows = yield from build_workflows([rows[i] for i in ids if i in rows], jobs=False)
    return Page(workflows, _next(keys, len(ids)))


def jobs_page(keys: Sequence[tuple[float, str]], limit: int, max_bytes: int | None) -> Plan[Page[Job]]:
    """``Store.jobs_page``, from the keys of the page's first *limit* + 1
    jobs: the jobs that fit in *max_bytes* (:func:`fitting`)."""
    ids = yield from fitting("job_bytes", [key[1] for key in keys[:limit]], max_bytes)
    jobs = {job.id: job for job in (yield Call("jobs_by_ids", (ids,), Want.JOBS))}
    return Page([jobs[i] for i in ids if i in jobs], _next(keys, len(ids)))


def _next(keys: Sequence[Sequence[Any]], taken: int) -> tuple[float, str] | None:
    """Where the page after the first *taken* of *keys* starts, if any
    key is left."""
    if taken >= len(keys):
        return None
    created_at, id_ = keys[taken - 1]
    return float(created_at), str(id_)


#: How many sizes :func:`fitting` reads first; each further read takes four
#: times as many.
FIRST_SIZES = 16


def fitting(statement: str, ids: list[str], max_bytes: int | None) -> Plan[list[str]]:
    """The first of *ids* whose sizes on the wire (*statement*: ``(id,
    bytes)`` of each of the ids it is given) add up to *max_bytes* at most,
    and never fewer than one, so that a page always makes progress. Sizes
    are read in growing chunks: a page of big items reads few past the
    budget, a page of small ones few statements. An id gone meanwhile
    weighs nothing (its item is not loaded either)."""
    if max_bytes is None or not ids:
        return ids
    taken: list[str] = []
    total = 0
    chunk = FIRST_SIZES
    while len(taken) < len(ids):
        batch = ids[len(taken) : len(taken) + chunk]
        sizes = dict((yield _rows(statement, batch)))
        for id_ in batch:
            total += sizes.get(id_, 0)
            if taken and total > max_bytes:
                return taken
            taken.append(id_)
        chunk *= 4
    return taken


def build_workflows(rows: Sequence[Sequence[Any]], *, jobs: bool) -> Plan[list[Workflow]]:
    """Workflows from their rows (``workflow_get``'s columns), with their
    steps (and jobs), in three statements whatever their number."""
    if not rows:
        return []
    ids = [r[0] for r in rows]
    steps: dict[str, list[Sequence[Any]]] = {i: [] for i in ids}
    for step_row in (yield _rows("steps_of_workflows", ids, json=(3, 4))):
        steps[step_row[0]].append(step_row)
    full: dict[str, Job] = {}
    if jobs:
        full = {job.id: job for job in (yield Call("jobs_of_workflows", (ids,), Want.JOBS))}
        job_status = {job_id: job.status.value for job_id, job in full.items()}
    else:
        job_status = dict((yield _rows("job_statuses_of_workflows", ids)))
    out = []
    for id_, tenant, name, status, context, created_at, updated_at in rows:
        built = []
        for _, step, kind, payload, depends_on, max_attempts, state, job_id, added_by in steps[id_]:
            step_status = StepStatus(job_status.get(job_id, Status.PENDING.value) if job_id is not None else state)
            built.append(
                WorkflowStep(
                    name=step, kind=kind, payload=payload, depends_on=tuple(depends_on), max_attempts=max_attempts,
                    status=step_status, job_id=job_id, job=full.get(job_id) if job_id is not None else None,
                    added_by=added_by,
                )  # fmt: skip
            )
        out.append(
            Workflow(
                id=id_, tenant=tenant, name=name, status=WorkflowStatus(status), context=context, steps=tuple(built),
                created_at=to_datetime(created_at), updated_at=to_datetime(updated_at),
            )  # fmt: skip
        )
    return out


# -- many jobs ------------------------------------------------------------------


def _lock_reported(unique: Sequence[FailItem] | Sequence[SnoozeItem]) -> Plan[dict[str, Sequence[Any]]]:
    """Lock the rows of a report batch (their workflows first, then the jobs
    in id order, so two batches never deadlock) and answer ``fail_lock``'s
    row of each job that exists, by id."""
    ids = [item.job_id for item in unique if issued(item.job_id)]
    if not ids:
        return {}
    yield _run("lock_workflows_of_jobs", ids)
    return {row[0]: row for row in (yield _rows("fail_lock", ids, json=(9,)))}


def jobs_snooze(items: Sequence[SnoozeItem], now: float) -> Plan[list[ReportResult]]:
    """``Store.jobs_snooze``: the batch's rows locked as for a fail, each
    item decided by :func:`transitions.snooze`, the decisions written in one
    statement."""
    unique, slot = transitions.one_per_lease(items)
    found = yield from _lock_reported(unique)
    out: list[ReportResult] = []
    writes = []
    for item in unique:
        row = found.get(item.job_id)
        status = None if row is None else STATUS_OF[row[1]]
        result = transitions.snooze(
            status,
            row is not None and row[2] == item.lease_token and not transitions.attempt_over(status, row[10], now),
            queue=None if row is None else row[3],
        )
        if result.applied:
            assert row is not None
            result = dataclasses.replace(result, keyed=bool(row[12]))
            writes.append((item.job_id, item.lease_token, now + item.delay_secs))
        out.append(result)
    if writes:
        changed = yield _rows("snooze", *map(list, zip(*writes)), now)
        if len(changed) != len(writes):
            raise RuntimeError("jobs_snooze: a locked row changed under its lock")
        yield from notify({queue for (queue,) in changed})
    return transitions.answers(out, slot)


def jobs_fail(items: Sequence[FailItem], now: float, retry_at: RetryAt) -> Plan[list[ReportResult]]:
    """``Store.jobs_fail``: the batch's rows locked (their workflows first,
    then the jobs in id order, so two batches never deadlock), each item
    decided by :func:`transitions.fail`, the decisions written in one
    statement, and the workflows of dead-lettered steps failed."""
    unique, slot = transitions.one_per_lease(items)
    found = yield from _lock_reported(unique)
    out: list[ReportResult] = []
    writes = []
    # Workflows a dead-lettered step fails, in batch order. A later item of
    # one of them finds its job cancelled with the workflow, exactly as if
    # the items had come one call at a time.
    failing: dict[str, None] = {}
    for item in unique:
        row = found.get(item.job_id)
        status = None if row is None else STATUS_OF[row[1]]
        if status is Status.RUNNING and row[6] in failing:  # type: ignore[index]
            status = Status.CANCELLED
        decided = transitions.fail(
            status,
            row is not None and row[2] == item.lease_token,
            queue=None if row is None else row[3],
            attempt=0 if row is None else row[4],
            max_attempts=0 if row is None else row[5],
            retryable=item.retryable,
            retry_at=retry_at,
            now=now,
            backoff=None if row is None else row[9],
            retry_in_secs=item.retry_in_secs,
            deadline=None if row is None else row[10],
            timeout_secs=None if row is None else row[11],
        )
        result = decided.result
        if result.applied:
            after = result.status
            assert row is not None and after is not None
            result = dataclasses.replace(result, kind=row[7], claimed_at=row[8], keyed=bool(row[12]))
            # PostgreSQL's text cannot hold NUL, which a worker's message might
            error = decided.error or item.error.replace("\x00", "\ufffd")
            writes.append((item.job_id, item.lease_token, after.value, decided.retry_at, error))
            if after is Status.FAILED and row[6] is not None:
                failing[row[6]] = None
        out.append(result)
    if writes:
        changed = yield _rows("fail", *map(list, zip(*writes)), now)
        # The rows are locked, so this cannot happen; if it did, the
        # transaction must not commit half a batch.
        if len(changed) != len(writes):
            raise RuntimeError("jobs_fail: a locked row changed under its lock")
        yield from notify({queue for _, queue, status in changed if status == Status.PENDING.value})
    for workflow_id in failing:
        yield from end_workflow(workflow_id, WorkflowStatus.FAILED, now)
    return transitions.answers(out, slot)


def jobs_bulk(
    action: BulkAction, keys: Sequence[tuple[float, str]], *, tenant: str, statuses: Sequence[Status], limit: int, now: float
) -> Plan[BulkBatch]:
    """One batch of ``Store.jobs_bulk`` over the jobs of *keys* (the page
    the backend read, newest first): their rows locked (their workflows
    first), each decided as the single-job call decides it, the decisions
    executed for the whole batch."""
    if not keys:
        return BulkBatch(changed=0)
    ids = [job_id for _, job_id in keys]
    if action != "delete":
        yield _run("lock_workflows_of_jobs", ids)
    wanted = {s.value for s in statuses}
    # the page was read unlocked, so a job may have moved on since: those are left
    rows = [row for row in (yield _rows("bulk_lock", ids, tenant)) if row[1] in wanted]
    ready: set[str] = set()
    keyed = False
    if action == "delete":
        doomed = [job_id for job_id, status, _, workflow_id in rows if transitions.deletable(STATUS_OF[status], workflow_id)]
        if doomed:
            yield _run("bulk_delete", doomed)
    elif action == "cancel":
        keyed = yield from _bulk_cancel(rows, now)
    else:
        ready = yield from _bulk_retry(rows, now)
    considered = [row[0] for row in rows]
    ended = dict((yield _rows("bulk_after", considered))) if considered else {}
    return BulkBatch(
        changed=bulk_changed(action, len(considered), ended),
        ready_queues=tuple(sorted(ready)),
        keyed=keyed,
        last=tuple(keys[-1]) if len(keys) == limit else None,  # type: ignore[arg-type]
    )


def _bulk_cancel(rows: Sequence[Sequence[Any]], now: float) -> Plan[bool]:
    """Cancel the jobs of *rows* that may be cancelled; whether one of them
    was a job of a concurrency key."""
    chosen = []
    for job_id, status, _, _ in rows:
        try:
            transitions.cancel(job_id, STATUS_OF[status])
        except errors.Conflict:
            continue
        chosen.append(job_id)
    cancelled = (yield _rows("bulk_cancel", chosen, now)) if chosen else []
    # a step cancelled by hand cancels its workflow
    for workflow_id in dict.fromkeys(workflow_id for _, workflow_id, _ in cancelled if workflow_id is not None):
        yield from end_workflow(workflow_id, WorkflowStatus.CANCELLED, now)
    return any(keyed for _, _, keyed in cancelled)


def _bulk_retry(rows: Sequence[Sequence[Any]], now: float) -> Plan[set[str]]:
    workflow_ids = list(dict.fromkeys(row[3] for row in rows if row[3] is not None))
    workflow_status = dict((yield _rows("bulk_workflow_statuses", workflow_ids))) if workflow_ids else {}
    reset = []
    resumed: dict[str, str] = {}
    for job_id, status, _, workflow_id in rows:
        if workflow_id in resumed:
            continue  # its workflow resumed in this batch: this job moved on with it
        try:
            plan = transitions.retry(
                job_id,
                STATUS_OF[status],
                workflow_id=workflow_id,
                workflow_status=None if workflow_id is None else WorkflowStatus(workflow_status[workflow_id]),
            )
        except errors.Conflict:
            continue
        if plan is transitions.Retry.RESET:
            reset.append(job_id)
        elif plan is transitions.Retry.RESUME:
            resumed[workflow_id] = job_id
    ready = {queue for (queue,) in (yield _rows("bulk_reset", reset, now))} if reset else set()
    yield from notify(ready)
    for workflow_id, job_id in resumed.items():
        yield from resume_workflow(workflow_id, job_id, now)  # notifies its queue
    if resumed:
        ready.add(WORKFLOW_QUEUE)
    return ready


def reap_expired(now: float, limit: int, retry_at: RetryAt) -> Plan[list[Reaped]]:
    """``Store.jobs_reap_expired``: the running jobs whose lease ran out, as
    :func:`transitions.reap` decides, their workflows locked first (skipping
    those busy elsewhere: their steps wait for the next round)."""
    workflows = [workflow_id for (workflow_id,) in (yield _rows("reap_lock_workflows", now))]
    found = yield _rows("expired", now, limit, workflows, json=(11,))
    kinds = {}
    expired = []
    keyed = set()
    for job_id, queue, kind, attempt, max_attempts, locked_until, workflow_id, step, position, *policy in found:
        deadline, timeout_secs, backoff, has_key = policy
        kinds[job_id] = kind
        if has_key:
            keyed.add(job_id)
        expired.append(
            transitions.Expired(
                job_id=job_id, queue=queue, attempt=attempt, max_attempts=max_attempts, locked_until=locked_until,
                workflow_id=workflow_id, step=step, position=position, deadline=deadline, timeout_secs=timeout_secs,
                backoff=backoff,
            )  # fmt: skip
        )
    decided, failing = transitions.reap(expired, retry_at=retry_at, now=now)
    if decided:
        yield _run(
            "reap", [d.job_id for d in decided], [d.status.value for d in decided], [d.error for d in decided], now,
            [d.retry_at for d in decided], [d.outcome.value for d in decided],
        )  # fmt: skip
    yield from notify({d.queue for d in decided if d.status is Status.PENDING})
    for workflow_id in failing:
        yield from end_workflow(workflow_id, WorkflowStatus.FAILED, now)
    return [
        Reaped(job_id=d.job_id, queue=d.queue, status=d.status, kind=kinds[d.job_id], keyed=d.job_id in keyed)
        for d in decided
        if d.status is not Status.CANCELLED
    ]


def prune(before: float, limit: int) -> Plan[int]:
    """``Store.jobs_prune``: finished jobs outside workflows, then whole
    completed or cancelled workflows (never a workflow's job on its own)."""
    deleted = len((yield _rows("prune_jobs", before, limit)))
    for (workflow_id,) in (yield _rows("prune_finished_workflows", before)) if deleted < limit else []:
        if deleted >= limit:
            break
        deleted += len((yield _rows("prune_workflow_jobs", workflow_id)))
        yield _run("prune_workflow_edges", workflow_id)
        yield _run("prune_workflow_steps", workflow_id)
        yield _run("prune_workflow_collects", workflow_id)
        yield _run("prune_workflow", workflow_id)
    return deleted


# -- schedules --------------------------------------------------------------------
# Exactly once per tick (docs/schedules.md): a round locks the due schedules
# it fires (SKIP LOCKED: another server's are its), and in the same
# transaction claims a row per tick, enqueues a job for each tick it won and
# moves the schedule on. A server killed mid-round commits none of it, so the
# tick stays due; a tick's row lets one transaction win it.


def _schedule_value(name: str) -> str:
    # Each of Schedule's fields by its place in a row of the schedule
    # statements (the fields' order).
    value = f"row[{list(SCHEDULE_FORM.wire).index(name)}]"
    return f"bool({value})" if name == "paused" else value


#: A schedule of a row of the schedule statements.
_schedule: Callable[[Sequence[Any]], Schedule] = SCHEDULE_FORM.builder("_schedule", "row", _schedule_value)


def _insert(jobs: Sequence[NewJob], now: float) -> Plan[list[Inserted]]:
    inserted: list[Inserted] = yield Call("", (list(jobs), now), Want.INSERTED)
    return inserted


def schedule_put(new: NewSchedule, now: float) -> Plan[tuple[Schedule, bool]]:
    """``Store.schedule_put``."""
    old = yield _row("schedule_lock", new.tenant, new.name)
    next_run_at = schedules.next_on_put(
        None if old is None else (old[0], old[1], bool(old[2]), old[3]),
        cron=new.cron, timezone=new.timezone, paused=new.paused, now=now,
    )  # fmt: skip
    row = yield _row(
        "schedule_upsert", new.tenant, new.name, new.cron, new.timezone, new.job, new.paused, new.catch_up,
        next_run_at, now, json=(4,),
    )  # fmt: skip
    return _schedule(row), old is None


def schedule_get(tenant: str, name: str) -> Plan[Schedule | None]:
    """``Store.schedule_get``."""
    row = yield _row("schedule_get", tenant, name, json=(4,))
    return None if row is None else _schedule(row)


def schedules_page(tenant: str, after: str | None, limit: int) -> Plan[list[Schedule]]:
    """``Store.schedules_list``."""
    return [_schedule(row) for row in (yield _rows("schedules_page", tenant, after, limit, json=(4,)))]


def schedule_delete(tenant: str, name: str) -> Plan[bool]:
    """``Store.schedule_delete``."""
    if (yield _value("schedule_delete", tenant, name)) is None:
        return False
    yield _run("schedule_ticks_delete", tenant, name)
    return True


def schedule_set_paused(tenant: str, name: str, paused: bool, now: float) -> Plan[Schedule | None]:
    """``Store.schedule_set_paused``."""
    old = yield _row("schedule_lock", tenant, name)
    if old is None:
        return None
    cron, timezone, was_paused, next_run_at = old
    if bool(was_paused) != paused:  # a resume starts from now; pausing twice changes nothing
        next_run_at = schedules.next_on_put(None, cron=cron, timezone=timezone, paused=paused, now=now)
    return _schedule((yield _row("schedule_set_paused", tenant, name, paused, next_run_at, now, json=(4,))))


def schedule_trigger(tenant: str, name: str, now: float, job_of: JobOfSchedule) -> Plan[tuple[Schedule, Inserted] | None]:
    """``Store.schedule_trigger``."""
    locked = yield _row("schedule_lock", tenant, name)
    if locked is None:
        return None
    schedule = yield from schedule_get(tenant, name)
    assert schedule is not None
    (inserted,) = yield from _insert([job_of(tenant, name, schedule.job, now)], now)
    yield _run("schedule_advance", [tenant], [name], [locked[3]], [now], [inserted.id], now)  # its next run, as kept
    at = to_datetime(now)
    return dataclasses.replace(schedule, last_run_at=at, last_job_id=inserted.id, updated_at=at), inserted


def schedules_fire(now: float, limit: int, job_of: JobOfSchedule) -> Plan[tuple[int, list[Inserted]]]:
    """``Store.schedules_fire``: a statement per step for the whole batch
    of due schedules, whatever their number."""
    due = yield _rows("schedules_due", now, limit, json=(4,))
    fires = [
        schedules.due(cron, timezone, next_run_at=next_run_at, now=now, catch_up=catch_up)
        for _, _, cron, timezone, _, catch_up, next_run_at in due
    ]
    claims = [(row[0], row[1], tick) for row, fire in zip(due, fires) for tick in fire.ticks]
    won: dict[tuple[str, str], list[float]] = {}
    if claims:
        for tenant, name, tick in (yield _rows("schedule_ticks_claim", *map(list, zip(*claims)), now)):
            won.setdefault((tenant, name), []).append(tick)
    jobs, fired = [], []
    for tenant, name, _, _, job, _, _ in due:
        for tick in sorted(won.get((tenant, name), ())):
            jobs.append(job_of(tenant, name, job, tick))
            fired.append(tick)
    inserted = (yield from _insert(jobs, now)) if jobs else []
    # in tick order: each schedule's latest tick and job win
    last = {(i.new.tenant, i.new.schedule): (tick, i.id) for tick, i in zip(fired, inserted)}
    # One statement each for the whole batch: a schedule's own would cost
    # its round trip (most of a round of a hundred due schedules).
    if due:
        advances = [
            (tenant, name, fire.next_run_at, *last.get((tenant, name), (None, None)))
            for (tenant, name, *_), fire in zip(due, fires)
        ]
        yield _run("schedule_advance", *map(list, zip(*advances)), now)
        yield _run("schedule_ticks_prune", *map(list, zip(*((row[0], row[1], row[6]) for row in due))))
    return len(due), inserted
