"""The storage seam: what the engine needs of a database, and nothing more.

Every backend (embedded SQLite, PostgreSQL) implements :class:`Store`; the
conformance suite in ``tests/test_store.py`` runs unchanged against each. The
rules every backend must keep:

* Each method is one transaction: it applies fully or not at all, and each
  state transition (a job's change with all it causes: its workflow's
  advance, the wake-ups) commits with it. One exception, on PostgreSQL: a
  report item that raced another change of its job is decided under the
  row lock, in a transaction of its own, after the rest of its batch.
* Time is given by the caller (``now``, epoch seconds); a store never reads a
  clock of its own, so the engine and the tests decide what time it is.
* Methods that act on many jobs (``jobs_claim``, ``jobs_complete``,
  ``jobs_fail``, ``jobs_heartbeat``) take the whole batch in one call so that a
  backend can serve it in one round trip.
* Decisions are not the store's: every outcome (a report against the job's
  state and token, retry or dead letter, lease expiry, cancel, retry,
  workflow advancement and failure) is decided by
  :mod:`qftrio.server.transitions`, whose docstring holds the report table
  and the lease token rules. A change reads what a decision needs, calls
  it, and executes what it decided with guarded writes ("set this if the
  job is running under this token"), which change nothing when the row
  moved on; each change is written once for every backend, in
  :mod:`.changes`, over the backend's named statements.

Workflow rules (docs/workflows.md, "How a workflow runs";
``tests/test_store_workflows.py``). A workflow's steps become jobs on queue
``default`` (``workflow_id``, ``step`` and the workflow's ``context`` as it
stands then set on the job, tenant the workflow's) once every dependency has
completed; steps without dependencies in ``workflow_create`` itself. Inside
the transaction of the job method that causes it:

* ``jobs_complete`` of a step's job merges its ``result`` into the context
  (top-level keys, later wins), counts the step done, enqueues the steps
  whose last dependency it was (reported in ``ReportResult.ready_queues``),
  and completes the workflow after its last step. Never a rescan of all
  steps: a per-step count of unfinished dependencies and per-edge rows.
* A step's job ending ``failed`` (``jobs_fail``, or ``jobs_reap_expired``)
  fails the workflow; ``job_cancel`` of a step's job, and
  ``workflow_cancel``, cancel it. Either way its unfinished steps are
  cancelled: their pending and running jobs become ``cancelled``, steps
  without a job are marked ``cancelled``.
* Two steps of one workflow expiring in one janitor round: the one whose
  lease ran out first (ties: the earlier step) is the failed one; the
  others are cancelled with an error naming it (:func:`~qftrio.server.transitions.reap`).
* ``job_retry`` of the failed step's job of a failed workflow resumes it:
  the workflow runs again, the job is pending with a fresh budget, and every
  step cancelled by the failure waits again (its job, if it had one, pending
  again at once, since its dependencies are done). Jobs handed out again
  carry the context as it stands at the retry. Retrying any other job of a
  failed workflow, or any job of a cancelled one, is a CONFLICT: a
  cancelled workflow is final.
* Invariants: one job per step at most (never a duplicate); a running
  workflow has no failed or cancelled step; ``jobs_prune`` never deletes a
  workflow's job on its own, only whole completed or cancelled workflows.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import os
import random
import re
import typing
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import trio

from ..._backoff import backoff as _backoff
from ...models import (
    JOB_FORM,
    to_datetime,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    ProgressItem,
    Job,
    Lease,
    Outcome,
    QueueStats,
    RateLimit,
    Schedule,
    SnoozeItem,
    Status,
    WorkerInfo,
    Workflow,
    WorkflowStatus,
)

__all__ = [
    "NewJob",
    "new_job_row",
    "Inserted",
    "new_ids",
    "unique_since",
    "Turns",
    "new_tokens",
    "issued",
    "ClaimRequest",
    "Outcome",
    "HeartbeatItem",
    "ProgressItem",
    "HeartbeatResult",
    "CompleteItem",
    "FailItem",
    "SnoozeItem",
    "ReportResult",
    "Reaped",
    "RetryAt",
    "RetryPolicy",
    "BulkAction",
    "BulkFilter",
    "BulkBatch",
    "workers_of",
    "DashboardSession",
    "bulk_changed",
    "NewStep",
    "NewSteps",
    "NewWorkflow",
    "WORKFLOW_QUEUE",
    "Page",
    "NewSchedule",
    "JobOfSchedule",
    "Store",
]

T = TypeVar("T")

#: ``retry_at(attempt, max_attempts, retryable, now, backoff)``: when a failed
#: attempt runs again, or ``None`` to dead-letter the job; *backoff* is the
#: job's own (``config.backoff``), or None. Supplied by the engine.
RetryAt = Callable[[int, int, bool, float, "dict[str, Any] | None"], "float | None"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """The server's retry backoff: exponential with jitter, capped.

    The *n*-th failed attempt waits ``min(cap, base * 2**(n-1))`` seconds,
    scaled by a random factor in ``[1 - jitter, 1]``. Defaults: 1 s, 2 s, 4 s,
    ... up to one hour. A job's own ``backoff`` (``{initial_secs, factor,
    max_secs, jitter}``) replaces it for that job's retries.
    """

    base_secs: float = 1.0
    cap_secs: float = 3600.0
    jitter: float = 0.5

    def delay(
        self, attempt: int, backoff: dict[str, Any] | None = None, rand: Callable[[], float] = random.random
    ) -> float:
        if backoff is None:
            return _backoff(attempt, base=self.base_secs, cap=self.cap_secs, jitter=self.jitter, rand=rand)
        return _backoff(
            attempt,
            base=backoff.get("initial_secs", self.base_secs),
            cap=backoff.get("max_secs", self.cap_secs),
            jitter=backoff.get("jitter", self.jitter),
            factor=backoff.get("factor", 2.0),
            rand=rand,
        )

    def retry_at(
        self, attempt: int, max_attempts: int, retryable: bool, now: float, backoff: dict[str, Any] | None = None
    ) -> float | None:
        if not retryable or attempt >= max_attempts:
            return None
        return now + self.delay(attempt, backoff)

#: ``run_listener``'s "wake every queue" (never a valid queue name).
ALL_QUEUES = "*"

#: The error recorded when a lease runs out with no attempts left.
LEASE_EXPIRED = "lease expired"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NewJob:
    """A job to insert. ``scheduled_at`` is absolute."""

    tenant: str
    queue: str
    kind: str
    payload: dict[str, Any]
    priority: int = 0
    max_attempts: int = 5
    scheduled_at: float
    idempotency_key: str | None = None
    workflow_id: str | None = None
    step: str | None = None
    context: dict[str, Any] | None = None
    timeout_secs: int | None = None
    backoff: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    #: The schedule that enqueues it.
    schedule: str | None = None
    #: ``{key, limit}``: claimed only while fewer than ``limit`` running jobs
    #: of the tenant carry ``key`` (a lease that ran out still counts).
    concurrency: dict[str, Any] | None = None
    #: A rate limit of the tenant: each claim of the job takes a unit of it.
    rate_limit: str | None = None
    #: ``{key, statuses, period_secs}``: inserted only if no job of the
    #: tenant with ``key`` is in ``statuses`` (created within
    #: ``period_secs``); that job is answered instead, as for a repeated
    #: idempotency key.
    unique: dict[str, Any] | None = None
    @property
    def flow_controlled(self) -> bool:
        """Whether a claim must weigh this job against others: never handed
        straight to a parked long-poll."""
        return self.concurrency is not None or self.rate_limit is not None


def new_job_row(json: Callable[[Any], Any]) -> Callable[[str, NewJob], tuple[Any, ...]]:
    """``row(job_id, new)``: the arguments of a store's insert of a job, its
    id and then :class:`NewJob`'s fields in their order, a JSON value (a
    dict field) through *json* and ``None`` as it is. Generated from the
    fields, so that a field added is inserted (tests/test_store_sql.py holds
    each store's insert to this order)."""
    hints = typing.get_type_hints(NewJob)
    values = ["job_id"]
    for field in dataclasses.fields(NewJob):
        value, hint = f"new.{field.name}", hints[field.name]
        optional = type(None) in typing.get_args(hint)
        if typing.get_origin(hint) is dict:
            value = f"_json({value})"
        elif optional and any(typing.get_origin(arg) is dict for arg in typing.get_args(hint)):
            value = f"None if {value} is None else _json({value})"
        values.append(value)
    env: dict[str, Any] = {"_json": json}
    exec("def row(job_id, new):\n    return (" + ", ".join(values) + ",)\n", env)
    row: Callable[[str, NewJob], tuple[Any, ...]] = env["row"]
    return row


class Turns:
    """Each queue's turn: successive claims of a queue serve its tenants
    from the next one each time (transitions.turns), whatever other queues
    are claimed in between."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def take(self, queue: str) -> int:
        turn = self._next.get(queue, 0)
        self._next[queue] = turn + 1
        return turn


def unique_since(unique: dict[str, Any], now: float) -> float:
    """The creation time after which a job matches a unique job's key."""
    period = unique.get("period_secs")
    return -math.inf if period is None else now - period


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ClaimRequest:
    """A claim to run in the same transaction as an insert: the arguments of
    :meth:`Store.jobs_claim` for one parked long-poll."""

    queue: str
    limit: int
    lease_secs: float
    worker_id: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Inserted:
    """One job of an insert, in order. A job this call created is *new* as
    given, pending since the insert's *now* (``at``), under the *id* the
    store gave it: nothing of it is read back. A job whose idempotency key
    matched an earlier one is that job, *existing*, returned unchanged."""

    id: str
    new: NewJob
    at: float
    existing: Job | None = None

    @property
    def created(self) -> bool:
        """Whether this call created the job."""
        return self.existing is None

    if TYPE_CHECKING:  # generated below, from Job's fields

        @property
        def job(self) -> Job:
            """The job as stored."""

        def to_wire(self) -> dict[str, Any]:
            """``self.job.to_wire()``, without building the job."""


def _inserted_forms() -> None:
    """``Inserted.job`` and ``Inserted.to_wire``, from :class:`Job`'s fields:
    each is *new*'s field of that name, what an insert sets (below), or
    else the field's default; a field of ``Job`` with none of the three
    fails here, at import."""
    env: dict[str, Any] = {"_PENDING": Status.PENDING}
    new_fields = {field.name for field in dataclasses.fields(NewJob)}
    given = {"id": "self.id", "status": "_PENDING", "attempt": "0", "created_at": "self.at", "updated_at": "self.at"}
    rest = [f.name for f in dataclasses.fields(Job) if f.name not in given and f.name not in new_fields]
    source = {**given, **JOB_FORM.defaults(rest, env)}

    def value(name: str) -> str:
        return source.get(name) or f"self.new.{name}"

    build = JOB_FORM.builder("job", "self", value, env)
    wire = JOB_FORM.writer("to_wire", "self", value, env, epoch=True)

    def job(self: Inserted) -> Job:
        return self.existing if self.existing is not None else build(self)  # type: ignore[no-any-return]

    def to_wire(self: Inserted) -> dict[str, Any]:
        return self.existing.to_wire() if self.existing is not None else wire(self)

    job.__doc__ = "The job as stored."
    to_wire.__doc__ = "``self.job.to_wire()``, without building the job."
    type.__setattr__(Inserted, "job", property(job))
    type.__setattr__(Inserted, "to_wire", to_wire)


_inserted_forms()


_RANDOM_62 = (1 << 62) - 1


def new_ids(n: int, now: float) -> list[str]:
    """The ids of *n* jobs or workflows created at *now*, on both stores:
    version-7 UUIDs (RFC 9562) in canonical form, whose first 48 bits are
    *now* in milliseconds and whose other 74 are random.

    Ids made later sort later, so the rows of a batch land next to each
    other at the end of the primary key rather than on as many random pages
    of it: the cost of an insert does not grow with the table (figures in
    docs/performance.md, "Time-ordered ids"). The ids of one batch sort in
    its order too: its jobs, claimed in that order, are next to each other
    in every index that ends with the id (the filtered pages'), not one
    page each (docs/performance.md, "Flow control at scale")."""
    head = (max(0, int(now * 1000)) & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | 0b10 << 62
    raw = os.urandom(10 * n)
    ids = []
    for i in range(0, 10 * n, 10):
        r = int.from_bytes(raw[i : i + 10])  # 80 random bits, of which 74 are used
        ids.append(str(uuid.UUID(int=head | (r >> 62 & 0xFFF) << 64 | (r & _RANDOM_62))))
    ids.sort()  # the random bits must not reorder a batch within its millisecond
    return ids


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def issued(value: str) -> bool:
    """Whether *value* may be an id or a lease token a store issued (a UUID
    in the canonical form :func:`new_ids` and :func:`new_tokens` write):
    any other string names nothing, on every store."""
    return isinstance(value, str) and _CANONICAL_UUID.fullmatch(value) is not None


def new_tokens(n: int) -> list[str]:
    """*n* lease tokens: random version-4 UUIDs in canonical form, which
    tell nothing of when they were made."""
    return [str(uuid.uuid4()) for _ in range(n)]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HeartbeatResult:
    """``status`` and ``locked_until`` are set when ``outcome`` is OK;
    ``locked_until`` only when the lease was extended (status running)."""

    outcome: Outcome
    status: Status | None = None
    locked_until: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReportResult:
    """The outcome of one complete or fail. ``queue`` and ``status`` (the
    job's status afterwards) are set when ``outcome`` is OK; ``applied`` is
    False for a replay that changed nothing."""

    outcome: Outcome
    queue: str | None = None
    status: Status | None = None
    applied: bool = False
    #: The job's kind, and when the attempt this report ended was claimed,
    #: for the metrics; set when ``applied``.
    kind: str | None = None
    claimed_at: float | None = None
    #: Queues on which this report made new jobs ready (workflow steps it
    #: unblocked), so that the engine can wake their parked long-polls.
    ready_queues: tuple[str, ...] = ()
    #: Whether the job it ended held a concurrency key: its place is free, and
    #: jobs of that key on any queue may be claimable now; set when ``applied``.
    keyed: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Reaped:
    """A running job whose lease ran out, as the janitor left it."""

    job_id: str
    queue: str
    status: Status  # PENDING (attempts left) or FAILED ("lease expired")
    kind: str = ""
    #: Whether it held a concurrency key: its place is free, as when a report
    #: ends such a job.
    keyed: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NewStep:
    """One step of a workflow to create."""

    name: str
    kind: str
    payload: dict[str, Any]
    depends_on: tuple[str, ...] = ()
    max_attempts: int = 5


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NewWorkflow:
    """A workflow to create. The caller has checked the graph
    (:func:`qftrio.server.workflows.check_graph`): unique names, known
    dependencies, no cycle."""

    tenant: str
    name: str
    context: dict[str, Any]
    steps: tuple[NewStep, ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NewSteps:
    """Steps a running step (the job *job_id*, under *lease_token*) adds
    to its workflow, their results collected under *collect* if set. The
    store checks them against the workflow
    (:func:`qftrio.server.workflows.check_added`)."""

    job_id: str
    lease_token: str
    steps: tuple[NewStep, ...]
    collect: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """A page of a listing, newest first: its *items*, and the key
    ``(created_at, id)`` of the last of them when more follow (where the
    next page starts), else None."""

    items: list[T]
    next: tuple[float, str] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NewSchedule:
    """A schedule to store (``PUT``). The caller has checked it: ``cron``
    and ``timezone`` read (:func:`qftrio.server.schedules.check`), ``job`` a
    valid enqueue body."""

    tenant: str
    name: str
    cron: str
    timezone: str
    job: dict[str, Any]
    paused: bool
    catch_up: str


#: ``job_of_schedule(tenant, name, job, tick)``: the job a schedule's tick
#: (or trigger, at its time) enqueues, from the schedule's ``job``, as the
#: engine's enqueue reads it. Supplied by the engine.
JobOfSchedule = Callable[[str, str, dict[str, Any], float], NewJob]


#: The queue workflow steps run on.
WORKFLOW_QUEUE = "default"

#: What a bulk action does to each matching job: ``retry`` as
#: :meth:`Store.job_retry`, ``cancel`` as :meth:`Store.job_cancel`, ``delete``
#: removes a finished job (never a workflow's job on its own).
BulkAction = Literal["retry", "cancel", "delete"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BulkFilter:
    """Which of a tenant's jobs a bulk action considers: every one of the
    *statuses* (never empty) that matches the optional queue, kind and
    creation time range (``created_after <= created_at < created_before``)."""

    tenant: str
    statuses: tuple[Status, ...]
    queue: str | None = None
    kind: str | None = None
    created_after: float | None = None
    created_before: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BulkBatch:
    """One batch of a bulk action: how many jobs it changed, the queues on
    which it made jobs ready, and the key ``(created_at, id)`` of the last
    job it considered, where the next batch starts (None: nothing is left)."""

    changed: int
    ready_queues: tuple[str, ...] = ()
    #: Whether it cancelled a job of a concurrency key (whose place, if it
    #: was running, is free).
    keyed: bool = False
    last: tuple[float, str] | None = None


#: The status a bulk action leaves the jobs it changes in (None: deleted).
BULK_TARGET: dict[str, Status | None] = {"retry": Status.PENDING, "cancel": Status.CANCELLED, "delete": None}


def bulk_changed(action: BulkAction, considered: int, after: dict[str, int]) -> int:
    """How many of the *considered* jobs of a bulk batch (all in a status
    the action applies to when it began) it changed, from their statuses
    once it is done (*after*: ``{status: jobs}``). Counted so rather than
    call by call, a job moved by another's consequence (the sibling steps a
    cancel or a resume of their workflow took along) counts too."""
    target = BULK_TARGET[action]
    if target is None:
        return considered - sum(after.values())
    return after.get(target.value, 0)


def workers_of(rows: Iterable[Sequence[Any]]) -> list[WorkerInfo]:
    """:meth:`Store.workers` from rows ``(worker_id, queue, job id, seen)``:
    a running job with its latest claim or heartbeat, or a sighting (job id
    None) with its time. Most jobs first, then the latest seen, then by id."""
    held: dict[str, tuple[list[str], set[str], float]] = {}
    for worker_id, queue, job_id, seen in rows:
        jobs, queues, last = held.setdefault(worker_id, ([], set(), seen))
        if job_id is not None:
            jobs.append(str(job_id))
        queues.add(queue)
        held[worker_id] = (jobs, queues, max(last, seen))
    # most jobs first, then the latest seen, then by id
    ordered = sorted(held.items(), key=lambda item: (-len(item[1][0]), -item[1][2], item[0]))
    return [
        WorkerInfo(
            worker_id=worker_id,
            jobs=len(jobs),
            job_ids=tuple(sorted(jobs)),
            queues=tuple(sorted(queues)),
            last_seen_at=to_datetime(last),
        )
        for worker_id, (jobs, queues, last) in ordered
    ]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DashboardSession:
    """A dashboard session as the store keeps it (keyed by the SHA-256 of
    its id, which only the browser holds). Valid while ``idle_until`` is
    ahead; a touch moves ``idle_until`` on, never past ``expires_at``."""

    tenant: str
    #: The session's own secret: its CSRF token is derived from it.
    secret: str
    #: HMAC of the token signed in with, under ``secret``.
    token_mac: str
    created_at: float
    idle_until: float
    expires_at: float


class Store(abc.ABC):
    """A job store. See the module docstring for the rules."""

    #: Called on Trio's thread with the id of each job ended (completed,
    #: failed, cancelled) while a wait on it was registered
    #: (:meth:`job_wait_begin`), by this process or, on a store several
    #: servers share, by any of them (through :meth:`run_listener`, which
    #: then runs only while :meth:`notifications_wanted` says so). It may
    #: also be called for a job that did not end (a change rolled back): a
    #: wait reads the job again.
    on_ended: Callable[[str], None] | None = None

    #: Called on Trio's thread with each change of a job whose tenant has an
    #: event stream registered (:meth:`events_begin`), by this process or,
    #: on a store several servers share, by any of them, in the order each
    #: server committed them: a dict of the job's ``id``, ``tenant``,
    #: ``queue``, ``kind``, ``status``, ``attempt``, ``progress`` and ``at``
    #: (its ``updated_at``), or, when its progress was too large to carry,
    #: ``progress_omitted`` instead of ``progress``. A change is an enqueue,
    #: or a new status, attempt or progress (a heartbeat that changes none
    #: of these is not one). ``{"lost": True}`` says that changes may have
    #: been missed (the store could not keep up, or lost its connection).
    on_event: Callable[[dict[str, Any]], None] | None = None

    # -- lifecycle ---------------------------------------------------------

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections and threads. Idempotent."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise if the database cannot be reached."""

    async def run_listener(
        self,
        on_notify: Callable[[str], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``on_notify(queue)`` whenever another process makes work
        ready on ``queue``, or ``on_notify(ALL_QUEUES)`` when notifications
        may have been missed (a reconnect): every queue should look again.
        Runs until cancelled. Backends that serve a single process (SQLite)
        have nothing to listen to."""
        task_status.started()
        await trio.sleep_forever()

    async def notifications_wanted(self, wait_secs: float) -> None:
        """A long-poll is about to wait up to *wait_secs* for work: make
        sure that :meth:`run_listener` passes on, from when this returns,
        what other processes notify (a backend may listen only while some
        poll waits). Returns at once where there is nothing to listen to,
        and after a bounded wait where the database cannot be reached (the
        poll's safety poll covers what it then misses)."""

    # -- application side --------------------------------------------------

    @abc.abstractmethod
    async def jobs_insert(self, jobs: Sequence[NewJob], *, now: float) -> list[Inserted]:
        """Insert *jobs* in one transaction, in order. A job whose
        ``(tenant, idempotency_key)`` exists (or appears earlier in the same
        batch) is not inserted; the existing job is returned instead."""

    @abc.abstractmethod
    async def jobs_insert_claiming(
        self, jobs: Sequence[NewJob], *, now: float, claims: Sequence[ClaimRequest]
    ) -> tuple[list[Inserted], list[list[Lease]]]:
        """:meth:`jobs_insert`, then :meth:`jobs_claim` for each of *claims*
        in order, all in one transaction: the leases of each claim, in its
        order. The engine hands the jobs an enqueue creates straight to the
        long-polls parked on their queue, with one commit instead of two."""

    @abc.abstractmethod
    async def job_get(self, job_id: str, *, tenant: str | None = None) -> Job | None:
        """The job, or None if unknown (or owned by a tenant other than
        *tenant* when one is given). *job_id* may be any string."""

    @abc.abstractmethod
    async def jobs_page(
        self,
        *,
        tenant: str,
        queue: str | None = None,
        status: Status | None = None,
        kind: str | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        max_bytes: int | None = None,
    ) -> Page[Job]:
        """Up to *limit* jobs, newest first by ``(created_at, id)``; *before*
        is the key of the last job of the previous page. With *max_bytes*,
        the page stops before the job that would take the jobs' size on the
        wire (as ``job_bytes`` reckons it, never less) past it, though never
        before its first job: the sizes are read with the keys, and only the
        jobs that fit are loaded. O(page) for every combination of filters,
        however many jobs are kept."""

    async def jobs_list(
        self,
        *,
        tenant: str,
        queue: str | None = None,
        status: Status | None = None,
        kind: str | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
    ) -> list[Job]:
        """The jobs of :meth:`jobs_page`, with no byte budget."""
        page = await self.jobs_page(tenant=tenant, queue=queue, status=status, kind=kind, limit=limit, before=before)
        return page.items

    @abc.abstractmethod
    async def job_cancel(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        """Cancel a pending or running job (a workflow step's: the workflow
        too, see the module docstring). Returns None if unknown; raises
        :class:`~qftrio.errors.Conflict` if the job is terminal."""

    @abc.abstractmethod
    async def job_retry(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        """Put a failed or cancelled job back to pending, attempt 0, ready at
        *now*, lease token cleared (a workflow step's: see the module
        docstring). Returns None if unknown; raises
        :class:`~qftrio.errors.Conflict` for any other status."""

    @abc.abstractmethod
    async def queues_stats(self, *, tenant: str, now: float, queue: str | None = None) -> list[QueueStats]:
        """Stats of every queue the tenant has jobs in or has paused (or of
        *queue* only, with zero counts if it has none), sorted by name.
        Exact counts, kept in the transactions that change them; the cost
        does not grow with the number of jobs kept."""

    @abc.abstractmethod
    async def queues_page(self, *, tenant: str, now: float, limit: int, after: str | None = None) -> list[QueueStats]:
        """Stats of the first *limit* queues, by name, that the tenant has
        jobs in or has paused, named after *after* (the last queue of the
        previous page) when given: as :meth:`queues_stats`, at a cost of
        O(*limit*), however many queues the tenant has."""

    @abc.abstractmethod
    async def queues_overview(self, *, now: float) -> list[tuple[str, QueueStats]]:
        """``(tenant, stats)`` of every tenant's queues, sorted: the gauges of
        ``/metrics``. Costs what :meth:`queues_stats` costs per queue."""

    @abc.abstractmethod
    async def queue_set_paused(self, *, tenant: str, queue: str, paused: bool, now: float) -> None:
        """Pause or resume the tenant's *queue* (idempotent), for every server
        on the database: while paused, claims (and the hand-off of new jobs
        to parked long-polls) take none of the tenant's jobs of the queue,
        and :meth:`queue_next_available_at` leaves them out. Resuming wakes
        the queue's long-polls on every server."""

    @abc.abstractmethod
    async def jobs_bulk(
        self, action: BulkAction, where: BulkFilter, *, limit: int, after: tuple[float, str] | None, now: float
    ) -> BulkBatch:
        """One batch of a bulk action, in one transaction: the first *limit*
        jobs matching *where* newest first by ``(created_at, id)`` (after the
        key *after*, the previous batch's ``last``), each decided as the
        single-job call decides it (:mod:`qftrio.server.transitions`): a job
        the decision refuses (a step of a cancelled workflow, a job that
        moved on meanwhile) is left as it is and not counted. Jobs another
        server holds locked at that moment may be left for a later batch."""

    @abc.abstractmethod
    async def jobs_scheduled(self, *, tenant: str, now: float, queue: str | None = None, limit: int = 100) -> list[Job]:
        """The tenant's pending jobs whose time has not come (``scheduled_at
        > now``: delayed, waiting for a retry, snoozed), of *queue* when
        given, next to run first (by ``scheduled_at``), at most *limit*.
        Costs O(queues x limit) index entries, whatever the table holds."""

    @abc.abstractmethod
    async def workers(self, *, tenant: str, seen_since: float) -> list[WorkerInfo]:
        """The workers the tenant sees (:func:`workers_of`): those holding
        its running jobs (the ids, the latest claim or heartbeat), and those
        seen (:meth:`workers_seen`) at or after *seen_since* on a queue that
        holds jobs of the tenant, in any status, or that it paused. Costs
        O(running jobs + sightings)."""

    @abc.abstractmethod
    async def workers_seen(self, sightings: Sequence[tuple[str, str]], *, now: float) -> None:
        """Record that each ``(worker_id, queue)`` called lease at *now*
        (a later time already recorded stays)."""

    @abc.abstractmethod
    async def sightings_purge(self, *, before: float) -> None:
        """Forget the sightings older than *before*."""

    # -- dashboard sessions ------------------------------------------------

    @abc.abstractmethod
    async def session_create(self, key: str, session: DashboardSession) -> None:
        """Keep *session* under *key* (the SHA-256 of its id)."""

    @abc.abstractmethod
    async def session_get(self, key: str, *, now: float) -> DashboardSession | None:
        """The session under *key* if it is still valid at *now*."""

    @abc.abstractmethod
    async def session_touch(self, key: str, *, idle_until: float) -> None:
        """Move the session's idle end to *idle_until* (never past its
        absolute end)."""

    @abc.abstractmethod
    async def session_delete(self, key: str) -> None:
        """Forget the session under *key* (sign-out; idempotent)."""

    @abc.abstractmethod
    async def sessions_purge(self, *, now: float) -> None:
        """Delete the sessions that are no longer valid at *now*."""

    @abc.abstractmethod
    async def rate_limit_set(self, *, tenant: str, name: str, limit: int, per_secs: float) -> bool:
        """Declare (or change) the tenant's rate limit *name*; whether it is
        new. A change keeps the claims of the current window: they count."""

    @abc.abstractmethod
    async def rate_limits_list(self, *, tenant: str, now: float, names: Sequence[str] | None = None) -> list[RateLimit]:
        """The tenant's rate limits (those of *names*, if given), by name,
        each with when its next unit frees up at *now*."""

    @abc.abstractmethod
    async def rate_limit_delete(self, *, tenant: str, name: str) -> bool:
        """Forget the tenant's rate limit *name* (its jobs are no longer
        held back by it); whether it existed."""

    async def counts_fold(self) -> None:
        """Compact what keeps the counts of :meth:`queues_stats` (the
        janitor calls it every round). Backends whose counts need no
        compaction do nothing."""

    # -- schedules -----------------------------------------------------------
    # Each written once, in .changes (docs/schedules.md).

    @abc.abstractmethod
    async def schedule_put(self, schedule: NewSchedule, *, now: float) -> tuple[Schedule, bool]:
        """Create or replace the tenant's schedule; whether it was created.
        Its next run: :func:`qftrio.server.schedules.next_on_put`."""

    @abc.abstractmethod
    async def schedule_get(self, tenant: str, name: str) -> Schedule | None:
        """The tenant's schedule *name*, or None."""

    @abc.abstractmethod
    async def schedules_list(self, tenant: str, *, limit: int, after: str | None = None) -> list[Schedule]:
        """The tenant's schedules by name, the first *limit* after *after*."""

    @abc.abstractmethod
    async def schedule_delete(self, tenant: str, name: str) -> bool:
        """Delete the schedule (the jobs it enqueued stay); whether it existed."""

    @abc.abstractmethod
    async def schedule_set_paused(self, tenant: str, name: str, *, paused: bool, now: float) -> Schedule | None:
        """Pause (no next run) or resume (the next tick after *now*: the
        ticks of the pause are not caught up) the schedule; None if unknown."""

    @abc.abstractmethod
    async def schedule_trigger(
        self, tenant: str, name: str, *, now: float, job_of: JobOfSchedule
    ) -> tuple[Schedule, Inserted] | None:
        """Enqueue one job of the schedule now, outside its ticks (its last
        run and job become these); None if unknown."""

    @abc.abstractmethod
    async def schedules_fire(self, *, now: float, limit: int, job_of: JobOfSchedule) -> tuple[int, list[Inserted]]:
        """One janitor batch: up to *limit* due schedules (next run at or
        before *now*, none another server is firing), each firing the ticks
        :func:`qftrio.server.schedules.due` decides, one job per tick won,
        and moved on to its next run, in one transaction. Returns how many
        schedules it took and the jobs it enqueued."""

    # -- worker side -------------------------------------------------------

    @abc.abstractmethod
    async def jobs_claim(
        self, queue: str, *, limit: int, lease_secs: float, worker_id: str | None, now: float
    ) -> list[Lease]:
        """Claim up to *limit* jobs of *queue*, in lease order (priority
        desc, scheduled_at, created_at). Claimable: pending with
        ``scheduled_at <= now``, and running with ``locked_until < now`` and
        attempts left (its expired attempt is recorded as ``lease expired`` in
        ``errors``). Each claimed job becomes running, attempt + 1,
        ``locked_until = now + lease_secs``, a fresh lease token, *worker_id*.
        Never hands one job to two concurrent callers."""

    @abc.abstractmethod
    async def queue_next_available_at(self, queue: str, *, now: float) -> float | None:
        """The earliest future time at which a job of *queue* becomes
        claimable (a pending job scheduled ahead of its creation, or a
        running lease running out), across tenants; None if nothing is due."""

    @abc.abstractmethod
    async def jobs_heartbeat(self, items: Sequence[HeartbeatItem], *, now: float) -> list[HeartbeatResult]:
        """One result per item, in order. An extended lease sets
        ``locked_until`` and ``updated_at``."""

    @abc.abstractmethod
    async def job_wait_begin(self, job_id: str, *, now: float, wait_secs: float) -> str:
        """Register a wait on *job_id* for up to *wait_secs* from *now*, so
        that its end is passed to :attr:`on_ended`; returns the wait's id,
        for :meth:`job_wait_end`."""

    @abc.abstractmethod
    async def job_wait_end(self, wait_id: str) -> None:
        """Remove a wait :meth:`job_wait_begin` registered."""

    @abc.abstractmethod
    async def events_begin(self, tenant: str, *, now: float, until: float) -> str:
        """Register an event stream of *tenant*'s, so that its jobs' changes
        are passed to :attr:`on_event` until :meth:`events_end`, or *until*
        (epoch seconds) if this server dies first; returns its id."""

    @abc.abstractmethod
    async def events_renew(self, stream_id: str, *, until: float) -> None:
        """Keep the stream *stream_id* registered until *until*."""

    @abc.abstractmethod
    async def events_end(self, stream_id: str) -> None:
        """Remove a stream :meth:`events_begin` registered."""

    @abc.abstractmethod
    async def jobs_progress(self, items: Sequence[ProgressItem], *, now: float) -> list[HeartbeatResult]:
        """One result per item, in order, as a heartbeat's without extending
        anything (:func:`transitions.progress`); a running job under its
        current token has its ``progress``, ``progress_at`` and
        ``updated_at`` replaced, the batch's last item of a lease winning."""

    @abc.abstractmethod
    async def jobs_complete(self, items: Sequence[CompleteItem], *, now: float) -> list[ReportResult]:
        """One result per item, in order. Completion clears ``locked_until``
        and stores ``result``."""

    @abc.abstractmethod
    async def jobs_fail(self, items: Sequence[FailItem], *, now: float, retry_at: RetryAt) -> list[ReportResult]:
        """One result per item, in order. Records the error (``error`` and a
        new ``errors`` entry for the attempt). ``retry_at`` decides: a time
        puts the job back to pending scheduled then; None makes it failed."""

    @abc.abstractmethod
    async def jobs_snooze(self, items: Sequence[SnoozeItem], *, now: float) -> list[ReportResult]:
        """One result per item, in order, as
        :func:`~qftrio.server.transitions.snooze` decides: a job running
        under the token goes back to pending at ``now + delay_secs``, its
        ``max_attempts`` raised by one (the attempt is not used up),
        ``locked_until`` cleared; its token stays (a replay answers OK)."""

    @abc.abstractmethod
    async def jobs_reap_expired(
        self, *, now: float, limit: int = 1000, retry_at: RetryAt = RetryPolicy().retry_at
    ) -> list[Reaped]:
        """Running jobs with ``locked_until < now``, first expired first, as
        :func:`~qftrio.server.transitions.reap` decides: back to pending when
        attempts are left, else failed with error ``lease expired``; a
        sibling of a workflow's failed step cancelled. A job whose lease ran
        to its deadline (``timeout_secs``) timed out instead: failed with
        ``timed out after N s``, retried when *retry_at* gives a time. The
        lease token and ``locked_until`` are cleared either way,
        ``worker_id`` stays. Returns the pending and failed ones."""

    @abc.abstractmethod
    async def jobs_prune(self, *, before: float, limit: int = 10000) -> int:
        """Delete up to *limit* completed or cancelled jobs last updated
        before *before*, and completed or cancelled workflows last updated
        before *before* with all their steps and jobs (a workflow's job is
        never deleted on its own). Returns how many jobs went."""

    # -- workflows ---------------------------------------------------------

    @abc.abstractmethod
    async def workflow_create(self, workflow: NewWorkflow, *, now: float) -> Workflow:
        """Store *workflow* (status running, steps waiting) and enqueue, in
        the same transaction, the jobs of its steps without dependencies.
        Returns it as :meth:`workflow_get` would."""

    @abc.abstractmethod
    async def steps_add(self, added: NewSteps, *, now: float) -> Workflow | None:
        """Add *added*'s steps to the workflow of the running step
        *added.job_id*, in one transaction (DESIGN §4, "Steps added at run
        time"): each waits for the adding step and its own dependencies;
        every step that waited for the adding step waits for them too.
        The same steps added again by the same step change nothing.
        Returns the workflow as :meth:`workflow_get` would; None for an
        unknown job. Raises :class:`~qftrio.errors.Conflict` when the token
        is not current or the job no longer runs, or when the step added
        steps of these names with other fields, and
        :class:`~qftrio.errors.InvalidInput` for a job outside workflows or
        steps that do not fit the workflow; nothing is added then."""

    @abc.abstractmethod
    async def workflow_get(self, workflow_id: str, *, tenant: str | None = None, jobs: bool = True) -> Workflow | None:
        """The workflow with its steps in creation order, each with its job
        (``jobs=False``: ``job`` left ``None``, status and ``job_id`` only);
        None if unknown or another tenant's. *workflow_id* may be any string."""

    @abc.abstractmethod
    async def workflows_page(
        self,
        *,
        tenant: str,
        status: WorkflowStatus | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        max_bytes: int | None = None,
    ) -> Page[Workflow]:
        """Up to *limit* workflows, newest first by ``(created_at, id)``,
        steps without their jobs; *before* is the key of the last workflow of
        the previous page. *max_bytes* as for :meth:`jobs_page` (a
        workflow's size: its context and its steps, ``workflow_bytes``)."""

    async def workflows_list(
        self,
        *,
        tenant: str,
        status: WorkflowStatus | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
    ) -> list[Workflow]:
        """The workflows of :meth:`workflows_page`, with no byte budget."""
        return (await self.workflows_page(tenant=tenant, status=status, limit=limit, before=before)).items

    @abc.abstractmethod
    async def workflow_cancel(self, workflow_id: str, *, tenant: str, now: float) -> Workflow | None:
        """Cancel a running workflow and its unfinished steps. Returns None
        if unknown; raises :class:`~qftrio.errors.Conflict` if it has ended."""
