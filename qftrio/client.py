"""The HTTP client: typed calls of the worker protocol and the application API.

::

    async with qftrio.Client("http://127.0.0.1:8000", token) as client:
        job = await client.enqueue("resize-image", {"src": "a.png"}, queue="images")

Every error answer raises the matching :mod:`qftrio.errors` class (a ``404`` is
:class:`~qftrio.errors.NotFound`, and so on); a server that cannot be reached,
a broken connection or a timeout raises :class:`~qftrio.errors.TransportError`.
Nothing else escapes: httpx's exceptions never reach the caller.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import pydantic
import sniffio

from . import errors
from ._http import DEFAULT_MAX_BODY_SIZE, HttpError, HttpPool, HttpxTransport, Response, Transport, check_headers
from ._json import dumps_strict as json_dumps, loads as json_loads
from .models import (
    BulkRequest,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    HeartbeatReply,
    EnqueueBatchRequest,
    EnqueueRequest,
    Job,
    Lease,
    LeaseRequest,
    Outcome,
    QueueStats,
    ReportReply,
    Status,
    WorkerInfo,
    Workflow,
    WorkflowCreateRequest,
    WorkflowStatus,
    format_time,
    parse_time,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Client",
    "HeartbeatItem",
    "CompleteItem",
    "FailItem",
    "HeartbeatReply",
    "ReportReply",
]

DEFAULT_URL = "http://127.0.0.1:8000"


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
            raise errors.InvalidInput(f"{where or 'body'}: {value!r} is not a JSON number")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_finite(item, f"{where}.{index}" if where else str(index))


def _build(model_cls: type[pydantic.BaseModel], **fields: Any) -> dict[str, Any]:
    """Validate a request body locally, so that a bad argument fails before
    the network is touched, with the same message the server would give."""
    try:
        return _body(model_cls(**fields))
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise errors.InvalidInput(f"{where}: {first.get('msg', 'invalid')}") from None


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


_CONFIG_KEYS = frozenset({"queue", "priority", "max_attempts", "delay_secs", "scheduled_at", "idempotency_key"})


def _job_body(spec: Mapping[str, Any]) -> dict[str, Any]:
    """An enqueue body from either the wire shape (``{"kind", "payload",
    "config": {...}}``) or a flat one (``{"kind", "payload", "queue", ...}``)."""
    spec = dict(spec)
    config = dict(spec.pop("config", None) or {})
    for key in list(spec):
        if key in _CONFIG_KEYS:
            config[key] = spec.pop(key)
    body: dict[str, Any] = {"kind": spec.pop("kind", None), "payload": spec.pop("payload", None) or {}}
    if spec:
        raise errors.InvalidInput(f"{sorted(spec)[0]}: unknown field")
    body["config"] = _config(config)
    return body


T = TypeVar("T")

# Readers of answers: JSON in, records out. A KeyError or TypeError in one
# means the answer is not qftrio's (Client._json says so).


def _leases(data: Any) -> list[Lease]:
    return [Lease.from_wire(item) for item in data["jobs"]]


def _heartbeat(data: Any) -> tuple[str, float | None]:
    return data["status"], parse_time(data.get("locked_until"))


# The batch routes answer each item with the status the single route would
# have given; the replies carry the outcome it stands for.


def _heartbeat_replies(data: Any) -> list[HeartbeatReply]:
    return [
        HeartbeatReply(
            job_id=r["id"],
            outcome=Outcome.of_code(r["code"]),
            status=r.get("status"),
            locked_until=parse_time(r.get("locked_until")),
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


def _count(data: Any) -> int:
    return int(data["count"])


def _workers(data: Any) -> list[WorkerInfo]:
    return [WorkerInfo.from_wire(w) for w in data["workers"]]


def _health(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {"status": data}


def _workflows_page(data: Any) -> tuple[list[Workflow], str | None]:
    return [Workflow.from_wire(w) for w in data["workflows"]], data.get("next_cursor")


class Client:
    """An async client of one qftrio server.

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
        transport: an httpx transport to send through instead of the
            network (tests, or a transport of the caller's own).

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

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        max_connections: int = 10,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        transport: httpx.AsyncBaseTransport | None = None,
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
        self._transport: Transport | None = None
        self._closed = False

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

    # -- plumbing ----------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """One call. *path* has its parameters encoded already (:func:`_segment`)."""
        body = None
        if json_body is not None:
            try:
                body = json_dumps(json_body)
            except ValueError as exc:
                raise errors.InvalidInput(f"the request cannot be sent as JSON: {exc}") from None
        target = path
        if params:
            target += "?" + urlencode({k: v for k, v in params.items() if v is not None})
        if self._closed:
            raise errors.TransportError(f"{method} {self.url}{path}: the client is closed")
        try:
            response = await self._open_transport().request(
                method, target, body, timeout=self.timeout if timeout is None else timeout
            )
        except HttpError as exc:
            raise errors.TransportError(f"{method} {self.url}{path}: {exc}") from None
        if response.status_code >= 400:
            raise self._error(response)
        return response

    @staticmethod
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

    async def _json(self, method: str, path: str, read: Callable[[Any], T], **kwargs: Any) -> T:
        """The answer to *method* *path*, turned into its records by *read*.

        Raises:
            UnexpectedAnswer: the answer is not JSON, or not of the shape
                *read* expects: not a qftrio server.
        """
        response = await self._request(method, path, **kwargs)
        try:
            return read(json_loads(response.content))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise errors.UnexpectedAnswer(
                f"{method} {self.url}{path}: the answer is not qftrio's ({type(exc).__name__}: {exc})"[:300]
            ) from None

    # -- worker protocol ---------------------------------------------------

    async def lease(
        self,
        queue: str,
        *,
        max_jobs: int = 1,
        lease_secs: int = 60,
        wait_secs: float = 0,
        worker_id: str | None = None,
    ) -> list[Lease]:
        """Claim up to *max_jobs* jobs of *queue*, long-polling up to
        *wait_secs* for the first. May return an empty list."""
        body = _build(
            LeaseRequest, max_jobs=max_jobs, lease_secs=lease_secs, wait_secs=wait_secs, worker_id=worker_id
        )
        return await self._json(
            "POST",
            f"/api/v1/queues/{_segment(queue)}/lease",
            _leases,
            json_body=body,
            timeout=self.timeout + wait_secs,
        )

    async def heartbeat(self, job_id: str, lease_token: str, extend_secs: int) -> tuple[str, float | None]:
        """Extend a lease. Returns the job's status and, when it is still
        ``running``, the new deadline. Raises :class:`~qftrio.errors.Conflict`
        when the token is stale."""
        return await self._json(
            "POST",
            f"/api/v1/jobs/{_segment(job_id)}/heartbeat",
            _heartbeat,
            json_body={"lease_token": lease_token, "extend_secs": extend_secs},
        )

    async def complete(self, job_id: str, lease_token: str, result: Mapping[str, Any] | None = None) -> None:
        """Record success (idempotent with the same token)."""
        await self._request(
            "POST",
            f"/api/v1/jobs/{_segment(job_id)}/complete",
            json_body={"lease_token": lease_token, "result": dict(result or {})},
        )

    async def fail(self, job_id: str, lease_token: str, error: str, retryable: bool = True) -> None:
        """Record a failure: retried later if *retryable* and attempts are
        left, else dead-lettered."""
        await self._request(
            "POST",
            f"/api/v1/jobs/{_segment(job_id)}/fail",
            json_body={"lease_token": lease_token, "error": error, "retryable": retryable},
        )

    async def heartbeat_many(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        """Heartbeat many leases in one call (at most 1000); one reply per
        item, in order."""
        body = {
            "items": [
                {"id": i.job_id, "lease_token": i.lease_token, "extend_secs": int(i.extend_secs)} for i in items
            ]
        }
        return await self._json("POST", "/api/v1/leases/heartbeat", _heartbeat_replies, json_body=body)

    async def complete_many(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        """Complete many jobs in one call (at most 1000)."""
        body = {"items": [{"id": i.job_id, "lease_token": i.lease_token, "result": i.result} for i in items]}
        return await self._json("POST", "/api/v1/leases/complete", _report_replies, json_body=body)

    async def fail_many(self, items: Sequence[FailItem]) -> list[ReportReply]:
        """Fail many jobs in one call (at most 1000)."""
        body = {
            "items": [
                {"id": i.job_id, "lease_token": i.lease_token, "error": i.error, "retryable": i.retryable}
                for i in items
            ]
        }
        return await self._json("POST", "/api/v1/leases/fail", _report_replies, json_body=body)

    # -- application API ---------------------------------------------------

    async def enqueue(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        delay_secs: float | None = None,
        scheduled_at: float | _dt.datetime | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        """Enqueue one job. *scheduled_at* is epoch seconds or an aware
        datetime. A repeated *idempotency_key* returns the first job."""
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
            }
        )
        return await self._json("POST", "/api/v1/jobs", Job.from_wire, json_body=_build(EnqueueRequest, **body))

    async def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[Job]:
        """Enqueue many jobs in one transaction (at most 1000). Each item is
        ``{"kind", "payload", "config": {...}}`` or the same with the config
        keys (``queue``, ``priority``, ...) at the top level."""
        body = _build(EnqueueBatchRequest, jobs=[_job_body(j) for j in jobs])
        return await self._json("POST", "/api/v1/jobs/batch", _jobs, json_body=body)

    async def job_get(self, job_id: str) -> Job:
        return await self._json("GET", f"/api/v1/jobs/{_segment(job_id)}", Job.from_wire)

    async def jobs_list(
        self,
        *,
        queue: str | None = None,
        status: Status | str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """One page of jobs, newest first, and the cursor of the next page
        (``None`` on the last)."""
        params = {
            "queue": queue,
            "status": str(status) if status is not None else None,
            "kind": kind,
            "limit": limit,
            "cursor": cursor,
        }
        return await self._json("GET", "/api/v1/jobs", _jobs_page, params=params)

    async def job_cancel(self, job_id: str) -> Job:
        return await self._json("POST", f"/api/v1/jobs/{_segment(job_id)}/cancel", Job.from_wire)

    async def job_retry(self, job_id: str) -> Job:
        return await self._json("POST", f"/api/v1/jobs/{_segment(job_id)}/retry", Job.from_wire)

    async def queues(self) -> list[QueueStats]:
        return await self._json("GET", "/api/v1/queues", _queues)

    async def queue_stats(self, queue: str) -> QueueStats:
        return await self._json("GET", f"/api/v1/queues/{_segment(queue)}/stats", QueueStats.from_wire)

    async def queue_pause(self, queue: str) -> QueueStats:
        """Pause *queue* on every server (idempotent): leases hand out none
        of its jobs until :meth:`queue_resume`; running jobs go on and report."""
        return await self._json("POST", f"/api/v1/queues/{_segment(queue)}/pause", QueueStats.from_wire)

    async def queue_resume(self, queue: str) -> QueueStats:
        """Resume a paused *queue* (idempotent)."""
        return await self._json("POST", f"/api/v1/queues/{_segment(queue)}/resume", QueueStats.from_wire)

    async def jobs_bulk(
        self,
        action: str,
        *,
        queue: str | None = None,
        status: Status | str | None = None,
        kind: str | None = None,
        created_after: float | _dt.datetime | None = None,
        created_before: float | _dt.datetime | None = None,
        limit: int | None = None,
        all: bool = False,
    ) -> int:
        """``retry``, ``cancel`` or ``delete`` every job matching the filters
        (at most *limit*, default 10,000), each as the single-job call would;
        returns how many changed. Times are epoch seconds or aware datetimes
        (``created_after <= created_at < created_before``). With no filter,
        pass ``all=True`` to act on every job of the tenant the action
        applies to.

        Raises:
            InvalidInput: an unknown *action*, no filter and not *all*, or a
                *status* the action does not apply to (retry: failed,
                cancelled; cancel: pending, running; delete: completed,
                failed, cancelled).
        """
        if action not in ("retry", "cancel", "delete"):
            raise errors.InvalidInput(f"action: not one of retry, cancel, delete: {action!r}")
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
        return await self._json("POST", f"/api/v1/jobs/bulk/{action}", _count, json_body=body)

    async def workers(self) -> list[WorkerInfo]:
        """The worker ids holding running jobs, most jobs first."""
        return await self._json("GET", "/api/v1/workers", _workers)

    async def health(self) -> dict[str, Any]:
        """``GET /healthz`` (no credential needed)."""
        return await self._json("GET", "/healthz", _health)

    # -- workflows ---------------------------------------------------------

    async def workflow_create(
        self,
        name: str,
        steps: Iterable[Mapping[str, Any]],
        *,
        context: Mapping[str, Any] | None = None,
    ) -> Workflow:
        """Create a workflow (at most 1000 steps). Each step is ``{"name",
        "kind", "payload", "depends_on", "max_attempts"}`` (the last three
        optional). A bad graph (duplicate names, unknown dependencies, a
        cycle) raises :class:`~qftrio.errors.InvalidInput` and stores
        nothing."""
        body = _build(WorkflowCreateRequest, name=name, context=dict(context or {}), steps=[dict(s) for s in steps])
        return await self._json("POST", "/api/v1/workflows", Workflow.from_wire, json_body=body)

    async def workflow_get(self, workflow_id: str) -> Workflow:
        """The workflow, with every step and its job."""
        return await self._json("GET", f"/api/v1/workflows/{_segment(workflow_id)}", Workflow.from_wire)

    async def workflows_list(
        self,
        *,
        status: WorkflowStatus | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> tuple[list[Workflow], str | None]:
        """One page of workflows, newest first (steps without their jobs),
        and the cursor of the next page (``None`` on the last)."""
        params = {"status": str(status) if status is not None else None, "limit": limit, "cursor": cursor}
        return await self._json("GET", "/api/v1/workflows", _workflows_page, params=params)

    async def workflow_cancel(self, workflow_id: str) -> Workflow:
        """Cancel a running workflow and its unfinished steps."""
        return await self._json("POST", f"/api/v1/workflows/{_segment(workflow_id)}/cancel", Workflow.from_wire)
