"""The HTTP API: routes parse, authorise and call the engine; nothing more.

Every error answer is JSON, ``{"error": {"code", "message"}}``: malformed JSON
is 400, a body that breaks the schema 422 (naming the field), a body over the
cap 413, and the engine's own errors carry their status. Bad input never
reaches the store.
"""

from __future__ import annotations

import logging
import os
from typing import Any, TypeVar

import pydantic
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response, request
from quart_schema import QuartSchema, document_request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .. import errors
from .._json import dumps as json_dumps
from ..models import (
    MAX_BATCH,
    MAX_WORKFLOWS_PAGE,
    NAME_PATTERN,
    CompleteManyRequest,
    CompleteRequest,
    EnqueueBatchRequest,
    EnqueueRequest,
    FailManyRequest,
    FailRequest,
    HeartbeatManyRequest,
    HeartbeatRequest,
    LeaseRequest,
    Status,
    WorkflowCreateRequest,
    WorkflowStatus,
    format_time,
    valid_name,
)
from . import metrics
from .auth import Credentials
from .engine import Engine, spec_from_request
from .store.base import CompleteItem, FailItem, HeartbeatItem, HeartbeatResult, Outcome, ReportResult

__all__ = ["create_app"]

log = logging.getLogger("qftrio.server")

M = TypeVar("M", bound=pydantic.BaseModel)

_REPORT_CODES = {Outcome.OK: 204, Outcome.NOT_FOUND: 404, Outcome.CONFLICT: 409}
_CONFLICT_MESSAGE = "the lease token is not the job's current one, or the job was cancelled"

def _json(data: Any, status: int = 200) -> Response:
    return Response(json_dumps(data), status=status, content_type="application/json")

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

async def _body(model: type[M]) -> M:
    """The request body parsed into *model* (an absent body counts as ``{}``)."""
    raw = await request.get_data(cache=False)
    if not raw.strip():
        raw = b"{}"
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors(include_url=False)):
            raise errors.BadRequest("the body is not valid JSON", code="malformed_json") from None
        raise errors.InvalidInput(_field_errors(exc)) from None

def _name(value: str, what: str) -> str:
    if not valid_name(value):
        raise errors.InvalidInput(f"{what}: must match {NAME_PATTERN}")
    return value

def _heartbeat_wire(result: HeartbeatResult) -> dict[str, Any]:
    assert result.status is not None
    out: dict[str, Any] = {"status": result.status.value}
    if result.locked_until is not None:
        out["locked_until"] = format_time(result.locked_until)
    return out

def _report_response(result: ReportResult) -> Response:
    if result.outcome is Outcome.OK:
        return Response("", status=204)
    if result.outcome is Outcome.NOT_FOUND:
        raise errors.NotFound("job not found")
    raise errors.Conflict(_CONFLICT_MESSAGE, code="lease_lost")

def create_app(engine: Engine, credentials: Credentials, *, max_body_bytes: int = 1 << 20) -> QuartTrio:
    """The quart-trio application serving *engine*."""
    app = QuartTrio(__name__, root_path=os.path.dirname(__file__))
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.config["JSON_SORT_KEYS"] = False
    QuartSchema(
        app,
        info={"title": "qftrio", "version": "1"},
        redoc_ui_path=None,
        scalar_ui_path=None,
        swagger_ui_path="/docs",
        security_schemes={"bearer": {"type": "http", "scheme": "bearer"}},
        security=[{"bearer": []}],
    )

    def worker() -> None:
        credentials.worker(request.headers.get("Authorization"))

    def tenant() -> str:
        return credentials.tenant(request.headers.get("Authorization"))

    # -- errors ------------------------------------------------------------

    @app.errorhandler(errors.ApiError)
    async def api_error(exc: errors.ApiError) -> Response:
        return _json(exc.to_wire(), exc.status_code)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if status == 413:
            err: errors.ApiError = errors.PayloadTooLarge(f"the request body is larger than {max_body_bytes} bytes")
            response = _json(err.to_wire(), status)
            # The rest of the body was never read: this connection cannot
            # carry another request.
            response.headers["Connection"] = "close"
            return response
        err = errors.error_for_status(status, None, exc.description or exc.name)
        err.code = exc.name.lower().replace(" ", "_")
        return _json(err.to_wire(), status)

    @app.errorhandler(Exception)
    async def internal_error(exc: Exception) -> Response:
        log.error("request failed", exc_info=exc)
        return _json(errors.ApiError("internal error").to_wire(), 500)

    # -- health and metrics ------------------------------------------------

    @app.get("/healthz")
    async def healthz() -> Response:
        try:
            await engine.store.ping()
        except Exception:
            return _json({"status": "unavailable"}, 503)
        return _json({"status": "ok"})

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(generate_latest(metrics.REGISTRY), content_type=CONTENT_TYPE_LATEST)

    # -- application API ---------------------------------------------------

    @app.post("/api/v1/jobs")
    @document_request(EnqueueRequest)
    async def enqueue() -> Response:
        who = tenant()
        body = await _body(EnqueueRequest)
        (inserted,) = await engine.enqueue(who, [spec_from_request(body)])
        return _json(inserted.job.to_wire(), 201 if inserted.created else 200)

    @app.post("/api/v1/jobs/batch")
    @document_request(EnqueueBatchRequest)
    async def enqueue_batch() -> Response:
        who = tenant()
        body = await _body(EnqueueBatchRequest)
        inserted = await engine.enqueue(who, [spec_from_request(item) for item in body.jobs])
        return _json({"jobs": [i.job.to_wire() for i in inserted]}, 201)

    @app.get("/api/v1/jobs/<job_id>")
    async def job_get(job_id: str) -> Response:
        job = await engine.job_get(tenant(), job_id)
        return _json(job.to_wire())

    @app.get("/api/v1/jobs")
    async def jobs_list() -> Response:
        who = tenant()
        args = request.args
        queue = args.get("queue") or None
        kind = args.get("kind") or None
        status_arg = args.get("status") or None
        if queue is not None:
            _name(queue, "queue")
        if kind is not None:
            _name(kind, "kind")
        try:
            status = Status(status_arg) if status_arg else None
        except ValueError:
            raise errors.InvalidInput(f"status: must be one of {', '.join(s.value for s in Status)}") from None
        limit_arg = args.get("limit") or "50"
        if not limit_arg.isdigit() or not 1 <= int(limit_arg) <= MAX_BATCH:
            raise errors.InvalidInput(f"limit: must be an integer from 1 to {MAX_BATCH}")
        jobs, cursor = await engine.jobs_list(
            who, queue=queue, status=status, kind=kind, limit=int(limit_arg), cursor=args.get("cursor") or None
        )
        return _json({"jobs": [j.to_wire() for j in jobs], "next_cursor": cursor})

    @app.post("/api/v1/jobs/<job_id>/cancel")
    async def job_cancel(job_id: str) -> Response:
        return _json((await engine.job_cancel(tenant(), job_id)).to_wire())

    @app.post("/api/v1/jobs/<job_id>/retry")
    async def job_retry(job_id: str) -> Response:
        return _json((await engine.job_retry(tenant(), job_id)).to_wire())

    # -- workflows -----------------------------------------------------------

    @app.post("/api/v1/workflows")
    @document_request(WorkflowCreateRequest)
    async def workflow_create() -> Response:
        who = tenant()
        body = await _body(WorkflowCreateRequest)
        return _json((await engine.workflow_create(who, body)).to_wire(), 201)

    @app.get("/api/v1/workflows/<workflow_id>")
    async def workflow_get(workflow_id: str) -> Response:
        return _json((await engine.workflow_get(tenant(), workflow_id)).to_wire())

    @app.get("/api/v1/workflows")
    async def workflows_list() -> Response:
        who = tenant()
        args = request.args
        status_arg = args.get("status") or None
        try:
            status = WorkflowStatus(status_arg) if status_arg else None
        except ValueError:
            raise errors.InvalidInput(
                f"status: must be one of {', '.join(s.value for s in WorkflowStatus)}"
            ) from None
        limit_arg = args.get("limit") or "50"
        if not limit_arg.isdigit() or not 1 <= int(limit_arg) <= MAX_WORKFLOWS_PAGE:
            raise errors.InvalidInput(f"limit: must be an integer from 1 to {MAX_WORKFLOWS_PAGE}")
        workflows, cursor = await engine.workflows_list(
            who, status=status, limit=int(limit_arg), cursor=args.get("cursor") or None
        )
        return _json({"workflows": [w.to_wire() for w in workflows], "next_cursor": cursor})

    @app.post("/api/v1/workflows/<workflow_id>/cancel")
    async def workflow_cancel(workflow_id: str) -> Response:
        return _json((await engine.workflow_cancel(tenant(), workflow_id)).to_wire())

    @app.get("/api/v1/queues")
    async def queues() -> Response:
        stats = await engine.queues_stats(tenant())
        return _json({"queues": [s.to_wire() for s in stats]})

    @app.get("/api/v1/queues/<queue>/stats")
    async def queue_stats(queue: str) -> Response:
        who = tenant()
        (stats,) = await engine.queues_stats(who, _name(queue, "queue"))
        return _json(stats.to_wire())

    # -- worker protocol ---------------------------------------------------

    @app.post("/api/v1/queues/<queue>/lease")
    @document_request(LeaseRequest)
    async def lease(queue: str) -> Response:
        worker()
        _name(queue, "queue")
        body = await _body(LeaseRequest)
        leases = await engine.lease(
            queue,
            max_jobs=body.max_jobs,
            lease_secs=body.lease_secs,
            wait_secs=body.wait_secs,
            worker_id=body.worker_id,
        )
        return _json({"jobs": [lease.to_wire() for lease in leases]})

    @app.post("/api/v1/jobs/<job_id>/heartbeat")
    @document_request(HeartbeatRequest)
    async def heartbeat(job_id: str) -> Response:
        worker()
        body = await _body(HeartbeatRequest)
        (result,) = await engine.heartbeat([HeartbeatItem(job_id, body.lease_token, body.extend_secs)])
        if result.outcome is Outcome.NOT_FOUND:
            raise errors.NotFound("job not found")
        if result.outcome is Outcome.CONFLICT:
            raise errors.Conflict("the lease token is not the job's current one", code="lease_lost")
        return _json(_heartbeat_wire(result))

    @app.post("/api/v1/jobs/<job_id>/complete")
    @document_request(CompleteRequest)
    async def complete(job_id: str) -> Response:
        worker()
        body = await _body(CompleteRequest)
        (result,) = await engine.complete([CompleteItem(job_id, body.lease_token, body.result)])
        return _report_response(result)

    @app.post("/api/v1/jobs/<job_id>/fail")
    @document_request(FailRequest)
    async def fail(job_id: str) -> Response:
        worker()
        body = await _body(FailRequest)
        (result,) = await engine.fail([FailItem(job_id, body.lease_token, body.error, body.retryable)])
        return _report_response(result)

    # Batch forms of the three reports: one request, one transaction, a
    # result per item with the status code the single route would give.

    @app.post("/api/v1/leases/heartbeat")
    @document_request(HeartbeatManyRequest)
    async def heartbeat_many() -> Response:
        worker()
        body = await _body(HeartbeatManyRequest)
        results = await engine.heartbeat([HeartbeatItem(i.id, i.lease_token, i.extend_secs) for i in body.items])
        out = []
        for item, result in zip(body.items, results):
            entry: dict[str, Any] = {"id": item.id, "code": 200 if result.outcome is Outcome.OK else _REPORT_CODES[result.outcome]}
            if result.outcome is Outcome.OK:
                entry.update(_heartbeat_wire(result))
            out.append(entry)
        return _json({"results": out})

    def _report_many(items: list[Any], results: list[ReportResult]) -> Response:
        return _json({"results": [{"id": i.id, "code": _REPORT_CODES[r.outcome]} for i, r in zip(items, results)]})

    @app.post("/api/v1/leases/complete")
    @document_request(CompleteManyRequest)
    async def complete_many() -> Response:
        worker()
        body = await _body(CompleteManyRequest)
        results = await engine.complete([CompleteItem(i.id, i.lease_token, i.result) for i in body.items])
        return _report_many(body.items, results)

    @app.post("/api/v1/leases/fail")
    @document_request(FailManyRequest)
    async def fail_many() -> Response:
        worker()
        body = await _body(FailManyRequest)
        results = await engine.fail([FailItem(i.id, i.lease_token, i.error, i.retryable) for i in body.items])
        return _report_many(body.items, results)

    return app
