"""The Quart app: the dashboard, and the answer to a path no route declares.

Every route of the API and the server's pages are answered by
:class:`~qftrio.server.front.ApiFront` before a request reaches Quart; what
is left is the dashboard (under ``/dashboard/``) and the ``404`` of any other
path. Every error answer outside the dashboard's pages is JSON,
``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import logging
import os
import urllib.parse

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .. import errors
from .._json import dumps as json_dumps
from .auth import Credentials
from .dashboard import create_dashboard
from .engine import Engine

__all__ = ["create_app"]

log = logging.getLogger("qftrio.server")


def _json(data: object, status: int = 200) -> Response:
    return Response(json_dumps(data), status=status, content_type="application/json")


def create_app(engine: Engine, credentials: Credentials) -> QuartTrio:
    """The quart-trio application serving the dashboard of *engine*."""
    app = QuartTrio(__name__, root_path=os.path.dirname(__file__))
    # The dashboard's forms are small; the HTTP server caps every body.
    app.config["MAX_CONTENT_LENGTH"] = None
    app.config["JSON_SORT_KEYS"] = False

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        message = exc.description or exc.name
        if status == 404:
            # The path as it was sent (%2F stays %2F), not Werkzeug's page of advice.
            raw = request.scope.get("raw_path") or request.path.encode()
            path = raw.decode("latin-1").split("?", 1)[0]
            message = f"no route {request.method} {path} (every route is listed at /docs)"
        err = errors.error_for_status(status, None, message)
        err.code = exc.name.lower().replace(" ", "_")
        response = _json(err.to_wire(), status)
        for name, value in exc.get_headers():
            if name.lower() == "allow":
                response.headers["Allow"] = value
        return response

    @app.after_request
    async def no_redirect_from_host(response: Response) -> Response:
        # Routing's own redirects (a missing trailing slash, doubled
        # slashes) name the request's Host; qftrio only ever redirects to
        # itself, so every Location is made a path.
        location = response.headers.get("Location")
        if location is not None:
            parts = urllib.parse.urlsplit(location)
            if parts.scheme or parts.netloc:
                # one leading slash: "//host/..." would name a host again
                path = "/" + parts.path.lstrip("/")
                response.headers["Location"] = urllib.parse.urlunsplit(("", "", path, parts.query, ""))
        return response

    @app.errorhandler(Exception)
    async def internal_error(exc: Exception) -> Response:
        log.error("request failed", exc_info=exc)
        return _json(errors.ApiError("internal error").to_wire(), 500)

    app.register_blueprint(create_dashboard(engine, credentials))
    return app
