"""The HTTP clients: typed calls of the worker protocol and the application API,
for async code (:class:`Client`, on Trio or asyncio) and for synchronous code
(:class:`SyncClient`)::

    async with qftrio.Client("http://127.0.0.1:8000", token) as client:
        job = await client.enqueue("resize-image", {"src": "a.png"}, queue="images")

    with qftrio.SyncClient("http://127.0.0.1:8000", token) as client:
        job = client.enqueue("resize-image", {"src": "a.png"}, queue="images")

Every error answer raises the matching :mod:`qftrio.errors` class (a ``404`` is
:class:`~qftrio.errors.NotFound`, and so on); a server that cannot be reached,
a broken connection or a timeout raises :class:`~qftrio.errors.TransportError`.
Nothing else escapes: httpx's exceptions never reach the caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Self, TypeVar, cast, overload
from urllib.parse import quote, urlencode, urlsplit

import pydantic
import sniffio

from . import errors
from ._tracing import with_trace_context
from ._http import (
    DEFAULT_MAX_BODY_SIZE,
    HttpError,
    HttpPool,
    HttpxSyncTransport,
    HttpxTransport,
    Response,
    Transport,
    _httpx_errors,
    _httpx_options,
    check_headers,
)
from ._json import dumps_strict as json_dumps, loads as json_loads
from .models import (
    BulkRequest,
    Schedule,
    ScheduleRequest,
    CompleteItem,
    FailItem,
    JobConfig,
    SnoozeItem,
    HeartbeatItem,
    JobWaitQuery,
    HeartbeatReply,
    EnqueueBatchRequest,
    EnqueueRequest,
    EventsQuery,
    Job,
    Lease,
    LeaseRequest,
    field_errors,
    Outcome,
    QueueStats,
    RateLimit,
    RateLimitRequest,
    ReportReply,
    Status,
    WorkerInfo,
    Workflow,
    StepsAddRequest,
    WorkflowCreateRequest,
    WorkflowStatus,
    format_time,
    to_datetime,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Client",
    "Event",
    "InvalidArgument",
    "SyncClient",
    "HeartbeatItem",
    "CompleteItem",
    "FailItem",
    "HeartbeatReply",
    "ReportReply",
]

DEFAULT_URL = "http://127.0.0.1:8000"


class InvalidArgument(errors.InvalidInput):
    """An argument the client refused before sending anything: the server
    was not asked. The message names the field and says what is wrong."""

    code = "invalid_argument"


def _segment(value: object) -> str:
    """A path parameter as one path segment: every character but the
    unreserved ones percent-encoded, and a lone ``.`` or ``..`` too, so that
    nothing can climb to another route (``job_get("../../queues")``)."""
    text = quote(str(value), safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text


def _proxied(url: str) -> bool:
    """Whether the environment names a proxy for *url*, as httpx reads it."""
    if not any(name.lower().endswith("_proxy") for name in os.environ):
        return False
    import urllib.request  # start-up time that most processes do not need

    proxies = urllib.request.getproxies_environment()
    parts = urlsplit(url)
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass_environment(parts.hostname or "", proxies)


def _body(model: pydantic.BaseModel) -> dict[str, Any]:
    # Checked first: pydantic's JSON mode would write NaN and Infinity as null.
    # Serialising finds one far faster than walking the body, which is done
    # only to say where it is.
    data = model.model_dump(exclude_none=True)
    try:
        json_dumps(data)
    except (ValueError, TypeError):
        _check_finite(data, "")
    return model.model_dump(mode="json", exclude_none=True)


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(f"{where or 'body'}: {value!r} is not a JSON number")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_finite(item, f"{where}.{index}" if where else str(index))


def _build(model_cls: type[pydantic.BaseModel], **fields: Any) -> dict[str, Any]:
    """Validate a request body locally, so that a bad argument fails before
    the network is touched, with the message the server would give: every
    field by its path in the body (``config.max_attempts``), in the same
    words (:func:`qftrio.models.field_errors`)."""
    try:
        return _body(model_cls(**fields))
    except pydantic.ValidationError as exc:
        raise InvalidArgument(field_errors(exc, "body")) from None


def _time(value: Any) -> Any:
    """A time argument as a body carries it: epoch seconds become RFC 3339,
    a naive datetime counts as UTC; anything else is left to validation."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_time(float(value))
    if isinstance(value, _dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=_dt.timezone.utc)
    return value


def _config(config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: _time(value) if key == "scheduled_at" else value for key, value in config.items() if value is not None
    }


_CONFIG_KEYS = frozenset(JobConfig.model_fields)


def _fail_body(item: FailItem) -> dict[str, Any]:
    body: dict[str, Any] = {"lease_token": item.lease_token, "error": item.error, "retryable": item.retryable}
    if item.retry_in_secs is not None:
        body["retry_in_secs"] = item.retry_in_secs
    return body


def _job_body(spec: Mapping[str, Any]) -> dict[str, Any]:
    """An enqueue body from either the wire shape (``{"kind", "payload",
    "config": {...}}``) or a flat one (``{"kind", "payload", "queue", ...}``),
    with the current trace context in its headers when OpenTelemetry is in
    use (:mod:`qftrio._tracing`)."""
    spec = dict(spec)
    config = dict(spec.pop("config", None) or {})
    for key in list(spec):
        if key in _CONFIG_KEYS:
            config[key] = spec.pop(key)
    body: dict[str, Any] = {"kind": spec.pop("kind", None), "payload": spec.pop("payload", None) or {}}
    if spec:
        raise InvalidArgument(f"{sorted(spec)[0]}: unknown field")
    headers = config.get("headers")
    if headers is None or isinstance(headers, Mapping):
        config["headers"] = with_trace_context(headers)
    body["config"] = _config(config)
    return body


T = TypeVar("T")
P = ParamSpec("P")

# Readers of answers: JSON in, records out. A KeyError or TypeError in one
# means the answer is not qftrio's (Call.answer says so).


def _leases(data: Any) -> list[Lease]:
    return [Lease.from_wire(item) for item in data["jobs"]]


def _heartbeat(data: Any) -> tuple[str, _dt.datetime | None]:
    return data["status"], to_datetime(data.get("locked_until"))


# The batch routes answer each item with the status the single route would
# have given; the replies carry the outcome it stands for.


def _heartbeat_item(item: HeartbeatItem) -> dict[str, Any]:
    out = {"id": item.job_id, "lease_token": item.lease_token, "extend_secs": int(item.extend_secs)}
    if item.progress is not None:
        out["progress"] = item.progress
    return out


def _heartbeat_replies(data: Any) -> list[HeartbeatReply]:
    return [
        HeartbeatReply(
            job_id=r["id"],
            outcome=Outcome.of_code(r["code"]),
            status=r.get("status"),
            locked_until=to_datetime(r.get("locked_until")),
        )
        for r in data["results"]
    ]


def _report_replies(data: Any) -> list[ReportReply]:
    return [ReportReply(job_id=r["id"], outcome=Outcome.of_code(r["code"])) for r in data["results"]]


def _jobs(data: Any) -> list[Job]:
    return [Job.from_wire(j) for j in data["jobs"]]


def _jobs_page(data: Any) -> tuple[list[Job], str | None]:
    return _jobs(data), data.get("next_cursor")


def _queues(data: Any) -> list[QueueStats]:
    return [QueueStats.from_wire(q) for q in data["queues"]]


def _queues_page(data: Any) -> tuple[list[QueueStats], str | None]:
    return _queues(data), data.get("next_cursor")


def _count(data: Any) -> int:
    return int(data["count"])


def _workers(data: Any) -> list[WorkerInfo]:
    return [WorkerInfo.from_wire(w) for w in data["workers"]]


def _rate_limits(data: Any) -> list[RateLimit]:
    return [RateLimit.from_wire(r) for r in data["rate_limits"]]


def _health(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {"status": data}


def _schedules_page(data: Any) -> tuple[list[Schedule], str | None]:
    return [Schedule.from_wire(s) for s in data["schedules"]], data.get("next_cursor")


def _triggered(data: Any) -> tuple[Schedule, Job]:
    return Schedule.from_wire(data["schedule"]), Job.from_wire(data["job"])


def _workflows_page(data: Any) -> tuple[list[Workflow], str | None]:
    return [Workflow.from_wire(w) for w in data["workflows"]], data.get("next_cursor")


# --------------------------------------------------------------------------
# The event stream (GET /api/v1/events), read by both clients.


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One event of :meth:`Client.events`: *kind* ``"job"`` (*data*: the
    job's ``id``, ``queue``, ``kind``, ``status``, ``attempt``,
    ``progress`` and ``at``, epoch seconds of the change), ``"stats"``
    (*data*: a queue's stats as the wire has them; :attr:`stats` reads
    them), or ``"overflow"`` (the client fell behind; the stream ends after
    it, and what it missed is read from the jobs themselves)."""

    kind: str
    data: dict[str, Any]

    @property
    def stats(self) -> QueueStats:
        """A ``stats`` event's stats."""
        return QueueStats.from_wire(self.data)


#: Seconds without a byte from a stream after which it is taken for dead:
#: the server sends a comment every 15 s.
EVENTS_READ_TIMEOUT = 45.0


class _SseReader:
    """Server-sent events from their lines, as a browser's EventSource
    reads them (comments and unknown fields skipped)."""

    def __init__(self) -> None:
        self.kind = "message"
        self.data: list[str] = []

    def line(self, line: str) -> Event | None:
        """The event *line* ends, if it ends one."""
        if not line:
            if not self.data:
                self.kind = "message"
                return None
            kind, data = self.kind, "\n".join(self.data)
            self.kind, self.data = "message", []
            return Event(kind, json_loads(data))
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self.kind = value
        elif field == "data":
            self.data.append(value)
        return None


@contextlib.contextmanager
def _stream_errors(url: str) -> Iterator[None]:
    """A stream's transport failures, as :class:`~qftrio.errors.TransportError`."""
    try:
        with _httpx_errors():
            yield
    except HttpError as exc:
        raise errors.TransportError(f"GET {url}/api/v1/events: {exc}") from None


def _events_target(queue: str | None, kind: str | None, job: str | None, stats_secs: int | None) -> str:
    """The target of a stream, its query checked locally as the server
    checks it."""
    try:
        EventsQuery.model_validate({"queue": queue, "kind": kind, "job": job, "stats_secs": stats_secs})
    except pydantic.ValidationError as exc:
        raise InvalidArgument(field_errors(exc, "query")) from None
    query = {"queue": queue, "kind": kind, "job": job, "stats_secs": stats_secs}
    return Call("GET", "/api/v1/events", None, params=query).encode()[0]


# --------------------------------------------------------------------------
# Each call of the API is described once, as a Call: the request to send and
# the reader of its answer. Client sends it on an event loop, SyncClient from
# a thread; neither driver knows any route, and no route knows its driver.


# Not frozen: a frozen dataclass takes several times as long to make, and
# every call makes one.
@dataclasses.dataclass(slots=True)
class Call(Generic[T]):
    """One call: *method* *path* (its parameters encoded already, with
    :func:`_segment`), an optional JSON body and query, and *read*, which
    turns the answer's JSON into records (``None``: the answer has no body).
    A long poll's *wait_secs* is added to the client's timeout."""

    method: str
    path: str
    read: Callable[[Any], T] | None
    json_body: Any = None
    params: Mapping[str, Any] | None = None
    wait_secs: float = 0

    def encode(self) -> tuple[str, bytes | None]:
        """The request target (path and query) and body to send."""
        body = None
        if self.json_body is not None:
            try:
                body = json_dumps(self.json_body)
            except ValueError as exc:
                raise InvalidArgument(f"the request cannot be sent as JSON: {exc}") from None
        query = {k: v for k, v in (self.params or {}).items() if v is not None}
        return (f"{self.path}?{urlencode(query)}" if query else self.path), body

    def answer(self, url: str, response: Response) -> T:
        """The call's result, from the server's *response*.

        Raises:
            ApiError: the matching subclass, for an error status.
            UnexpectedAnswer: the answer is not JSON, or not of the shape
                *read* expects: not a qftrio server.
        """
        if response.status_code >= 400:
            raise _error(response)
        if self.read is None:
            return cast(T, None)
        try:
            return self.read(json_loads(response.content))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise errors.UnexpectedAnswer(
                f"{self.method} {url}{self.path}: the answer is not qftrio's ({type(exc).__name__}: {exc})"[:300]
            ) from None


def _error(response: Response) -> errors.ApiError:
    code = message = None
    try:
        err = json_loads(response.content)["error"]
        code, message = err.get("code"), err.get("message")
    except (ValueError, KeyError, TypeError, AttributeError):
        # not qftrio's error shape: a proxy's short text is worth passing
        # on; another server's page is named, not repeated
        kind = response.headers.get("content-type", "no content type").split(";")[0].strip()
        text = response.text.strip()
        if kind == "text/plain" and text and "\n" not in text:
            message = text[:200]
        else:
            message = f"the answer is not qftrio's ({kind}): is the URL a qftrio server?"
    return errors.error_for_status(response.status_code, code, message)


class _method(Generic[P, T]):
    """A method of both clients, made from the one function that describes
    its :class:`Call`: a coroutine function on a :class:`Client`, a plain
    function on a :class:`SyncClient`. The arguments' types reach both
    through the ParamSpec, for type checkers too, so that the two clients
    cannot drift apart."""

    def __init__(self, describe: Callable[P, Call[T]]) -> None:
        self.describe = describe
        self.__doc__ = describe.__doc__
        self.__wrapped__ = describe  # inspect.signature(Client.enqueue) shows the description's

    @overload
    def __get__(self, client: None, owner: type) -> Self: ...
    @overload
    def __get__(self, client: Client, owner: type) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, client: SyncClient, owner: type) -> Callable[P, T]: ...
    def __get__(self, client: Any, owner: type) -> Any:
        if client is None:
            return self
        bound = client._bind(self.describe)
        # help(client.enqueue) and inspect.signature show the description's.
        bound.__name__ = bound.__qualname__ = self.describe.__name__
        bound.__doc__ = self.__doc__
        bound.__wrapped__ = self.describe
        return bound


X = TypeVar("X")


class _Api(Generic[X]):
    """What both clients share: their arguments and checks, and every call.
    *X* is the type of the httpx transport each accepts."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        max_connections: int = 10,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        transport: X | None = None,
    ) -> None:
        headers = {"User-Agent": "qftrio-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.url = url.rstrip("/")
        try:
            parts = urlsplit(self.url)
            parts.port  # a malformed port raises here
        except ValueError as exc:
            raise errors.ConfigError(f"not a usable server URL: {url!r} ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise errors.ConfigError(f"not a usable server URL: {url!r} (not http:// or https://)")
        try:
            parts.hostname.encode("idna")
        except UnicodeError as exc:
            raise errors.ConfigError(f"not a usable server URL: {url!r} ({exc})") from None
        try:
            check_headers(headers)
        except ValueError as exc:  # the other header is ours
            raise errors.ConfigError(f"the token cannot be sent: {exc}") from None
        self.timeout = timeout
        self._headers = headers
        self._max_connections = max_connections
        self._max_body_size = max_body_size
        self._caller_transport = transport
        self._closed = False
        self._open()

    def _open(self) -> None:
        """Make what the driver needs to send calls."""
        raise NotImplementedError

    def _request(self, call: Call[Any]) -> tuple[str, bytes | None, float]:
        """*call*'s target, body and timeout, once the client is known open."""
        target, body = call.encode()
        if self._closed:
            raise errors.TransportError(f"{call.method} {self.url}{call.path}: the client is closed")
        return target, body, self.timeout + call.wait_secs

    def _transport_error(self, call: Call[Any], exc: HttpError) -> errors.TransportError:
        return errors.TransportError(f"{call.method} {self.url}{call.path}: {exc}")

    # -- worker protocol ---------------------------------------------------

    @_method
    def lease(
        queue: str,
        *,
        max_jobs: int = 1,
        lease_secs: int = 60,
        wait_secs: float = 0,
        worker_id: str | None = None,
    ) -> Call[list[Lease]]:
        """Claim up to *max_jobs* jobs of *queue*, long-polling up to
        *wait_secs* for the first. May return an empty list."""
        body = _build(
            LeaseRequest, max_jobs=max_jobs, lease_secs=lease_secs, wait_secs=wait_secs, worker_id=worker_id
        )
        return Call(
            "POST",
            f"/api/v1/queues/{_segment(queue)}/lease",
            _leases,
            json_body=body,
            wait_secs=wait_secs,
        )

    @_method
    def heartbeat(job_id: str, lease_token: str, extend_secs: int) -> Call[tuple[str, _dt.datetime | None]]:
        """Extend a lease. Returns the job's status and, when it is still
        ``running``, the new deadline. Raises :class:`~qftrio.errors.Conflict`
        when the token is stale."""
        return Call(
            "POST",
            f"/api/v1/jobs/{_segment(job_id)}/heartbeat",
            _heartbeat,
            json_body={"lease_token": lease_token, "extend_secs": extend_secs},
        )

    @_method
    def job_progress(job_id: str, lease_token: str, progress: Mapping[str, Any]) -> Call[str]:
        """Record how far a job's handler has got (a JSON object of at most
        8 KiB; the latest wins), extending nothing. Returns the job's status.
        Raises :class:`~qftrio.errors.Conflict` when the token is stale. A
        handler the worker runtime runs reports with ``job.progress(obj)``."""
        return Call(
            "POST",
            f"/api/v1/jobs/{_segment(job_id)}/progress",
            lambda data: _heartbeat(data)[0],
            json_body={"lease_token": lease_token, "progress": dict(progress)},
        )

    @_method
    def complete(job_id: str, lease_token: str, result: Mapping[str, Any] | None = None) -> Call[None]:
        """Record success (idempotent with the same token)."""
        return Call(
            "POST",
            f"/api/v1/jobs/{_segment(job_id)}/complete",
            None,
            json_body={"lease_token": lease_token, "result": dict(result or {})},
        )

    @_method
    def fail(
        job_id: str, lease_token: str, error: str, retryable: bool = True, *, retry_in_secs: float | None = None
    ) -> Call[None]:
        """Record a failure: retried later if *retryable* and attempts are
        left (after *retry_in_secs* when given, else after the job's
        backoff), else dead-lettered."""
        return Call(
            "POST",
            f"/api/v1/jobs/{_segment(job_id)}/fail",
            None,
            json_body=_fail_body(FailItem(job_id, lease_token, error, retryable, retry_in_secs)),
        )

    @_method
    def job_snooze(job_id: str, lease_token: str, delay_secs: float) -> Call[None]:
        """Put a running job back to pending for *delay_secs* (0 to 30
        days) without using up its attempt."""
        return Call(
            "POST",
            f"/api/v1/jobs/{_segment(job_id)}/snooze",
            None,
            json_body={"lease_token": lease_token, "delay_secs": delay_secs},
        )

    @_method
    def heartbeat_many(items: Sequence[HeartbeatItem]) -> Call[list[HeartbeatReply]]:
        """Heartbeat many leases in one call (at most 1000); one reply per
        item, in order."""
        body = {"items": [_heartbeat_item(i) for i in items]}
        return Call("POST", "/api/v1/leases/heartbeat", _heartbeat_replies, json_body=body)

    @_method
    def complete_many(items: Sequence[CompleteItem]) -> Call[list[ReportReply]]:
        """Complete many jobs in one call (at most 1000)."""
        body = {"items": [{"id": i.job_id, "lease_token": i.lease_token, "result": i.result} for i in items]}
        return Call("POST", "/api/v1/leases/complete", _report_replies, json_body=body)

    @_method
    def fail_many(items: Sequence[FailItem]) -> Call[list[ReportReply]]:
        """Fail many jobs in one call (at most 1000)."""
        body = {"items": [{"id": i.job_id, **_fail_body(i)} for i in items]}
        return Call("POST", "/api/v1/leases/fail", _report_replies, json_body=body)

    @_method
    def snooze_many(items: Sequence[SnoozeItem]) -> Call[list[ReportReply]]:
        """Snooze many jobs in one call (at most 1000)."""
        body = {
            "items": [{"id": i.job_id, "lease_token": i.lease_token, "delay_secs": i.delay_secs} for i in items]
        }
        return Call("POST", "/api/v1/leases/snooze", _report_replies, json_body=body)

    # -- application API ---------------------------------------------------

    @_method
    def enqueue(
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        delay_secs: float | None = None,
        scheduled_at: float | str | _dt.datetime | None = None,
        idempotency_key: str | None = None,
        timeout_secs: int | None = None,
        backoff: Mapping[str, float] | None = None,
        headers: Mapping[str, str] | None = None,
        concurrency: Mapping[str, Any] | None = None,
        rate_limit: str | None = None,
        unique: Mapping[str, Any] | None = None,
    ) -> Call[Job]:
        """Enqueue one job. *scheduled_at* is a datetime (naive: UTC), epoch
        seconds or an RFC 3339 string. A repeated *idempotency_key* returns the first job.
        *timeout_secs* ends each attempt that long after its claim; *backoff*
        (``{initial_secs, factor, max_secs, jitter}``) replaces the
        server's retry backoff for this job. *headers* go to the worker
        untouched; with OpenTelemetry in use, the current trace context is
        added to them. *concurrency* ``{"key", "limit"}``, *rate_limit* (a
        declared rate limit's name) and *unique* ``{"key", "statuses",
        "period_secs"}``: docs/flow-control.md."""
        body = _job_body(
            {
                "kind": kind,
                "payload": dict(payload or {}),
                "queue": queue,
                "priority": priority,
                "max_attempts": max_attempts,
                "delay_secs": delay_secs,
                "scheduled_at": scheduled_at,
                "idempotency_key": idempotency_key,
                "timeout_secs": timeout_secs,
                "backoff": None if backoff is None else dict(backoff),
                "headers": headers,
                "concurrency": concurrency,
                "rate_limit": rate_limit,
                "unique": unique,
            }
        )
        return Call("POST", "/api/v1/jobs", Job.from_wire, json_body=_build(EnqueueRequest, **body))

    @_method
    def enqueue_many(jobs: Iterable[Mapping[str, Any]]) -> Call[list[Job]]:
        """Enqueue many jobs in one transaction (at most 1000). Each item is
        ``{"kind", "payload", "config": {...}}`` or the same with the config
        keys (``queue``, ``priority``, ...) at the top level."""
        body = _build(EnqueueBatchRequest, jobs=[_job_body(j) for j in jobs])
        return Call("POST", "/api/v1/jobs/batch", _jobs, json_body=body)

    @_method
    def job_get(job_id: str) -> Call[Job]:
        return Call("GET", f"/api/v1/jobs/{_segment(job_id)}", Job.from_wire)

    @_method
    def job_wait(job_id: str, *, timeout_secs: float = 30) -> Call[Job]:
        """The job once it has ended (completed, failed or cancelled), or as
        it stands after *timeout_secs* (0 to 60): read its ``status``.
        Woken within milliseconds of the end, from any server; an ended job
        answers at once. Raises :class:`~qftrio.errors.NotFound` for an
        unknown job, :class:`~qftrio.errors.TooManyRequests` past the
        tenant's cap of parked waits."""
        _build(JobWaitQuery, timeout_secs=timeout_secs)
        return Call(
            "GET",
            f"/api/v1/jobs/{_segment(job_id)}/wait",
            Job.from_wire,
            params={"timeout_secs": timeout_secs},
            wait_secs=timeout_secs,
        )

    @_method
    def jobs_list(
        *,
        queue: str | None = None,
        status: Status | str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Call[tuple[list[Job], str | None]]:
        """One page of jobs, newest first, and the cursor of the next page
        (``None`` on the last)."""
        params = {
            "queue": queue,
            "status": str(status) if status is not None else None,
            "kind": kind,
            "limit": limit,
            "cursor": cursor,
        }
        return Call("GET", "/api/v1/jobs", _jobs_page, params=params)

    @_method
    def job_cancel(job_id: str) -> Call[Job]:
        return Call("POST", f"/api/v1/jobs/{_segment(job_id)}/cancel", Job.from_wire)

    @_method
    def job_retry(job_id: str) -> Call[Job]:
        return Call("POST", f"/api/v1/jobs/{_segment(job_id)}/retry", Job.from_wire)

    @_method
    def queues() -> Call[list[QueueStats]]:
        """The first page of the tenant's queues, by name (100 of them):
        :meth:`queues_page` reads the others."""
        return Call("GET", "/api/v1/queues", _queues)

    @_method
    def queues_page(*, limit: int | None = None, cursor: str | None = None) -> Call[tuple[list[QueueStats], str | None]]:
        """One page of the tenant's queues, by name, and the cursor of the
        next page (``None`` on the last)."""
        return Call("GET", "/api/v1/queues", _queues_page, params={"limit": limit, "cursor": cursor})

    @_method
    def queue_stats(queue: str) -> Call[QueueStats]:
        return Call("GET", f"/api/v1/queues/{_segment(queue)}/stats", QueueStats.from_wire)

    @_method
    def queue_pause(queue: str) -> Call[QueueStats]:
        """Pause *queue* on every server (idempotent): leases hand out none
        of its jobs until :meth:`queue_resume`; running jobs go on and report."""
        return Call("POST", f"/api/v1/queues/{_segment(queue)}/pause", QueueStats.from_wire)

    @_method
    def queue_resume(queue: str) -> Call[QueueStats]:
        """Resume a paused *queue* (idempotent)."""
        return Call("POST", f"/api/v1/queues/{_segment(queue)}/resume", QueueStats.from_wire)

    @_method
    def jobs_bulk(
        action: str,
        *,
        queue: str | None = None,
        status: Status | str | None = None,
        kind: str | None = None,
        created_after: float | str | _dt.datetime | None = None,
        created_before: float | str | _dt.datetime | None = None,
        limit: int | None = None,
        all: bool = False,
    ) -> Call[int]:
        """``retry``, ``cancel`` or ``delete`` every job matching the filters
        (at most *limit*, default 10,000), each as the single-job call would;
        returns how many changed. Times are datetimes (naive: UTC), epoch
        seconds or RFC 3339 strings (``created_after <= created_at < created_before``). With no filter,
        pass ``all=True`` to act on every job of the tenant the action
        applies to.

        Raises:
            InvalidInput: an unknown *action*, no filter and not *all*, or a
                *status* the action does not apply to (retry: failed,
                cancelled; cancel: pending, running; delete: completed,
                failed, cancelled).
        """
        if action not in ("retry", "cancel", "delete"):
            raise InvalidArgument(f"action: not one of retry, cancel, delete: {action!r}")
        body = _build(
            BulkRequest,
            queue=queue,
            status=status,
            kind=kind,
            created_after=_time(created_after),
            created_before=_time(created_before),
            **({} if limit is None else {"limit": limit}),
            **({"all": True} if all else {}),
        )
        return Call("POST", f"/api/v1/jobs/bulk/{action}", _count, json_body=body)

    @_method
    def workers() -> Call[list[WorkerInfo]]:
        """The workers seen lately on the tenant's queues, idle ones included, most jobs first."""
        return Call("GET", "/api/v1/workers", _workers)

    @_method
    def rate_limit_set(name: str, limit: int, per_secs: float) -> Call[RateLimit]:
        """Declare or change the rate limit *name*: at most *limit* claims of
        jobs naming it (``config.rate_limit``) in any window of *per_secs*,
        across every server."""
        body = _build(RateLimitRequest, limit=limit, per_secs=per_secs)
        return Call("PUT", f"/api/v1/rate-limits/{_segment(name)}", RateLimit.from_wire, json_body=body)

    @_method
    def rate_limit_get(name: str) -> Call[RateLimit]:
        """A rate limit, with when a job it holds back can next be claimed."""
        return Call("GET", f"/api/v1/rate-limits/{_segment(name)}", RateLimit.from_wire)

    @_method
    def rate_limits_list() -> Call[list[RateLimit]]:
        """The tenant's rate limits, by name."""
        return Call("GET", "/api/v1/rate-limits", _rate_limits)

    @_method
    def rate_limit_delete(name: str) -> Call[None]:
        """Forget the rate limit *name*: jobs naming it are no longer held back."""
        return Call("DELETE", f"/api/v1/rate-limits/{_segment(name)}", None)

    @_method
    def health() -> Call[dict[str, Any]]:
        """``GET /healthz`` (no credential needed)."""
        return Call("GET", "/healthz", _health)

    # -- workflows ---------------------------------------------------------

    @_method
    def workflow_create(
        name: str,
        steps: Iterable[Mapping[str, Any]],
        *,
        context: Mapping[str, Any] | None = None,
    ) -> Call[Workflow]:
        """Create a workflow (at most 1000 steps). Each step is ``{"name",
        "kind", "payload", "depends_on", "max_attempts"}`` (the last three
        optional). A bad graph (duplicate names, unknown dependencies, a
        cycle) raises :class:`~qftrio.errors.InvalidInput` and stores
        nothing."""
        body = _build(WorkflowCreateRequest, name=name, context=dict(context or {}), steps=[dict(s) for s in steps])
        return Call("POST", "/api/v1/workflows", Workflow.from_wire, json_body=body)

    @_method
    def steps_add(
        job_id: str,
        lease_token: str,
        steps: Iterable[Mapping[str, Any]],
        *,
        collect: str | None = None,
    ) -> Call[Workflow]:
        """Add steps (at most 1000 a call, shaped as :meth:`workflow_create`'s)
        to the workflow of the running step *job_id*, whose lease
        *lease_token* holds (worker token). They run once that step has
        completed; the steps waiting for it wait for them too; with
        *collect*, their results go, in this order, to a list under that
        key of the context. The same call repeated changes nothing.
        Raises :class:`~qftrio.errors.Conflict` when the lease is lost
        and :class:`~qftrio.errors.InvalidInput` for steps that do not
        fit the workflow."""
        body = _build(StepsAddRequest, lease_token=lease_token, steps=[dict(s) for s in steps], collect=collect)
        return Call("POST", f"/api/v1/jobs/{_segment(job_id)}/steps", Workflow.from_wire, json_body=body)

    @_method
    def workflow_get(workflow_id: str) -> Call[Workflow]:
        """The workflow, with every step and its job."""
        return Call("GET", f"/api/v1/workflows/{_segment(workflow_id)}", Workflow.from_wire)

    @_method
    def workflows_list(
        *,
        status: WorkflowStatus | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Call[tuple[list[Workflow], str | None]]:
        """One page of workflows, newest first (steps without their jobs),
        and the cursor of the next page (``None`` on the last)."""
        params = {"status": str(status) if status is not None else None, "limit": limit, "cursor": cursor}
        return Call("GET", "/api/v1/workflows", _workflows_page, params=params)

    @_method
    def workflow_cancel(workflow_id: str) -> Call[Workflow]:
        """Cancel a running workflow and its unfinished steps."""
        return Call("POST", f"/api/v1/workflows/{_segment(workflow_id)}/cancel", Workflow.from_wire)


    # -- schedules ---------------------------------------------------------

    @_method
    def schedule_set(
        name: str,
        cron: str,
        job: Mapping[str, Any],
        *,
        timezone: str = "UTC",
        paused: bool = False,
        catch_up: str = "latest",
    ) -> Call[Schedule]:
        """Create or replace the schedule *name*: each tick of *cron* (five
        fields, or six with a leading seconds field) in *timezone* enqueues
        one job as *job* says (``{"kind", "payload", "config": {...}}``, or
        the config keys at the top level). *catch_up*: ``latest``, ``none``
        or ``all`` (docs/schedules.md)."""
        body = _build(
            ScheduleRequest, cron=cron, timezone=timezone, job=_job_body(job), paused=paused, catch_up=catch_up
        )
        return Call("PUT", f"/api/v1/schedules/{_segment(name)}", Schedule.from_wire, json_body=body)

    @_method
    def schedule_get(name: str) -> Call[Schedule]:
        """The schedule, with its next and last run and its last job's id."""
        return Call("GET", f"/api/v1/schedules/{_segment(name)}", Schedule.from_wire)

    @_method
    def schedules_list(*, limit: int | None = None, cursor: str | None = None) -> Call[tuple[list[Schedule], str | None]]:
        """One page of schedules by name, and the cursor of the next page
        (``None`` on the last)."""
        return Call("GET", "/api/v1/schedules", _schedules_page, params={"limit": limit, "cursor": cursor})

    @_method
    def schedule_delete(name: str) -> Call[None]:
        """Delete the schedule; the jobs it enqueued stay."""
        return Call("DELETE", f"/api/v1/schedules/{_segment(name)}", None)

    @_method
    def schedule_pause(name: str) -> Call[Schedule]:
        """Pause the schedule (idempotent): no tick fires until resumed."""
        return Call("POST", f"/api/v1/schedules/{_segment(name)}/pause", Schedule.from_wire)

    @_method
    def schedule_resume(name: str) -> Call[Schedule]:
        """Resume the schedule from its next tick (idempotent)."""
        return Call("POST", f"/api/v1/schedules/{_segment(name)}/resume", Schedule.from_wire)

    @_method
    def schedule_trigger(name: str) -> Call[tuple[Schedule, Job]]:
        """Enqueue one job of the schedule now, besides its ticks: the
        schedule and that job."""
        return Call("POST", f"/api/v1/schedules/{_segment(name)}/trigger", _triggered)


class Client(_Api["httpx.AsyncBaseTransport"]):
    """An async client of one qftrio server, for Trio or asyncio.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        token: a worker token (for the protocol calls) or a tenant token (for
            the application API); ``None`` sends no credential.
        timeout: seconds allowed for each whole call (waiting for a
            connection, connecting, sending, reading the answer). A long
            poll (:meth:`lease`) gets its ``wait_secs`` on top.
        max_connections: the connection pool's size. The worker runtime
            keeps it small on purpose: it batches its reports instead.
        max_body_size: the largest answer body accepted, in bytes; a larger
            one ends the call with :class:`~qftrio.errors.TransportError`.
        transport: an ``httpx.AsyncBaseTransport`` to send through instead
            of the network (tests, or a transport of the caller's own).

    Calls go through one :class:`~qftrio._http.Transport`, chosen at the
    first call: under Trio, qftrio's own HTTP/1.1 pool; through httpx when
    *transport* is given, when the environment names a proxy for *url*
    (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, minus ``NO_PROXY``), or
    under asyncio. A client serves the event loop it is first used under.

    Raises:
        ConfigError: *url* is not a usable ``http://`` or ``https://`` URL,
            or *token* cannot be sent as a header (a line break, a control
            or non-ASCII character, surrounding spaces).
    """

    def _open(self) -> None:
        self._transport: Transport | None = None

    def _open_transport(self) -> Transport:
        """The transport every call goes through, made at the first call."""
        if self._transport is None:
            limits = {"max_connections": self._max_connections, "max_body_size": self._max_body_size}
            if self._caller_transport is None and not _proxied(self.url) and sniffio.current_async_library() == "trio":
                self._transport = HttpPool(self.url, self._headers, **limits)
            else:
                self._transport = HttpxTransport(self.url, self._headers, transport=self._caller_transport, **limits)
        return self._transport

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool. Idempotent."""
        self._closed = True
        if self._transport is not None:
            await self._transport.aclose()

    def _bind(self, describe: Callable[P, Call[T]]) -> Callable[P, Awaitable[T]]:
        async def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return await self._send(describe(*args, **kwargs))

        return method

    async def events(
        self, *, queue: str | None = None, kind: str | None = None, job: str | None = None, stats_secs: int | None = None
    ) -> AsyncIterator[Event]:
        """The tenant's job changes as they happen, on any server, as
        :class:`Event` objects: those of *queue*, *kind* or the one *job*
        (all of them by default), and with *stats_secs* (1..60) each named
        queue's stats that often (every queue's, with no *queue*). A live
        feed, not a log: nothing from before it opened is replayed. It ends
        after an ``"overflow"`` event, or when the server shuts down; leave
        the loop (or close the iterator) to end it.

        Each stream holds a connection of its own, outside the pool, and
        fails with :class:`~qftrio.errors.TransportError` after 45 s without
        a byte (the server sends a comment every 15 s).

        Raises:
            InvalidArgument: a filter out of range, before any call.
            TooManyRequests: the tenant has as many streams open on that
                server as it allows.
        """
        import httpx

        target = _events_target(queue, kind, job, stats_secs)
        if self._closed:
            raise errors.TransportError(f"GET {self.url}/api/v1/events: the client is closed")
        options = _httpx_options(self.url, self._headers, 1)
        async with httpx.AsyncClient(**options, transport=self._caller_transport) as http:
            timeout = httpx.Timeout(self.timeout, read=EVENTS_READ_TIMEOUT)
            with _stream_errors(self.url):
                async with http.stream("GET", target, timeout=timeout) as answer:
                    if answer.status_code >= 400:
                        raise _error(Response(answer.status_code, dict(answer.headers), await answer.aread()))
                    reader = _SseReader()
                    lines = answer.aiter_lines()
                    try:
                        async for line in lines:
                            event = reader.line(line)
                            if event is not None:
                                yield event
                    finally:
                        # Closed first, so that reading on ends httpx's
                        # generators, which would each warn when collected
                        # if left suspended.
                        await answer.aclose()
                        with contextlib.suppress(httpx.HTTPError, httpx.StreamError):
                            async for _ in lines:
                                pass

    async def _send(self, call: Call[T]) -> T:
        target, body, timeout = self._request(call)
        try:
            response = await self._open_transport().request(call.method, target, body, timeout=timeout)
        except HttpError as exc:
            raise self._transport_error(call, exc) from None
        return call.answer(self.url, response)


class SyncClient(_Api["httpx.BaseTransport"]):
    """A client of one qftrio server for synchronous code (Django, Flask,
    scripts), with the methods, arguments, results and errors of
    :class:`Client`, each call blocking until its answer. One instance may
    be shared by every thread of a process: calls from many threads run at
    once, over a pool of kept-alive connections.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        token: a worker token or a tenant token; ``None`` sends no credential.
        timeout: seconds allowed for each call: waiting for a connection,
            then connecting, each send and each read within what is left;
            the body stops being read once it has passed. A long poll
            (:meth:`lease`) gets its ``wait_secs`` on top.
        max_connections: connections open at once; further calls wait.
        max_body_size: the largest answer body accepted, in bytes; a larger
            one ends the call with :class:`~qftrio.errors.TransportError`.
        transport: an ``httpx.BaseTransport`` to send through instead of
            the network (tests, or a transport of the caller's own).

    Calls go through an ``httpx.Client``, which reads proxies from the
    environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``)
    and verifies ``https://`` as :class:`Client` does. It connects at its
    first call; connections opened before a ``fork`` must not be used after
    it, so make the client in each process, or make no call before the fork.

    Raises:
        ConfigError: *url* is not a usable ``http://`` or ``https://`` URL,
            or *token* cannot be sent as a header.
    """

    def _open(self) -> None:
        self._transport = HttpxSyncTransport(
            self.url,
            self._headers,
            max_connections=self._max_connections,
            max_body_size=self._max_body_size,
            transport=self._caller_transport,
        )

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool. Idempotent."""
        self._closed = True
        self._transport.close()

    def _bind(self, describe: Callable[P, Call[T]]) -> Callable[P, T]:
        def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return self._send(describe(*args, **kwargs))

        return method

    def events(
        self, *, queue: str | None = None, kind: str | None = None, job: str | None = None, stats_secs: int | None = None
    ) -> Iterator[Event]:
        """:meth:`Client.events`, as a plain iterator (its ``close()``, or
        leaving the loop, ends the stream)."""
        import httpx

        target = _events_target(queue, kind, job, stats_secs)
        if self._closed:
            raise errors.TransportError(f"GET {self.url}/api/v1/events: the client is closed")
        options = _httpx_options(self.url, self._headers, 1)
        with httpx.Client(**options, transport=self._caller_transport) as http:
            timeout = httpx.Timeout(self.timeout, read=EVENTS_READ_TIMEOUT)
            with _stream_errors(self.url), http.stream("GET", target, timeout=timeout) as answer:
                if answer.status_code >= 400:
                    raise _error(Response(answer.status_code, dict(answer.headers), answer.read()))
                reader = _SseReader()
                for line in answer.iter_lines():
                    event = reader.line(line)
                    if event is not None:
                        yield event

    def _send(self, call: Call[T]) -> T:
        target, body, timeout = self._request(call)
        try:
            response = self._transport.request(call.method, target, body, timeout=timeout)
        except HttpError as exc:
            raise self._transport_error(call, exc) from None
        return call.answer(self.url, response)
