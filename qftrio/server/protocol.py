"""The hot routes, and the ASGI front that serves them.

Enqueue (single and batch), lease, heartbeat, complete and fail (single and
batch) are nearly every request a busy server answers. Through Quart, a small
request costs several times what the HTTP server alone spends on it (a 401
from here 73-110 µs of CPU, ``/healthz`` through Quart 444-529 µs; see
docs/performance.md), so
:class:`ProtocolFront` answers these nine routes straight from ASGI and hands
every other request to the Quart app. The Quart app routes the same paths to
the same functions below, which is what ``/openapi.json`` documents;
behaviour is identical either way.

Each route function takes the engine, the raw body and the path parameters
(and, for the application's routes, the caller's tenant), and returns
``(status, json_body_or_None)``; errors are raised as
:class:`~qftrio.errors.ApiError`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pydantic
import trio

from .. import errors
from .._json import dumps as json_dumps
from ..models import (
    NAME_PATTERN,
    CompleteItem,
    CompleteManyRequest,
    CompleteRequest,
    EnqueueBatchRequest,
    EnqueueRequest,
    FailItem,
    FailManyRequest,
    FailRequest,
    HeartbeatItem,
    HeartbeatManyRequest,
    HeartbeatRequest,
    LeaseRequest,
    format_time,
    valid_name,
)
from .auth import Credentials
from .engine import Engine, spec_from_request
from .store.base import HeartbeatResult, Outcome, ReportResult

__all__ = ["ProtocolFront", "parse_body", "check_name", "ROUTES"]

log = logging.getLogger("qftrio.server")

M = TypeVar("M", bound=pydantic.BaseModel)
Reply = tuple[int, Any]

_REPORT_CODES = {Outcome.OK: 204, Outcome.NOT_FOUND: 404, Outcome.CONFLICT: 409}
_CONFLICT_MESSAGE = "the lease token is not the job's current one, or the job was cancelled"


# -- parsing -------------------------------------------------------------------


def _field_errors(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "body"
        if err["type"] == "string_pattern_mismatch":
            message = f"must match {NAME_PATTERN}"
        elif err["type"] == "extra_forbidden":
            message = "unknown field"
        else:
            message = err["msg"]
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def parse_body(model: type[M], raw: bytes) -> M:
    """*raw* parsed into *model* (an empty body counts as ``{}``): 400 for
    malformed JSON, 422 naming every field that breaks the schema, and 422
    for a number JSON cannot hold."""
    if not raw.strip():
        raw = b"{}"
    try:
        parsed = model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors(include_url=False)):
            raise errors.BadRequest("the body is not valid JSON", code="malformed_json") from None
        raise errors.InvalidInput(_field_errors(exc)) from None
    if _may_hold_non_finite(raw):
        _reject_non_finite(raw)
    return parsed


# JSON has no NaN or Infinity and no number beyond a double's range, but the
# parser takes them, and a store would keep them as null or refuse them.
# Such a number needs one of these in the text (a number with a three-digit
# exponent, or 309 digits in a row); only then is the body read again,
# number by number. Each test is linear in the body's size. A number starts
# after ":", "[" or ",": a bare "4e123" inside a UUID (in almost every
# report) is not one.
_EXPONENT_3 = re.compile(rb"[:\[,]\s*-?\d+(?:\.\d+)?[eE][+-]?\d{3}")
_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 309


def _may_hold_non_finite(raw: bytes) -> bool:
    return (
        b"NaN" in raw
        or b"Infinity" in raw
        or _EXPONENT_3.search(raw) is not None
        or _LONG_RUN in raw.translate(_DIGITS_AS_ZEROS)
    )


def _reject_non_finite(raw: bytes) -> None:
    def constant(name: str) -> Any:
        raise errors.InvalidInput(f"body: {name} is not a JSON number")

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise errors.InvalidInput(f"body: {text[:40]} is beyond the range of a JSON number")
        return value

    json.loads(raw, parse_constant=constant, parse_float=number)


def check_name(value: str, what: str) -> str:
    if not valid_name(value):
        raise errors.InvalidInput(f"{what}: must match {NAME_PATTERN}")
    return value


def _heartbeat_wire(result: HeartbeatResult) -> dict[str, Any]:
    assert result.status is not None
    out: dict[str, Any] = {"status": result.status.value}
    if result.locked_until is not None:
        out["locked_until"] = format_time(result.locked_until)
    return out


def _report_reply(result: ReportResult) -> Reply:
    if result.outcome is Outcome.OK:
        return 204, None
    if result.outcome is Outcome.NOT_FOUND:
        raise errors.NotFound("job not found")
    raise errors.Conflict(_CONFLICT_MESSAGE, code="lease_lost")


# -- the routes ----------------------------------------------------------------


async def enqueue(engine: Engine, raw: bytes, *, tenant: str) -> Reply:
    body = parse_body(EnqueueRequest, raw)
    (inserted,) = await engine.enqueue(tenant, [spec_from_request(body)])
    return (201 if inserted.created else 200), inserted.job.to_wire()


async def enqueue_batch(engine: Engine, raw: bytes, *, tenant: str) -> Reply:
    body = parse_body(EnqueueBatchRequest, raw)
    inserted = await engine.enqueue(tenant, [spec_from_request(item) for item in body.jobs])
    return 201, {"jobs": [i.job.to_wire() for i in inserted]}


async def lease(engine: Engine, raw: bytes, queue: str) -> Reply:
    return await run_lease(engine, queue, lease_request(raw, queue))


def lease_request(raw: bytes, queue: str) -> LeaseRequest:
    check_name(queue, "queue")
    return parse_body(LeaseRequest, raw)


async def run_lease(engine: Engine, queue: str, body: LeaseRequest) -> Reply:
    leases = await engine.lease(
        queue, max_jobs=body.max_jobs, lease_secs=body.lease_secs, wait_secs=body.wait_secs, worker_id=body.worker_id
    )
    return 200, {"jobs": [lease.to_wire() for lease in leases]}


async def heartbeat(engine: Engine, raw: bytes, job_id: str) -> Reply:
    body = parse_body(HeartbeatRequest, raw)
    (result,) = await engine.heartbeat([HeartbeatItem(job_id, body.lease_token, body.extend_secs)])
    if result.outcome is Outcome.NOT_FOUND:
        raise errors.NotFound("job not found")
    if result.outcome is Outcome.CONFLICT:
        raise errors.Conflict("the lease token is not the job's current one", code="lease_lost")
    return 200, _heartbeat_wire(result)


async def complete(engine: Engine, raw: bytes, job_id: str) -> Reply:
    body = parse_body(CompleteRequest, raw)
    (result,) = await engine.complete([CompleteItem(job_id, body.lease_token, body.result)])
    return _report_reply(result)


async def fail(engine: Engine, raw: bytes, job_id: str) -> Reply:
    body = parse_body(FailRequest, raw)
    (result,) = await engine.fail([FailItem(job_id, body.lease_token, body.error, body.retryable)])
    return _report_reply(result)


# Batch forms of the three reports: one request, one transaction, a result
# per item with the status code the single route would give.


async def heartbeat_many(engine: Engine, raw: bytes) -> Reply:
    body = parse_body(HeartbeatManyRequest, raw)
    results = await engine.heartbeat([HeartbeatItem(i.id, i.lease_token, i.extend_secs) for i in body.items])
    out = []
    for item, result in zip(body.items, results):
        if result.outcome is Outcome.OK:
            out.append({"id": item.id, "code": 200, **_heartbeat_wire(result)})
        else:
            out.append({"id": item.id, "code": _REPORT_CODES[result.outcome]})
    return 200, {"results": out}


async def complete_many(engine: Engine, raw: bytes) -> Reply:
    body = parse_body(CompleteManyRequest, raw)
    results = await engine.complete([CompleteItem(i.id, i.lease_token, i.result) for i in body.items])
    return 200, {"results": [{"id": i.id, "code": _REPORT_CODES[r.outcome]} for i, r in zip(body.items, results)]}


async def fail_many(engine: Engine, raw: bytes) -> Reply:
    body = parse_body(FailManyRequest, raw)
    results = await engine.fail([FailItem(i.id, i.lease_token, i.error, i.retryable) for i in body.items])
    return 200, {"results": [{"id": i.id, "code": _REPORT_CODES[r.outcome]} for i, r in zip(body.items, results)]}


Route = Callable[..., Awaitable[Reply]]

#: Who may call a route: ``"worker"`` (the worker token) or ``"tenant"`` (a
#: tenant token; the route gets the tenant).
Caller = str

#: ``POST`` paths (Quart syntax), their documented body, their function, and
#: who may call them.
ROUTES: list[tuple[str, type[pydantic.BaseModel], Route, Caller]] = [
    ("/api/v1/jobs", EnqueueRequest, enqueue, "tenant"),
    ("/api/v1/jobs/batch", EnqueueBatchRequest, enqueue_batch, "tenant"),
    ("/api/v1/queues/<queue>/lease", LeaseRequest, lease, "worker"),
    ("/api/v1/jobs/<job_id>/heartbeat", HeartbeatRequest, heartbeat, "worker"),
    ("/api/v1/jobs/<job_id>/complete", CompleteRequest, complete, "worker"),
    ("/api/v1/jobs/<job_id>/fail", FailRequest, fail, "worker"),
    ("/api/v1/leases/heartbeat", HeartbeatManyRequest, heartbeat_many, "worker"),
    ("/api/v1/leases/complete", CompleteManyRequest, complete_many, "worker"),
    ("/api/v1/leases/fail", FailManyRequest, fail_many, "worker"),
]

_MATCHERS = [
    (re.compile("^" + re.sub(r"<(\w+)>", r"(?P<\1>[^/]+)", path) + "$"), route, caller)
    for path, _, route, caller in ROUTES
]


def _match(path: str) -> tuple[Route, dict[str, str], Caller] | None:
    for pattern, route, caller in _MATCHERS:
        m = pattern.match(path)
        if m is not None:
            return route, m.groupdict(), caller
    return None


# -- the ASGI front --------------------------------------------------------------


class _Disconnected(Exception):
    pass


class ProtocolFront:
    """An ASGI app: the worker protocol's routes answered here, everything
    else passed to *app* (the Quart app)."""

    def __init__(self, app: Any, engine: Engine, credentials: Credentials, *, max_body_bytes: int) -> None:
        self.app = app
        self.engine = engine
        self.credentials = credentials
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            found = _match(scope["path"])
            if found is not None:
                await self._serve(*found, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(
        self, route: Route, params: dict[str, str], caller: Caller, scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        try:
            # A refusal leaves the body unread; the HTTP server reads it
            # after the answer, so the connection stays usable.
            authorization = _header(scope, b"authorization")
            if caller == "tenant":
                params["tenant"] = self.credentials.tenant(authorization)
            else:
                self.credentials.worker(authorization)
            raw = await self._read_body(scope, receive)
            if route is lease:
                body = lease_request(raw, **params)
                call = run_lease(self.engine, params["queue"], body)
                if body.wait_secs > 0:
                    # A long poll is abandoned if its client goes away. Its
                    # answer is sent from inside the watch, so that it
                    # leaves before the watch is torn down.
                    await _unless_disconnected(self._answer(call, send), receive)
                    return
                status, payload = await call
            else:
                status, payload = await route(self.engine, raw, **params)
        except _Disconnected:
            return  # nobody to answer
        except errors.ApiError as exc:
            await _send(send, *_error_reply(exc))
            return
        except Exception:
            log.exception("request failed: POST %s", scope["path"])
            await _send(send, 500, errors.ApiError("internal error").to_wire())
            return
        await _send(send, status, payload)

    async def _answer(self, call: Awaitable[Reply], send: Any) -> None:
        """Await *call* and send its answer, or its error's."""
        try:
            status, payload = await call
        except errors.ApiError as exc:
            await _send(send, *_error_reply(exc))
            return
        await _send(send, status, payload)

    async def _read_body(self, scope: dict[str, Any], receive: Any) -> bytes:
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise errors.PayloadTooLarge(f"the request body is larger than {self.max_body_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise errors.PayloadTooLarge(f"the request body is larger than {self.max_body_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _error_reply(exc: errors.ApiError) -> tuple[int, Any, bool]:
    # An unread body leaves the connection unusable for another request.
    return exc.status_code, exc.to_wire(), isinstance(exc, errors.PayloadTooLarge)


async def _send(send: Any, status: int, payload: Any, close: bool = False) -> None:
    headers = [(b"connection", b"close")] if close else []
    if payload is None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return
    body = json_dumps(payload)
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def _unless_disconnected(call: Awaitable[None], receive: Any) -> None:
    """Await *call*; abandon it if the client disconnects meanwhile (a long
    poll must not claim jobs for a caller that is gone)."""
    done = False
    failed: list[Exception] = []

    async def watch(cancel_scope: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        cancel_scope.cancel()

    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, outer)
            try:
                await call
                done = True
            except Exception as exc:
                failed.append(exc)  # raised below, not wrapped in the nursery's group
            nursery.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if not done:
        raise _Disconnected
