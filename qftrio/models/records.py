"""Records: what qftrio keeps and answers (:class:`Job`, :class:`Lease`,
:class:`QueueStats`, workflows, schedules), frozen keyword-only dataclasses
with ``to_wire``/``from_wire`` for their JSON form; the report items and
their outcomes; times: aware datetimes in UTC on the records, epoch seconds
where the server computes with them and in the stores, RFC 3339 strings on
the wire."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import functools
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, create_model

from .. import _progress
from .limits import MAX_ATTEMPTS_KEPT

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


#: The one time zone of every time a record carries.
UTC = _dt.timezone.utc


# Every time of every record is an aware datetime in UTC, read from what the
# stores keep (epoch seconds) or from the wire (RFC 3339 strings), and every
# time of every job of every answer is written back through here. The jobs of
# one lease or one answer share most of their times (claimed at the same
# instant, enqueued in the same batch), so small caches answer those at once,
# and the generated forms (_WireForm) call them directly: a claimed job costs
# the server no more than when records carried floats.
@functools.lru_cache(maxsize=4096)
def _datetime_of_epoch(ts: float) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(ts, UTC)


# Hand-rolled, a third faster than datetime.strftime.
@functools.lru_cache(maxsize=4096)
def _format_datetime(value: _dt.datetime) -> str:
    if value.utcoffset():
        value = value.astimezone(UTC)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (
        value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond,
    )  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _parse_time_string(value: str) -> _dt.datetime:
    parsed = _dt.datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed if parsed.tzinfo is UTC else parsed.astimezone(UTC)


@typing.overload
def to_datetime(value: str | float | _dt.datetime) -> _dt.datetime: ...
@typing.overload
def to_datetime(value: None) -> None: ...
@typing.overload
def to_datetime(value: str | float | _dt.datetime | None) -> _dt.datetime | None: ...
def to_datetime(value: str | float | _dt.datetime | None) -> _dt.datetime | None:
    """A time as the records carry it, an aware datetime in UTC, from an
    RFC 3339 string, epoch seconds or a datetime (naive taken as UTC)."""
    if type(value) is str:  # first: what the wire carries
        return _parse_time_string(value)
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value if value.tzinfo is UTC else value.astimezone(UTC)
    if isinstance(value, (int, float)):
        return _datetime_of_epoch(float(value))
    if isinstance(value, str):
        return _parse_time_string(value)
    raise TypeError(f"not a time: {value!r}")


def format_time(value: _dt.datetime | float | None) -> str | None:
    """A time (a datetime, naive taken as UTC, or epoch seconds) as the wire
    writes it: RFC 3339 UTC, microseconds (``2026-01-02T03:04:05.123456Z``)."""
    if value is None:
        return None
    if type(value) is float:
        return _format_datetime(_datetime_of_epoch(value))
    return _format_datetime(to_datetime(value))


def elapsed(since: _dt.datetime, now: float) -> float:
    """Seconds from *since* to *now* (epoch seconds, as the server's and the
    command line's clocks give it), both at the records' precision, a
    microsecond, so that a time read back at the instant it was written is
    0 seconds old (negative: *since* is to come)."""
    return (_datetime_of_epoch(now) - since).total_seconds()


def parse_time(value: str | float | _dt.datetime | None) -> float | None:
    """A time (an RFC 3339 string, a datetime, naive taken as UTC, or epoch
    seconds) as epoch seconds: what the server computes with and the stores
    keep."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return to_datetime(value).timestamp()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ErrorEntry:
    """One failed attempt in a job's error history."""

    attempt: int
    error: str
    at: _dt.datetime

    def to_wire(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "error": self.error, "at": _format_datetime(self.at)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ErrorEntry:
        return cls(attempt=data["attempt"], error=data["error"], at=_parse_time_string(data["at"]))

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> ErrorEntry:
        """An entry as both stores keep it: the wire's keys, its time as epoch seconds."""
        return cls(attempt=int(data["attempt"]), error=str(data["error"]), at=_datetime_of_epoch(float(data["at"])))


class AttemptOutcome(str, enum.Enum):
    """How one claim of a job ended (``running`` while it has not)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    #: Its lease expired: taken back by the janitor, or claimed again.
    LOST = "lost"
    SNOOZED = "snoozed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


_OUTCOME_OF = {outcome.value: outcome for outcome in AttemptOutcome}


def attempt_history(
    ended: list[dict[str, Any]] | None,
    status: str,
    attempt: int,
    worker_id: str | None,
    claimed_at: float | None,
    updated_at: float,
) -> tuple[AttemptEntry, ...]:
    """A job's ``attempts`` from what both stores keep: the entries of its
    ended attempts, and its last attempt from the row itself while it runs or
    once it completed (its ``attempt``, ``worker_id`` and ``claimed_at``,
    which the claim set, and a completed job's ``updated_at``, which nothing
    moves after its completion), so that neither a claim nor a completion
    writes history; the newest :data:`MAX_ATTEMPTS_KEPT` of them. A job
    completed by a version that wrote its completed attempt into the history
    has that entry last (a completed job is never claimed again), and it is
    not added twice."""
    out = tuple(map(AttemptEntry.from_stored, ended)) if ended else ()
    if claimed_at is None:
        return out
    if status == "running":
        ended_at, outcome = None, AttemptOutcome.RUNNING
    elif status == "completed" and not (ended and ended[-1]["outcome"] == "completed"):
        ended_at, outcome = _datetime_of_epoch(updated_at), AttemptOutcome.COMPLETED
    else:
        return out
    last = AttemptEntry(
        attempt=attempt, worker_id=worker_id, claimed_at=_datetime_of_epoch(claimed_at), ended_at=ended_at,
        outcome=outcome, error=None,
    )  # fmt: skip
    return (*out[1 - MAX_ATTEMPTS_KEPT :], last) if len(out) >= MAX_ATTEMPTS_KEPT else (*out, last)


class _Rfc3339:
    """Marks a time field: an aware datetime in UTC on the record, epoch
    seconds in the stores, an RFC 3339 string on the wire."""


#: A time: an aware datetime in UTC on a record, epoch seconds as the stores
#: keep it, an RFC 3339 UTC string on the wire.
Epoch = Annotated[_dt.datetime, _Rfc3339]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AttemptEntry:
    """One claim in a job's attempt history: its number, who claimed it and
    when, and when and how it ended (``ended_at`` is None while it runs;
    ``error`` is the attempt's error, if it ended with one; ``claimed_at`` is
    None for a claim no store recorded the time of, made before the history
    existed). Its wire form
    and ``__init__`` are generated (:class:`_WireForm`): a running entry is
    built for every claimed job."""

    attempt: int
    worker_id: str | None
    claimed_at: Epoch | None
    ended_at: Epoch | None
    outcome: AttemptOutcome
    error: str | None

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> AttemptEntry:
        """An entry as both stores keep it: the wire's keys, times as epoch seconds."""
        ended, claimed = data["ended_at"], data["claimed_at"]
        return cls(
            attempt=int(data["attempt"]), worker_id=data["worker_id"],
            claimed_at=None if claimed is None else _datetime_of_epoch(float(claimed)),
            ended_at=None if ended is None else _datetime_of_epoch(float(ended)), outcome=_OUTCOME_OF[data["outcome"]],
            error=data["error"],
        )  # fmt: skip

    if typing.TYPE_CHECKING:  # generated below, by _WireForm

        def to_wire(self) -> dict[str, Any]: ...

        @classmethod
        def from_wire(cls, data: dict[str, Any]) -> AttemptEntry: ...


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
    #: Its claims, oldest first, the newest MAX_ATTEMPTS_KEPT kept.
    attempts: tuple[AttemptEntry, ...] = ()

    def progress(self, progress: dict[str, Any]) -> None:
        """Report how far this job's handler has got: a JSON object of at
        most 8 KiB, sent with the worker's next heartbeat batch (within a
        second); the latest one reported wins. Only a handler the worker
        runtime runs can report its job's progress."""
        _progress.report(self.id, progress)

    async def add_steps(self, steps: Sequence[Mapping[str, Any]], *, collect: str | None = None) -> Workflow:
        """Add *steps* (at most 1000 a call, shaped as a new workflow's:
        ``{"name", "kind", "payload", "depends_on", "max_attempts"}``) to the
        workflow of this step; returns the workflow grown. They run once this
        step has completed (their own dependencies may name each other and
        completed steps), and the steps waiting for this one wait for them
        too. With *collect*, their results go, in the order added, to a list
        under that key of the context the waiting steps see. The worker
        retries the call on transport errors while the lease lasts; a
        repeat of the same steps changes nothing, so a retried handler may
        add them again. Only an async handler the worker runtime runs can
        add steps to its job's workflow.

        Raises:
            qftrio.errors.InvalidInput: steps that do not fit the workflow
                (names taken, unknown or unfinished dependencies, a cycle,
                the caps); nothing is added.
            qftrio.errors.Conflict: the lease is lost (or the job cancelled
                with its workflow), or this step added other steps of these
                names.
        """
        workflow: Workflow = await _progress.add_steps(self.id, steps, collect)
        return workflow

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
        self.kinds = {field.name: self._kind(self.hints[field.name]) for field in self.fields}
        #: Each field's name on the wire (and as a store's column): its own,
        #: unless its ``metadata`` names another (``Job.last_progress`` is
        #: ``progress``, as ``Job.progress`` is the method that reports it).
        self.wire = {field.name: str(field.metadata.get("wire", field.name)) for field in self.fields}
        env: dict[str, Any] = {"__name__": cls.__module__, **_TIME_FUNCTIONS}
        read = []
        for field in self.fields:
            name = field.name
            kind, inner, optional = self.kinds[name]
            got = self._read(field, self.wire[name], env)
            if kind == "time":
                got = _time_source("_parse_time_string({})", got, optional)
            elif kind == "enum":
                env[f"_lookup_{name}"] = {member.value: member for member in inner}
                env[f"_enum_{name}"] = inner
                member = f"(_lookup_{name}.get({got}) or _enum_{name}({got}))"  # a dict lookup first: faster
                got = f"(None if {got} is None else {member})" if optional else member
            elif kind == "records":
                env[f"_records_{name}"] = functools.partial(_records, inner.from_wire)
                got = f"_records_{name}({got})"
            read.append(f"{name}={got}")
        source = "def from_wire(cls, data):\n    get = data.get\n    return cls(" + ", ".join(read) + ")\n"
        source += self._init_source(env)
        exec(source, env)
        env["__init__"].__qualname__ = f"{cls.__qualname__}.__init__"
        type.__setattr__(cls, "__init__", env["__init__"])
        self.to_wire: Callable[[Any], dict[str, Any]] = self.writer("to_wire", "self", lambda name: f"self.{name}")
        self.from_wire: Callable[[type, dict[str, Any]], Any] = env["from_wire"]
        for function in (self.to_wire, self.from_wire):
            function.__qualname__ = f"{cls.__qualname__}.{function.__name__}"
        type.__setattr__(cls, "to_wire", self.to_wire)
        type.__setattr__(cls, "from_wire", classmethod(self.from_wire))

    def writer(
        self,
        name: str,
        params: str,
        value: Callable[[str], str],
        env: dict[str, Any] | None = None,
        *,
        epoch: bool = False,
    ) -> Callable[..., dict[str, Any]]:
        """``name(params)``: the wire form of the record whose field *f* has
        the value whose source is ``value(f)`` (``self.f`` for ``to_wire``;
        another record's attribute or a constant of *env* for a record not
        built yet, as a store's new job, whose times are epoch seconds: *epoch*)."""
        env = {"__name__": self.cls.__module__, **_TIME_FUNCTIONS, **(env or {})}
        out = []
        for field in self.fields:
            kind, _, optional = self.kinds[field.name]
            got = value(field.name)
            if kind == "time":
                convert = "_format_datetime(_datetime_of_epoch({}))" if epoch else "_format_datetime({})"
                got = _time_source(convert, got, optional)
            elif kind == "enum":
                got = f"None if {got} is None else {got}.value" if optional else f"{got}.value"
            elif kind == "records":
                got = f"[item.to_wire() for item in {got}]"
            out.append(f"{self.wire[field.name]!r}: {got}")
        return _compiled(name, params, "{" + ", ".join(out) + "}", env)

    def builder(
        self, name: str, params: str, value: Callable[[str], str], env: dict[str, Any] | None = None
    ) -> Callable[..., Any]:
        """``name(params)``: the record whose field *f* is the value whose
        source is ``value(f)``, every field named (a store's reader of a row:
        a field added to the record is read, or fails at import); a time's
        source gives epoch seconds, as the stores keep it."""
        env = {"__name__": self.cls.__module__, "_record": self.cls, **_TIME_FUNCTIONS, **(env or {})}
        args = []
        for field in self.fields:
            kind, _, optional = self.kinds[field.name]
            got = value(field.name)
            if kind == "time":
                got = _time_source("_datetime_of_epoch({})", got, optional)
            args.append(f"{field.name}={got}")
        return _compiled(name, params, f"_record({', '.join(args)})", env)

    def defaults(self, names: typing.Iterable[str], env: dict[str, Any]) -> dict[str, str]:
        """The source of each field of *names* as its default, put in *env*
        (``ValueError`` for a field that has none)."""
        by_name = {field.name: field for field in self.fields}
        out = {}
        for name in names:
            default = by_name[name].default
            if default is dataclasses.MISSING:
                raise ValueError(f"{self.cls.__name__}.{name} has no default: its value must be given")
            env[f"_default_{name}"] = default
            out[name] = f"_default_{name}"
        return out

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
    def _read(field: dataclasses.Field[Any], wire: str, env: dict[str, Any]) -> str:
        name = field.name
        if field.default is not dataclasses.MISSING:
            env[f"_default_{name}"] = field.default
            return f"get({wire!r}, _default_{name})"
        return f"data[{wire!r}]"

    def answer_model(self, name: str, doc: str, base: type[BaseModel], answers: dict[type, Any]) -> type[BaseModel]:
        """The pydantic model of the wire form (every field given), records
        inside it as *answers* maps them to their own models."""
        fields: dict[str, Any] = {}
        for field in self.fields:
            kind, inner, optional = self.kinds[field.name]
            wire: Any = {"time": Time, "records": list[answers.get(inner, inner)]}.get(kind, inner)
            fields[self.wire[field.name]] = (wire | None if optional else wire, ...)
        return create_model(name, __base__=base, __doc__=doc, **fields)  # type: ignore[call-overload, no-any-return]


#: What the generated forms convert times with (:func:`_time_source`).
_TIME_FUNCTIONS: dict[str, Any] = {
    "_parse_time_string": _parse_time_string,
    "_format_datetime": _format_datetime,
    "_datetime_of_epoch": _datetime_of_epoch,
}


def _time_source(convert: str, got: str, optional: bool) -> str:
    """The source of *got* (a time's source) converted by *convert* (source
    with ``{}`` where the time goes, calling :data:`_TIME_FUNCTIONS`
    directly: each is a cache in C, no Python frame), *got* evaluated once:
    None stays None for an *optional* field."""
    if not optional:
        return convert.format(got)
    return f"(None if (_t := {got}) is None else {convert.format('_t')})"


def _compiled(name: str, params: str, expression: str, env: dict[str, Any]) -> Callable[..., Any]:
    """The function ``name(params)`` answering *expression*, compiled in *env*."""
    exec(f"def {name}({params}):\n    return {expression}\n", env)
    function: Callable[..., Any] = env[name]
    return function


def _records(from_wire: Callable[[Any], Any], items: list[Any] | None) -> tuple[Any, ...]:
    return tuple(map(from_wire, items)) if items else ()


#: How a job is written and built: its wire form, and the generated readers
#: of the stores (`builder`) and of their new jobs (`writer`).
ATTEMPT_FORM = _WireForm(AttemptEntry)  # before Job's: a job's attempts are read with its from_wire
JOB_FORM = _WireForm(Job)


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


SCHEDULE_FORM = _WireForm(Schedule)


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
class HeldBack:
    """Of a queue's pending jobs whose time has come, those flow control
    holds back: by their concurrency key at its limit, and by their rate
    limit with no unit left (a job held back by both counts in both), each
    counted up to :data:`MAX_SCHEDULED_COUNT`."""

    concurrency: int = 0
    rate_limit: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "rate_limit": self.rate_limit}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> HeldBack:
        return cls(concurrency=int(data.get("concurrency", 0)), rate_limit=int(data.get("rate_limit", 0)))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class QueueStats:
    """Backlog figures of one queue, as one tenant sees it, named as the
    wire names them (``GET /api/v1/queues/{queue}/stats``)."""

    queue: str
    counts: dict[str, int]
    oldest_ready_at: _dt.datetime | None
    next_available_at: _dt.datetime | None
    #: Paused for this tenant: leases hand out none of its jobs of the queue.
    paused: bool = False
    #: Of the pending jobs, those whose time has not come (a delay, a retry's
    #: backoff, a snooze), counted up to :data:`MAX_SCHEDULED_COUNT`.
    scheduled: int = 0
    #: Of the pending jobs whose time has come, those flow control holds back.
    held_back: HeldBack = HeldBack()

    @property
    def held_concurrency(self) -> int:
        """``held_back.concurrency``."""
        return self.held_back.concurrency

    @property
    def held_rate_limit(self) -> int:
        """``held_back.rate_limit``."""
        return self.held_back.rate_limit

    def to_wire(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "counts": {**{s.value: self.counts.get(s.value, 0) for s in Status}, "scheduled": self.scheduled},
            "held_back": self.held_back.to_wire(),
            "oldest_ready_at": format_time(self.oldest_ready_at),
            "next_available_at": format_time(self.next_available_at),
            "paused": self.paused,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> QueueStats:
        return cls(
            queue=data["queue"],
            counts=dict(data["counts"]),
            oldest_ready_at=to_datetime(data.get("oldest_ready_at")),
            next_available_at=to_datetime(data.get("next_available_at")),
            paused=bool(data.get("paused", False)),
            scheduled=int(data["counts"].get("scheduled", 0)),
            held_back=HeldBack.from_wire(data.get("held_back") or {}),
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RateLimit:
    """A rate limit a tenant declared: at most ``limit`` claims of its jobs
    naming it in any window of ``per_secs``. ``next_available_at``: when the
    next unit frees up, while none is left (else None)."""

    name: str
    limit: int
    per_secs: float
    next_available_at: _dt.datetime | None = None

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
            next_available_at=to_datetime(data.get("next_available_at")),
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
    last_seen_at: _dt.datetime
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
            last_seen_at=_parse_time_string(data["last_seen_at"]),
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
    #: The step that added it at run time (``POST /api/v1/jobs/{id}/steps``), else ``None``.
    added_by: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "payload": self.payload,
            "depends_on": list(self.depends_on),
            "max_attempts": self.max_attempts,
            "status": self.status.value,
            "job_id": self.job_id,
            "added_by": self.added_by,
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
            added_by=data.get("added_by"),
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
    created_at: _dt.datetime
    updated_at: _dt.datetime

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
            "created_at": _format_datetime(self.created_at),
            "updated_at": _format_datetime(self.updated_at),
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
            created_at=_parse_time_string(data["created_at"]),
            updated_at=_parse_time_string(data["updated_at"]),
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
    locked_until: _dt.datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReportReply:
    """One complete's or fail's answer: ``OK`` recorded (or replayed),
    ``NOT_FOUND`` unknown job, ``CONFLICT`` lease no longer held."""

    job_id: str
    outcome: Outcome


#: The statuses a heartbeat answers.
HeartbeatStatus = Literal["running", "pending", "completed", "failed", "cancelled"]


#: A time as an answer's schema states it (:meth:`_WireForm.answer_model`).
Time = Annotated[str, Field(description="RFC 3339 UTC, microseconds: 2026-11-30T12:00:00.000000Z")]

