"""Wire models shared by the server, the HTTP client and the worker runtime.

Records (:class:`Job`, :class:`Lease`, :class:`QueueStats`) are frozen,
keyword-only dataclasses with ``to_wire``/``from_wire`` for their JSON form.
Request bodies are pydantic models: the server validates with them and the
client builds its calls from them, so both sides agree on every field.

Times are carried as float seconds since the Unix epoch inside qftrio and as
RFC 3339 UTC strings (``2026-01-02T03:04:05.123456Z``) on the wire.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import functools
import math
import re
import time
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    create_model,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from . import _progress, errors
from ._json import dumps as _json_dumps

__all__ = [
    "NAME_PATTERN",
    "Status",
    "TERMINAL",
    "Job",
    "Lease",
    "QueueStats",
    "RateLimit",
    "WorkerInfo",
    "ErrorEntry",
    "WorkflowStatus",
    "StepStatus",
    "WorkflowStep",
    "Workflow",
    "Schedule",
    "Outcome",
    "HeartbeatReply",
    "ReportReply",
    "find_nul",
    "refuse_nul",
    "format_time",
    "parse_time",
]

NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
_NAME_RE = re.compile(NAME_PATTERN)

#: Caps shared by the server's validation and the client's documentation.
MAX_BATCH = 1000
MAX_LEASE_JOBS = 100
MAX_LEASE_SECS = 3600
MAX_WAIT_SECS = 60
#: A workflow has at most this many steps, and this many dependencies in all.
MAX_WORKFLOW_STEPS = 1000
MAX_WORKFLOW_DEPENDENCIES = 20_000
#: ``GET /api/v1/workflows`` pages hold at most this many workflows.
MAX_WORKFLOWS_PAGE = 100
#: Field caps of request bodies (docs/protocol.md lists them). The worker
#: runtime checks its worker id and cuts its errors to these too.
MAX_WORKER_ID = 200
MAX_TOKEN = 200
MAX_ERROR = 65536
MAX_IDEMPOTENCY_KEY = 255
MAX_JOB_ID = 100
MAX_WORKFLOW_NAME = 200
#: A bulk action changes at most this many jobs per call (default 10,000).
MAX_BULK = 1_000_000
#: A page of jobs or workflows stops before the item that would take it past
#: this many bytes, by default (``qftrio serve --max-answer-bytes``).
MAX_ANSWER_BYTES = 8 << 20
#: ``GET /api/v1/queues`` pages hold this many queues unless asked for
#: fewer, and at most ``MAX_QUEUES_PAGE``.
QUEUES_PAGE = 100
MAX_QUEUES_PAGE = 1000
#: A job's timeout, at most (``config.timeout_secs``).
MAX_TIMEOUT_SECS = 7 * 86400
#: Queue stats count the scheduled jobs of a queue up to this many, so that
#: their cost does not grow with the jobs kept.
MAX_SCHEDULED_COUNT = 10_000
#: A snooze's delay and a fail's ``retry_in_secs``, at most.
MAX_DELAY_SECS = 30 * 86400


def timeout_error(timeout_secs: int | None) -> str:
    """The error of an attempt that ran past its job's ``timeout_secs``: the
    server's (its janitor ends the attempt) and the worker runtime's (it
    cancels the handler then), alike."""
    return f"timed out after {timeout_secs} s"
#: A job's ``headers``: the bytes (UTF-8) of all their names and values
#: together, and of one name.
MAX_HEADERS_BYTES = 8192
#: A job's ``progress``: the bytes of its JSON text (docs/worker.md, "Progress").
MAX_PROGRESS_BYTES = 8192
MAX_HEADER_NAME = 256


def valid_name(name: str) -> bool:
    """Whether *name* is a valid queue or kind name (the whole of it: ``$``
    alone would let a final newline through)."""
    return _NAME_RE.fullmatch(name) is not None


class Status(str, enum.Enum):
    """The life cycle of a job."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})

#: Each status by its value: what ``Status(value)`` gives, for the paths that
#: convert one per job (a dict lookup instead of the Enum's call).
STATUS_OF: dict[str, Status] = {status.value: status for status in Status}


def format_time(ts: float | None) -> str | None:
    """Epoch seconds to an RFC 3339 UTC string (microsecond precision)."""
    if ts is None:
        return None
    return _format_time(ts)


# Every timestamp of every job in every answer comes through here, and the
# jobs of one lease share most of theirs (claimed at the same instant,
# enqueued in the same batch): a small cache answers those at once. The
# formatting itself is hand-rolled, a third faster than datetime.strftime.
@functools.lru_cache(maxsize=4096)
def _format_time(ts: float) -> str:
    secs = math.floor(ts)
    micros = round((ts - secs) * 1_000_000)
    if micros == 1_000_000:
        secs, micros = secs + 1, 0
    t = time.gmtime(secs)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, micros)


def parse_time(value: str | float | _dt.datetime | None) -> float | None:
    """An RFC 3339 string (or datetime, or epoch seconds) to epoch seconds."""
    if type(value) is str:  # first: a worker parses four per leased job
        return _parse_time_string(value)
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _parse_time_string(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.timestamp()


# The other way round, for workers reading leases: the jobs of one answer
# share most of their timestamps too (a few distinct ones per answer, so a
# small cache does).
@functools.lru_cache(maxsize=1024)
def _parse_time_string(value: str) -> float:
    parsed = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.timezone.utc)
    return parsed.timestamp()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ErrorEntry:
    """One failed attempt in a job's error history."""

    attempt: int
    error: str
    at: float

    def to_wire(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "error": self.error, "at": format_time(self.at)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ErrorEntry:
        return cls(attempt=data["attempt"], error=data["error"], at=parse_time(data["at"]) or 0.0)


class _Rfc3339:
    """Marks a field held as epoch seconds and carried as an RFC 3339 string."""


#: A time: epoch seconds inside qftrio, an RFC 3339 UTC string on the wire.
Epoch = Annotated[float, _Rfc3339]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """A job as the API shows it (docs/protocol.md, "The job").

    Its fields are declared here alone: its wire form (:meth:`to_wire`,
    :meth:`from_wire`) and its schema in /openapi.json (``JobAnswer``)
    follow from them (:class:`_WireForm`). A field with a default may be
    left out of the wire form read.
    """

    id: str
    tenant: str
    queue: str
    kind: str
    payload: dict[str, Any]
    status: Status
    priority: int
    attempt: int
    max_attempts: int
    scheduled_at: Epoch
    created_at: Epoch
    updated_at: Epoch
    locked_until: Epoch | None = None
    worker_id: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    errors: tuple[ErrorEntry, ...] = ()
    workflow_id: str | None = None
    step: str | None = None
    context: dict[str, Any] | None = None
    #: The job's own policies, as enqueued (docs/protocol.md, "Enqueue").
    timeout_secs: int | None = None
    backoff: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    #: The name of the schedule that enqueued it (docs/schedules.md).
    schedule: str | None = None
    #: Its flow control, as enqueued (docs/flow-control.md), else None.
    concurrency: dict[str, Any] | None = None
    rate_limit: str | None = None
    unique: dict[str, Any] | None = None
    #: The last progress its handler reported (the wire's ``progress``), and
    #: when (docs/worker.md, "Progress"); ``job.progress(obj)`` reports it.
    last_progress: dict[str, Any] | None = dataclasses.field(default=None, metadata={"wire": "progress"})
    progress_at: Epoch | None = None

    def progress(self, progress: dict[str, Any]) -> None:
        """Report how far this job's handler has got: a JSON object of at
        most 8 KiB, sent with the worker's next heartbeat batch (within a
        second); the latest one reported wins. Only a handler the worker
        runtime runs can report its job's progress."""
        _progress.report(self.id, progress)

    if typing.TYPE_CHECKING:  # generated below, by _WireForm

        def to_wire(self) -> dict[str, Any]: ...

        @classmethod
        def from_wire(cls, data: dict[str, Any]) -> Job: ...


class _WireForm:
    """The wire form of a record class, from its fields' types: a time
    (:data:`Epoch`) as an RFC 3339 string, an enum as its value, a tuple of
    records as a list of their wire forms, anything else as it is; and the
    pydantic model of that form (:meth:`answer_model`), for /openapi.json.

    ``to_wire`` and ``from_wire`` are generated as source and set on the
    class, the way :mod:`dataclasses` generates ``__init__``: every leased
    job goes through them, on the server and in the worker, and a loop over
    the fields costs 70 % more per job than the written-out form.

    ``__init__`` is generated again too, the same signature with the same
    defaults: a frozen dataclass's own sets each field through
    ``object.__setattr__``, a lookup through the class each time, while a
    slot's descriptor sets it at once, in half the time (a job of 27 fields:
    2.6 µs down to 1.5, once per claimed job on the server and once per
    leased job in the worker).
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.hints = typing.get_type_hints(cls, include_extras=True)
        self.fields = dataclasses.fields(cls)
        env: dict[str, Any] = {"__name__": cls.__module__, "format_time": format_time, "parse_time": parse_time}
        out, read = [], []
        for field in self.fields:
            name, wire = field.name, _wire_name(field)
            kind, inner, optional = self._kind(self.hints[name])
            value, got = f"self.{name}", self._read(field, env)
            if kind == "time":
                out.append(f"{wire!r}: format_time({value})")
                got = f"parse_time({got})"
            elif kind == "enum":
                env[f"_lookup_{name}"] = {member.value: member for member in inner}
                env[f"_enum_{name}"] = inner
                form = f"{value}.value"
                out.append(f"{wire!r}: None if {value} is None else {form}" if optional else f"{wire!r}: {form}")
                member = f"(_lookup_{name}.get({got}) or _enum_{name}({got}))"  # a dict lookup first: faster
                got = f"(None if {got} is None else {member})" if optional else member
            elif kind == "records":
                env[f"_records_{name}"] = functools.partial(_records, inner.from_wire)
                out.append(f"{wire!r}: [item.to_wire() for item in {value}]")
                got = f"_records_{name}({got})"
            else:
                out.append(f"{wire!r}: {value}")
            read.append(f"{name}={got}")
        source = (
            "def to_wire(self):\n    return {" + ", ".join(out) + "}\n"
            "def from_wire(cls, data):\n    get = data.get\n    return cls(" + ", ".join(read) + ")\n"
        )
        source += self._init_source(env)
        exec(source, env)
        env["__init__"].__qualname__ = f"{cls.__qualname__}.__init__"
        type.__setattr__(cls, "__init__", env["__init__"])
        self.to_wire: Callable[[Any], dict[str, Any]] = env["to_wire"]
        self.from_wire: Callable[[type, dict[str, Any]], Any] = env["from_wire"]
        for function in (self.to_wire, self.from_wire):
            function.__qualname__ = f"{cls.__qualname__}.{function.__name__}"
        type.__setattr__(cls, "to_wire", self.to_wire)
        type.__setattr__(cls, "from_wire", classmethod(self.from_wire))

    def _init_source(self, env: dict[str, Any]) -> str:
        """The source of ``__init__``: keyword-only, as the dataclass's, each
        field set through its slot."""
        cls = self.cls
        frozen = getattr(cls, "__dataclass_params__").frozen
        assert frozen and "__slots__" in cls.__dict__ and not hasattr(cls, "__post_init__")
        params, body = [], []
        for field in self.fields:
            name = field.name
            assert field.default_factory is dataclasses.MISSING, name
            env[f"_set_{name}"] = cls.__dict__[name].__set__
            if field.default is dataclasses.MISSING:
                params.append(name)
            else:
                params.append(f"{name}=_default_{name}")  # put in env by _read
            body.append(f"    _set_{name}(self, {name})\n")
        return "def __init__(self, *, " + ", ".join(params) + "):\n" + "".join(body)

    @staticmethod
    def _kind(hint: Any) -> tuple[str, Any, bool]:
        """What *hint* is on the wire: ``(kind, the type inside, optional)``."""
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
        if optional:
            (hint,) = [arg for arg in args if arg is not type(None)]
        if typing.get_origin(hint) is Annotated and _Rfc3339 in hint.__metadata__:
            return "time", hint, optional
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return "enum", hint, optional
        if typing.get_origin(hint) is tuple and hasattr(typing.get_args(hint)[0], "from_wire"):
            return "records", typing.get_args(hint)[0], optional
        return "plain", hint, optional

    @staticmethod
    def _read(field: dataclasses.Field[Any], env: dict[str, Any]) -> str:
        name, wire = field.name, _wire_name(field)
        if field.default is not dataclasses.MISSING:
            env[f"_default_{name}"] = field.default
            return f"get({wire!r}, _default_{name})"
        return f"data[{wire!r}]"

    def answer_model(self, name: str, doc: str, base: type[BaseModel], answers: dict[type, Any]) -> type[BaseModel]:
        """The pydantic model of the wire form (every field given), records
        inside it as *answers* maps them to their own models."""
        fields: dict[str, Any] = {}
        for field in self.fields:
            kind, inner, optional = self._kind(self.hints[field.name])
            wire: Any = {"time": Time, "records": list[answers.get(inner, inner)]}.get(kind, inner)
            fields[_wire_name(field)] = (wire | None if optional else wire, ...)
        return create_model(name, __base__=base, __doc__=doc, **fields)  # type: ignore[call-overload, no-any-return]


def _wire_name(field: dataclasses.Field[Any]) -> str:
    """A field's name on the wire: its own, unless its ``metadata`` names
    another (``Job.last_progress`` is ``progress``, as ``Job.progress`` is
    the method that reports it)."""
    return str(field.metadata.get("wire", field.name))


def _records(from_wire: Callable[[Any], Any], items: list[Any] | None) -> tuple[Any, ...]:
    return tuple(map(from_wire, items)) if items else ()


_JOB_WIRE = _WireForm(Job)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A cron schedule as the API shows it (docs/schedules.md): each tick
    of ``cron`` in ``timezone`` enqueues one job as ``job`` describes it
    (``{kind, payload, config}``, as ``POST /api/v1/jobs`` takes it)."""

    name: str
    tenant: str
    cron: str
    timezone: str
    job: dict[str, Any]
    paused: bool
    catch_up: str
    #: The next tick to fire (``None`` while paused, or for a cron that has
    #: no tick left).
    next_run_at: Epoch | None
    #: The latest tick (or trigger) that enqueued a job, and that job.
    last_run_at: Epoch | None
    last_job_id: str | None
    created_at: Epoch
    updated_at: Epoch

    if typing.TYPE_CHECKING:  # generated below, by _WireForm

        def to_wire(self) -> dict[str, Any]: ...

        @classmethod
        def from_wire(cls, data: dict[str, Any]) -> Schedule: ...


_SCHEDULE_WIRE = _WireForm(Schedule)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    """A claimed job and the token that proves ownership of this claim."""

    job: Job
    lease_token: str

    def to_wire(self) -> dict[str, Any]:
        return {"job": self.job.to_wire(), "lease_token": self.lease_token}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Lease:
        return cls(job=Job.from_wire(data["job"]), lease_token=data["lease_token"])


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class QueueStats:
    """Backlog figures of one queue, as one tenant sees it."""

    queue: str
    counts: dict[str, int]
    oldest_ready_at: float | None
    next_available_at: float | None
    #: Paused for this tenant: leases hand out none of its jobs of the queue.
    paused: bool = False
    #: Of the pending jobs, those whose time has not come (a delay, a retry's
    #: backoff, a snooze), counted up to :data:`MAX_SCHEDULED_COUNT`.
    scheduled: int = 0
    #: Of the pending jobs whose time has come, those held back by their
    #: concurrency key at its limit, and by their rate limit with no unit
    #: left (a job held back by both counts in both), each counted up to
    #: :data:`MAX_SCHEDULED_COUNT`.
    held_concurrency: int = 0
    held_rate_limit: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "counts": {**{s.value: self.counts.get(s.value, 0) for s in Status}, "scheduled": self.scheduled},
            "held_back": {"concurrency": self.held_concurrency, "rate_limit": self.held_rate_limit},
            "oldest_ready_at": format_time(self.oldest_ready_at),
            "next_available_at": format_time(self.next_available_at),
            "paused": self.paused,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> QueueStats:
        return cls(
            queue=data["queue"],
            counts=dict(data["counts"]),
            oldest_ready_at=parse_time(data.get("oldest_ready_at")),
            next_available_at=parse_time(data.get("next_available_at")),
            paused=bool(data.get("paused", False)),
            scheduled=int(data["counts"].get("scheduled", 0)),
            held_concurrency=int(data.get("held_back", {}).get("concurrency", 0)),
            held_rate_limit=int(data.get("held_back", {}).get("rate_limit", 0)),
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RateLimit:
    """A rate limit a tenant declared: at most ``limit`` claims of its jobs
    naming it in any window of ``per_secs``. ``next_available_at``: when the
    next unit frees up, while none is left (else None)."""

    name: str
    limit: int
    per_secs: float
    next_available_at: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "limit": self.limit,
            "per_secs": self.per_secs,
            "next_available_at": format_time(self.next_available_at),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RateLimit:
        return cls(
            name=data["name"],
            limit=int(data["limit"]),
            per_secs=float(data["per_secs"]),
            next_available_at=parse_time(data.get("next_available_at")),
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerInfo:
    """A worker id a tenant sees: one holding its running jobs, or seen
    leasing lately a queue that holds its jobs (docs/operations.md). How
    many of the tenant's jobs it holds and their ids (``jobs == 0``: idle),
    the queues it holds them on or leased (sorted), and when it was last
    seen (its latest lease call, claim or heartbeat)."""

    worker_id: str
    jobs: int
    queues: tuple[str, ...]
    last_seen_at: float
    job_ids: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "jobs": self.jobs,
            "job_ids": list(self.job_ids),
            "queues": list(self.queues),
            "last_seen_at": format_time(self.last_seen_at),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> WorkerInfo:
        return cls(
            worker_id=data["worker_id"],
            jobs=int(data["jobs"]),
            job_ids=tuple(data.get("job_ids", ())),
            queues=tuple(data["queues"]),
            last_seen_at=float(parse_time(data["last_seen_at"]) or 0.0),
        )


class WorkflowStatus(str, enum.Enum):
    """The life cycle of a workflow (docs/workflows.md)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


class StepStatus(str, enum.Enum):
    """A workflow step's status: its job's status once it has a job;
    before that ``waiting`` (for its dependencies), or ``cancelled`` when its
    workflow ended first."""

    WAITING = "waiting"
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkflowStep:
    """One step of a workflow, with its job once it has one. ``job`` is
    ``None`` in listings, which show ``status`` and ``job_id`` only."""

    name: str
    kind: str
    payload: dict[str, Any]
    depends_on: tuple[str, ...]
    max_attempts: int
    status: StepStatus
    job_id: str | None = None
    job: Job | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "payload": self.payload,
            "depends_on": list(self.depends_on),
            "max_attempts": self.max_attempts,
            "status": self.status.value,
            "job_id": self.job_id,
        }
        if self.job is not None:
            out["job"] = self.job.to_wire()
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> WorkflowStep:
        job = data.get("job")
        return cls(
            name=data["name"],
            kind=data["kind"],
            payload=data.get("payload") or {},
            depends_on=tuple(data.get("depends_on") or ()),
            max_attempts=data.get("max_attempts", 5),
            status=StepStatus(data["status"]),
            job_id=data.get("job_id"),
            job=Job.from_wire(job) if job else None,
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Workflow:
    """A workflow as the API shows it: its steps in creation order."""

    id: str
    tenant: str
    name: str
    status: WorkflowStatus
    context: dict[str, Any]
    steps: tuple[WorkflowStep, ...]
    created_at: float
    updated_at: float

    def step(self, name: str) -> WorkflowStep:
        """The step called *name* (:class:`KeyError` if there is none)."""
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "name": self.name,
            "status": self.status.value,
            "context": self.context,
            "steps": [s.to_wire() for s in self.steps],
            "created_at": format_time(self.created_at),
            "updated_at": format_time(self.updated_at),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Workflow:
        return cls(
            id=data["id"],
            tenant=data["tenant"],
            name=data["name"],
            status=WorkflowStatus(data["status"]),
            context=data.get("context") or {},
            steps=tuple(WorkflowStep.from_wire(s) for s in data.get("steps") or ()),
            created_at=parse_time(data["created_at"]) or 0.0,
            updated_at=parse_time(data["updated_at"]) or 0.0,
        )


# --------------------------------------------------------------------------
# Report items: one job's heartbeat, completion or failure, as the batch
# routes (``POST /api/v1/leases/heartbeat|complete|fail``), the client, the
# worker runtime and the engine all carry them.


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatItem:
    job_id: str
    lease_token: str
    extend_secs: float
    #: The handler's latest progress, to record with this heartbeat.
    progress: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ProgressItem:
    """A handler's progress, recorded under its lease (extending nothing)."""

    job_id: str
    lease_token: str
    progress: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class CompleteItem:
    job_id: str
    lease_token: str
    result: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class FailItem:
    job_id: str
    lease_token: str
    error: str
    retryable: bool = True
    #: The retry's delay instead of the backoff (an upstream's Retry-After).
    retry_in_secs: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SnoozeItem:
    job_id: str
    lease_token: str
    delay_secs: float


class Outcome(enum.Enum):
    """What a report (heartbeat, complete, fail) came to, item by item:
    what the engine answers, what the worker's transports answer (over HTTP
    or in-process alike), and what the worker acts on. Over HTTP each is a
    status, the same on the single and the batch routes (:meth:`code`)."""

    OK = "ok"  # applied, or an idempotent replay of what was applied
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"  # the token is not current, or the job was cancelled

    def code(self, *, heartbeat: bool = False) -> int:
        """The HTTP status of this outcome: a heartbeat that landed answers
        200 (with the job's status), a complete or fail 204."""
        if self is Outcome.OK:
            return 200 if heartbeat else 204
        return _OUTCOME_CODES[self]

    @classmethod
    def of_code(cls, code: int) -> Outcome:
        """The outcome an HTTP status stands for (``ValueError`` for none)."""
        if code in (200, 204):
            return cls.OK
        for outcome, known in _OUTCOME_CODES.items():
            if known == code:
                return outcome
        raise ValueError(f"{code} is not the status of a report")


_OUTCOME_CODES = {Outcome.NOT_FOUND: 404, Outcome.CONFLICT: 409}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HeartbeatReply:
    """One heartbeat's answer: ``OK`` (then ``status`` is set, and
    ``locked_until`` too when the lease was extended), ``NOT_FOUND``
    (unknown job) or ``CONFLICT`` (stale token)."""

    job_id: str
    outcome: Outcome
    status: str | None = None
    locked_until: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReportReply:
    """One complete's or fail's answer: ``OK`` recorded (or replayed),
    ``NOT_FOUND`` unknown job, ``CONFLICT`` lease no longer held."""

    job_id: str
    outcome: Outcome


# --------------------------------------------------------------------------
# Request bodies (validated by the server, built by the client)

def _json_number(value: Any) -> Any:
    # As JSON Schema (and /openapi.json) reads a body: a number is never a
    # string or a boolean; 3.0 is an integer, 3.5 is not.
    if isinstance(value, (bool, str)):
        raise ValueError("must be a JSON number")
    return value


def _json_time(value: Any) -> Any:
    if isinstance(value, (bool, int, float)):
        raise ValueError("must be an RFC 3339 time string")
    return value


# PostgreSQL cannot store the character U+0000 in text or jsonb, and SQLite
# can: refused in every string and JSON object of a request, both stores
# keep the same things (docs/protocol.md, "Limits").
_NUL = "\x00"
_NUL_ESCAPED = b"\\u0000"  # how JSON writes it: no other way


def find_nul(value: Any) -> str | None:
    """Where *value* holds U+0000, in a string or a key: the path to it
    (``"a.0.b"``; ``""`` for *value* itself), or ``None``."""
    if isinstance(value, str):
        return "" if _NUL in value else None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _NUL in key:
            return key.replace(_NUL, "\\u0000")
        found = find_nul(item)
        if found is not None:
            return f"{key}.{found}" if found else str(key)
    return None


def _nul_path(value: dict[str, Any]) -> str | None:
    # Serialising finds one far faster than walking the object, which is
    # done only to say where it is (a backslash followed by "u0000" reads
    # the same, hence the walk's word).
    try:
        if _NUL_ESCAPED not in _json_dumps(value):
            return None
    except (TypeError, ValueError):
        pass
    return find_nul(value)


_NUL_MESSAGE = "holds the character \\u0000{at}, which qftrio does not store"


def _no_nul_text(value: str) -> str:
    if _NUL in value:
        raise PydanticCustomError("nul_character", _NUL_MESSAGE.format(at=""))
    return value


def _no_nul_object(value: dict[str, Any]) -> dict[str, Any]:
    where = _nul_path(value)
    if where is not None:
        raise PydanticCustomError("nul_character", _NUL_MESSAGE.format(at=f" at {where}"))
    return value


def refuse_nul(value: dict[str, Any] | str, field: str) -> None:
    """Raise :class:`~qftrio.errors.InvalidInput` naming *field* when
    *value* holds U+0000: what a request body's model refuses, for what
    reaches the engine without one (the in-process worker's reports)."""
    where = find_nul(value) if isinstance(value, str) else _nul_path(value)
    if where is not None:
        at = f" at {where}" if where else ""
        raise errors.InvalidInput(f"{field}: {_NUL_MESSAGE.format(at=at)}")


Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Int = Annotated[int, BeforeValidator(_json_number)]
Number = Annotated[float, BeforeValidator(_json_number)]
TimeInput = Annotated[_dt.datetime, BeforeValidator(_json_time)]
#: A queue or kind name in a path, validated as in a body.
NAME = TypeAdapter(Name)
#: Free text of a request: a string without U+0000.
Text = Annotated[str, AfterValidator(_no_nul_text)]
#: A JSON object of a request (payload, result, context): no U+0000 in it.
JsonObject = Annotated[dict[str, Any], AfterValidator(_no_nul_object)]
Token = Annotated[Text, StringConstraints(min_length=1, max_length=MAX_TOKEN)]


# A job's headers go to workers untouched, which may pass them on as the
# headers of HTTP requests or messages (a traceparent does): names are HTTP
# field names (RFC 9110 tokens) and values hold no control character but the
# tab. The patterns are /openapi.json's; the checks' own words name the rule.
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
HEADER_VALUE_PATTERN = r"^[^\u0000-\u0008\u000a-\u001f\u007f]*$"
_HEADER_NAME_RE = re.compile(HEADER_NAME_PATTERN)
_HEADER_VALUE_RE = re.compile(HEADER_VALUE_PATTERN)


def _header_name(name: str) -> str:
    if not _HEADER_NAME_RE.fullmatch(name) or len(name) > MAX_HEADER_NAME:
        raise PydanticCustomError(
            "header_name",
            "a header name must be 1-{limit} characters of A-Z a-z 0-9 ! # $ % & ' * + . ^ _ ` | ~ -",
            {"limit": MAX_HEADER_NAME},
        )
    return name


def _header_value(value: str) -> str:
    if not _HEADER_VALUE_RE.fullmatch(value):
        raise PydanticCustomError("header_value", "must hold no control character (a tab is allowed)")
    return value


def headers_size(headers: dict[str, str]) -> int:
    """The bytes *headers* count against :data:`MAX_HEADERS_BYTES`: their
    names' and values' UTF-8, all together."""
    return sum(len(name.encode()) + len(value.encode()) for name, value in headers.items())


def _headers_fit(headers: dict[str, str]) -> dict[str, str]:
    size = headers_size(headers)
    if size > MAX_HEADERS_BYTES:
        raise PydanticCustomError(
            "headers_too_large",
            "names and values hold {size} bytes in all, over the {limit} allowed",
            {"size": size, "limit": MAX_HEADERS_BYTES},
        )
    return headers


def _progress_fits(progress: dict[str, Any]) -> dict[str, Any]:
    size = len(_json_dumps(progress))
    if size > MAX_PROGRESS_BYTES:
        raise PydanticCustomError(
            "progress_too_large",
            "its JSON holds {size} bytes, over the {limit} allowed",
            {"size": size, "limit": MAX_PROGRESS_BYTES},
        )
    return progress


#: A handler's progress: a JSON object of at most ``MAX_PROGRESS_BYTES``.
Progress = Annotated[
    dict[str, Any],
    AfterValidator(_no_nul_object),
    AfterValidator(_progress_fits),
    WithJsonSchema({"type": "object", "description": f"at most {MAX_PROGRESS_BYTES} bytes of JSON"}),
]

#: A job's ``config.headers``: ``{name: value}``, carried to its worker untouched.
Headers = Annotated[
    dict[Annotated[str, AfterValidator(_header_name)], Annotated[str, AfterValidator(_header_value)]],
    AfterValidator(_headers_fit),
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": HEADER_NAME_PATTERN, "maxLength": MAX_HEADER_NAME},
            "additionalProperties": {"type": "string", "pattern": HEADER_VALUE_PATTERN},
            "description": f"at most {MAX_HEADERS_BYTES} bytes of names and values in all (UTF-8)",
        }
    ),
]
JobId = Annotated[Text, StringConstraints(max_length=MAX_JOB_ID)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Fields(BaseModel):
    # Query strings carry only strings: numbers are read from them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackoffConfig(_Body):
    """A job's retry delays (``config.backoff``): the *n*-th failed attempt
    waits ``min(max_secs, initial_secs * factor**(n-1))``, less a random
    part of up to ``jitter`` of it. Each field left out is the server's
    default's."""

    initial_secs: Annotated[float, Field(gt=0, le=MAX_DELAY_SECS), BeforeValidator(_json_number)] = 1.0
    factor: Annotated[float, Field(ge=1, le=100), BeforeValidator(_json_number)] = 2.0
    max_secs: Annotated[float, Field(gt=0, le=MAX_DELAY_SECS), BeforeValidator(_json_number)] = 3600.0
    jitter: Annotated[float, Field(ge=0, le=1), BeforeValidator(_json_number)] = 0.5


class ConcurrencyConfig(_Body):
    """At most ``limit`` running jobs of the tenant carry ``key``."""

    key: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)]
    limit: Int = Field(1, ge=1, le=1_000_000)


class UniqueConfig(_Body):
    """While a job of the tenant with ``key`` is in one of ``statuses`` (and
    created less than ``period_secs`` ago), an enqueue answers it."""

    key: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)]
    statuses: list[typing.Literal["pending", "running", "completed", "failed", "cancelled"]] = Field(
        default_factory=lambda: ["pending", "running"], min_length=1, max_length=5
    )
    period_secs: Annotated[float, Field(gt=0, le=10 * 365 * 86400), BeforeValidator(_json_number)] | None = None


class JobConfig(_Body):
    queue: Name = "default"
    priority: Int = Field(0, ge=-(2**31), le=2**31 - 1)
    max_attempts: Int = Field(5, ge=1, le=1000)
    # The bounds on the float, before the number check: on the union, or
    # after the check, they would be left out of /openapi.json, which would
    # then let a negative delay through.
    delay_secs: Annotated[float, Field(ge=0, le=10 * 365 * 86400), BeforeValidator(_json_number)] | None = None
    scheduled_at: TimeInput | None = None
    idempotency_key: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)] | None = None
    timeout_secs: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECS), BeforeValidator(_json_number)] | None = None
    backoff: BackoffConfig | None = None
    headers: Headers | None = None
    concurrency: ConcurrencyConfig | None = None
    #: A rate limit the tenant declared: each claim of the job takes a unit.
    rate_limit: Name | None = None
    unique: UniqueConfig | None = None

    @model_validator(mode="after")
    def _one_schedule(self) -> JobConfig:
        if self.delay_secs is not None and self.scheduled_at is not None:
            raise ValueError("give delay_secs or scheduled_at, not both")
        # Times are written back with four-digit years; near the end of 9999
        # in any time zone, UTC (or microsecond rounding) reaches 10000.
        if self.scheduled_at is not None and self.scheduled_at.year > 9998:
            raise ValueError("scheduled_at must be before the year 9999")
        return self


#: The largest rate limit: a claim keeps the times of the last window's claims.
MAX_RATE_LIMIT = 10_000


class RateLimitRequest(_Body):
    limit: Int = Field(ge=1, le=MAX_RATE_LIMIT)
    per_secs: Annotated[float, Field(gt=0, le=30 * 86400), BeforeValidator(_json_number)]


class EnqueueRequest(_Body):
    kind: Name
    payload: JsonObject = Field(default_factory=dict)
    config: JobConfig = Field(default_factory=JobConfig)


class EnqueueBatchRequest(_Body):
    jobs: list[EnqueueRequest] = Field(min_length=1, max_length=MAX_BATCH)


class LeaseRequest(_Body):
    max_jobs: Int = Field(1, ge=1, le=MAX_LEASE_JOBS)
    lease_secs: Int = Field(60, ge=1, le=MAX_LEASE_SECS)
    wait_secs: Number = Field(0, ge=0, le=MAX_WAIT_SECS)
    worker_id: Annotated[Text, StringConstraints(max_length=MAX_WORKER_ID)] | None = None


class HeartbeatRequest(_Body):
    lease_token: Token
    extend_secs: Int = Field(ge=1, le=MAX_LEASE_SECS)


class CompleteRequest(_Body):
    lease_token: Token
    result: JsonObject = Field(default_factory=dict)


#: A delay of a report: seconds, 0 to 30 days.
Delay = Annotated[float, Field(ge=0, le=MAX_DELAY_SECS), BeforeValidator(_json_number)]


class FailRequest(_Body):
    lease_token: Token
    error: Annotated[Text, StringConstraints(max_length=MAX_ERROR)]
    retryable: bool = Field(True, strict=True)
    retry_in_secs: Delay | None = None


class SnoozeRequest(_Body):
    lease_token: Token
    delay_secs: Delay


HeartbeatStatus = Literal["running", "pending", "completed", "failed", "cancelled"]


class HeartbeatManyItem(HeartbeatRequest):
    id: JobId
    progress: Progress | None = None


class ProgressRequest(_Body):
    lease_token: Token
    progress: Progress


class CompleteManyItem(CompleteRequest):
    id: JobId


class FailManyItem(FailRequest):
    id: JobId


class SnoozeManyItem(SnoozeRequest):
    id: JobId


class HeartbeatManyRequest(_Body):
    items: list[HeartbeatManyItem] = Field(max_length=MAX_BATCH)


class CompleteManyRequest(_Body):
    items: list[CompleteManyItem] = Field(max_length=MAX_BATCH)


class FailManyRequest(_Body):
    items: list[FailManyItem] = Field(max_length=MAX_BATCH)


class SnoozeManyRequest(_Body):
    items: list[SnoozeManyItem] = Field(max_length=MAX_BATCH)


class WorkflowStepRequest(_Body):
    name: Name
    kind: Name
    payload: JsonObject = Field(default_factory=dict)
    depends_on: list[Name] = Field(default_factory=list, max_length=MAX_WORKFLOW_STEPS)
    max_attempts: Int = Field(5, ge=1, le=1000)


class WorkflowCreateRequest(_Body):
    """``POST /api/v1/workflows``. The step graph itself (unique names, known
    dependencies, no cycle) is checked by the server beyond this schema."""

    name: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_WORKFLOW_NAME)]
    context: JsonObject = Field(default_factory=dict)
    steps: list[WorkflowStepRequest] = Field(min_length=1, max_length=MAX_WORKFLOW_STEPS)


#: A cron expression's longest text.
MAX_CRON = 200


class ScheduleRequest(_Body):
    """``PUT /api/v1/schedules/{name}``. The expression and the time zone
    are read by the server beyond this schema (``cron``, ``timezone``: 422
    naming the field)."""

    cron: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_CRON)]
    timezone: Annotated[Text, StringConstraints(min_length=1, max_length=100)] = "UTC"
    job: EnqueueRequest
    paused: bool = Field(False, strict=True)
    catch_up: Literal["latest", "none", "all"] = "latest"


class SchedulesListQuery(_Fields):
    """``GET /api/v1/schedules``: a page, by name."""

    limit: int = Field(100, ge=1, le=MAX_BATCH)
    cursor: Name | None = None


class EmptyBody(_Body):
    """A body that carries nothing: empty, or ``{}``."""


#: The filters of a bulk action: one of them, or ``"all": true``, is needed.
BULK_FILTERS = ("queue", "status", "kind", "created_after", "created_before")


def _bulk_schema(schema: dict[str, Any]) -> None:
    # What the validator below says, for /openapi.json: a filter that is not
    # null, or "all": true.
    schema["anyOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in BULK_FILTERS
    ] + [{"required": ["all"], "properties": {"all": {"const": True}}}]


class BulkRequest(_Body):
    """``POST /api/v1/jobs/bulk/{retry,cancel,delete}``: which of the tenant's
    jobs (created in ``[created_after, created_before)``), and how many at
    most. At least one filter, or ``"all": true`` to take every job the
    action applies to: an empty body changes nothing by mistake."""

    model_config = ConfigDict(json_schema_extra=_bulk_schema)

    queue: Name | None = None
    status: Status | None = None
    kind: Name | None = None
    created_after: TimeInput | None = None
    created_before: TimeInput | None = None
    limit: Int = Field(10_000, ge=1, le=MAX_BULK)
    all: bool = Field(False, strict=True, validate_default=True)

    @field_validator("all")
    @classmethod
    def _filtered(cls, value: bool, info: ValidationInfo) -> bool:
        # The fields before this one that failed are not in info.data: they
        # are named already, and this would be a second, wrong complaint.
        given = info.data
        if not value and len(given) == len(cls.model_fields) - 1 and all(given[name] is None for name in BULK_FILTERS):
            raise PydanticCustomError(
                "filter_required", "give a filter (" + ", ".join(BULK_FILTERS) + ') or "all": true'
            )
        return value


# --------------------------------------------------------------------------
# Query strings (validated by the server like bodies)


class JobsListQuery(_Fields):
    """``GET /api/v1/jobs``: filters and a page."""

    queue: Name | None = None
    status: Status | None = None
    kind: Name | None = None
    limit: int = Field(50, ge=1, le=MAX_BATCH)
    cursor: str | None = None


#: The longest a wait on a job holds (``GET /api/v1/jobs/{id}/wait``).
MAX_JOB_WAIT_SECS = 60


class JobWaitQuery(_Fields):
    """``GET /api/v1/jobs/{id}/wait``: how long to wait for the job to end."""

    timeout_secs: float = Field(30, ge=0, le=MAX_JOB_WAIT_SECS)


class QueuesListQuery(_Fields):
    """``GET /api/v1/queues``: a page."""

    limit: int = Field(QUEUES_PAGE, ge=1, le=MAX_QUEUES_PAGE)
    cursor: str | None = None


class WorkflowsListQuery(_Fields):
    """``GET /api/v1/workflows``: a filter and a page."""

    status: WorkflowStatus | None = None
    limit: int = Field(50, ge=1, le=MAX_WORKFLOWS_PAGE)
    cursor: str | None = None


# --------------------------------------------------------------------------
# Answers, as /openapi.json documents them. The server writes them with the
# records' ``to_wire``; these models are their schema, and the contract test
# holds every answer to it.

Time = Annotated[str, Field(description="RFC 3339 UTC, microseconds: 2026-11-30T12:00:00.000000Z")]


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


#: A job, as :class:`Job` declares it.
JobAnswer = _JOB_WIRE.answer_model("JobAnswer", "A job.", _Answer, {ErrorEntry: ErrorEntryAnswer})


#: A schedule, as :class:`Schedule` declares it.
ScheduleAnswer = _SCHEDULE_WIRE.answer_model("ScheduleAnswer", "A cron schedule.", _Answer, {})


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
