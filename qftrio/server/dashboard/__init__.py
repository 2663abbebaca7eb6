"""The web dashboard: server-rendered pages for operators under ``/dashboard/``.

Every page calls the engine's operations directly (an indexed query with a
limit each); the dashboard adds pages, not queries. The pages are the
module-level views of :mod:`.views`; :mod:`.figures` words what they show;
:func:`create_dashboard` builds the blueprint from them.

Security:

- The sign-in form takes a tenant token (the API's), checked as the API
  checks it, and opens a session (:meth:`Engine.session_create`): a random
  id kept in the database, so every server sees it, with its tenant, a
  secret of its own, an idle end and an absolute end. The cookie holds the
  id only (HttpOnly, SameSite=Strict, Secure when the request came over
  TLS); the token is never in it. Sign-out deletes the session, and a
  session whose token no longer acts for its tenant (the server restarted
  with another token) is refused and deleted.
- Every action is a POST carrying a CSRF token: an HMAC of the session's
  own secret, so it is per session, dies with it, says nothing of the
  token, and cannot be computed by a page that cannot read the session's
  pages. It is compared in constant time. A POST whose ``Origin`` is
  another site is refused first.
- A bulk action (retry, cancel or delete all matching) acts only from its
  confirmation page, which shows how many jobs match; with no queue chosen
  it also needs the form's explicit ``every_queue`` choice.
- Templates are autoescaped (payloads holding HTML show as text), and every
  answer carries a Content-Security-Policy allowing only the package's own
  script and style, no framing, and ``nosniff``.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint
from quart_schema import hide
from werkzeug.exceptions import HTTPException

from ... import errors
from ..auth import Credentials
from ..engine import Engine
from . import views
from .figures import Throughput, timeline
from .views import COOKIE, PREFIX, Dashboard, csrf_token

__all__ = ["COOKIE", "PREFIX", "Throughput", "create_dashboard", "csrf_token", "timeline"]


def create_dashboard(engine: Engine, credentials: Credentials) -> Blueprint:
    """The dashboard's blueprint, serving *engine* to the tenants of
    *credentials*; it answers ``/favicon.ico`` too."""
    bp = Blueprint("dashboard", __name__, url_prefix=PREFIX, template_folder="templates")
    for method, rule, fn in views.ROUTES:
        bp.add_url_rule(rule, fn.__name__, fn, methods=[method])
    bp.add_url_rule("/static/<path:filename>", "static", views.static, methods=["GET"])
    bp.before_request(views.small_same_origin_posts)
    bp.after_request(views.security_headers)
    bp.register_error_handler(errors.ApiError, views.api_error)
    bp.register_error_handler(HTTPException, views.http_error)
    state = Dashboard(engine, credentials)

    @bp.record_once
    def mount(setup: Any) -> None:
        app = setup.app
        app.extensions[views.EXTENSION] = state
        # Outside the prefix, where browsers look; not a page, so without
        # the blueprint's session or error page.
        app.add_url_rule("/favicon.ico", "dashboard_favicon", views.favicon, methods=["GET"])
        # Pages, not API routes: /openapi.json documents the API only.
        for endpoint, fn in app.view_functions.items():
            if endpoint.startswith(f"{bp.name}.") or endpoint == "dashboard_favicon":
                hide(fn)

    return bp
