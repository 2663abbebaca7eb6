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
from prometheus_client import CONTENT_TYPE_LATEST
from quart import Response, request
from quart_schema import QuartSchema, document_request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .. import errors
from .._json import dumps as json_dumps
from ..models import (
    MAX_BATCH,
    MAX_WORKFLOWS_PAGE,
    Status,
    WorkflowCreateRequest,
    WorkflowStatus,
)
from .auth import Credentials
from .engine import Engine
from .protocol import ROUTES, check_name, parse_body

__all__ = ["create_app"]

log = logging.getLogger("qftrio.server")

M = TypeVar("M", bound=pydantic.BaseModel)


def _json(data: Any, status: int = 200) -> Response:
    return Response(json_dumps(data), status=status, content_type="application/json")


async def _body(model: type[M]) -> M:
    """The request body parsed into *model* (an absent body counts as ``{}``)."""
    return parse_body(model, await request.get_data(cache=False))


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
        return Response(await engine.metrics_exposition(), content_type=CONTENT_TYPE_LATEST)

    # -- application API ---------------------------------------------------

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
            check_name(queue, "queue")
        if kind is not None:
            check_name(kind, "kind")
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
            raise errors.InvalidInput(f"status: must be one of {', '.join(s.value for s in WorkflowStatus)}") from None
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
        (stats,) = await engine.queues_stats(who, check_name(queue, "queue"))
        return _json(stats.to_wire())

    # -- enqueue and the worker protocol -------------------------------------
    # ProtocolFront answers these before Quart sees them; the routes here
    # document them in /openapi.json and serve any caller of the bare app.

    def protocol_route(path: str, model: type[pydantic.BaseModel], route: Any, caller: str) -> None:
        async def view(**params: str) -> Response:
            if caller == "tenant":
                params["tenant"] = tenant()
            else:
                worker()
            status, payload = await route(engine, await request.get_data(cache=False), **params)
            return Response(b"", status=status) if payload is None else _json(payload, status)

        view.__name__ = view.__qualname__ = f"protocol_{route.__name__}"
        view.__doc__ = route.__doc__
        app.post(path)(document_request(model)(view))

    for path, model, route, caller in ROUTES:
        protocol_route(path, model, route, caller)

    return app
