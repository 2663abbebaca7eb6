"""The dashboard's pages and actions, one module-level function each.

A view reads the engine, the credentials and the throughput samples from the
app it is mounted on (:func:`dashboard`, put there by
:func:`~qftrio.server.dashboard.create_dashboard`); :data:`ROUTES` lists
every view with its method and rule, and the blueprint is built from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import pathlib
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from quart import Response, current_app, g, redirect, render_template, request, send_from_directory
from werkzeug.exceptions import HTTPException

from ... import errors
from ...models import MAX_JOB_ID, QueueStats, Status, WorkflowStatus, valid_name
from ..auth import Credentials
from ..engine import Engine
from ..store.base import BulkAction, DashboardSession
from ..transitions import BULK_STATUSES, bulk_statuses
from .figures import SHOWN_CHARS, Throughput, age, clip, idle_note, show_rate, show_time, shown, timeline

PREFIX = "/dashboard"
STATIC = pathlib.Path(__file__).parent / "static"
COOKIE = "qftrio_dashboard"
MAX_FORM_BYTES = 16 * 1024
#: Jobs, workflows per page.
PAGE = 50
#: Jobs a bulk action changes at most per click.
BULK_LIMIT = 10_000
#: How far back the queues page's "failed in the last hour" looks.
FAILED_WINDOW_SECS = 3600.0
#: Characters of one failed attempt's error on a job's page.
ERROR_CHARS = 2000
#: Failed attempts a job's page lists (the latest).
ERRORS_SHOWN = 20
#: Held jobs the workers page links per worker (the rest as a count).
WORKER_IDS_SHOWN = 5
#: Schedules the overview counts at most (one page of the schedules list).
SCHEDULES_COUNTED = 100

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_BULK_ACTIONS = {"retry": "Retry", "cancel": "Cancel", "delete": "Delete"}
_BULK_DONE = {"retry": "retried", "cancel": "cancelled", "delete": "deleted"}

#: The heading of an error page, by status.
ERROR_TITLES = {
    400: "Bad request",
    401: "Not signed in",
    403: "Not allowed",
    404: "Page not found",
    405: "Not allowed here",
    409: "Not possible now",
    413: "Too large",
    422: "Invalid input",
    429: "Too many attempts",
    503: "Temporarily unavailable",
}

#: Where :func:`dashboard` finds the app's :class:`Dashboard`.
EXTENSION = "qftrio.dashboard"

View = Callable[..., Awaitable[Response]]

#: Every page and action: ``(method, rule under /dashboard, view)``; the
#: endpoint is the view's name (``url_for('dashboard.queues')``).
ROUTES: list[tuple[str, str, View]] = []


def route(method: str, rule: str) -> Callable[[View], View]:
    """Add the decorated view to :data:`ROUTES`."""

    def add(fn: View) -> View:
        ROUTES.append((method, rule, fn))
        return fn

    return add


@dataclasses.dataclass(frozen=True)
class Dashboard:
    """What the views of one app read: its engine, the tenants' tokens, and
    this server's throughput samples."""

    engine: Engine
    credentials: Credentials
    throughput: Throughput = dataclasses.field(default_factory=Throughput)


def dashboard() -> Dashboard:
    """The :class:`Dashboard` of the app serving the request."""
    found: Dashboard = current_app.extensions[EXTENSION]
    return found


def csrf_token(session: DashboardSession) -> str:
    """The CSRF token of *session*, derived from its own secret."""
    return hmac.new(session.secret.encode(), b"qftrio-dashboard-csrf", hashlib.sha256).hexdigest()


# -- input ------------------------------------------------------------------


def _json_answer(value: Any) -> Response:
    return Response(json.dumps(value, ensure_ascii=False), content_type="application/json; charset=utf-8")


def _name(field: str, value: str | None) -> str | None:
    """A queue or kind filter: None when blank, 422 when not a name."""
    if not value:
        return None
    if not valid_name(value):
        raise errors.InvalidInput(f"{field}: not a valid name: {value!r}")
    return value


def _enum(field: str, cls: type[Status] | type[WorkflowStatus], value: str | None) -> Any:
    if not value:
        return None
    try:
        return cls(value)
    except ValueError:
        names = ", ".join(s.value for s in cls)
        raise errors.InvalidInput(f"{field}: not one of {names}: {value!r}") from None


def _job_id(value: str) -> str:
    if not value or len(value) > MAX_JOB_ID:
        raise errors.InvalidInput(f"job id: 1 to {MAX_JOB_ID} characters")
    return value


def _query(**params: str | None) -> str:
    """A query string of the given parameters that are set."""
    return urllib.parse.urlencode({k: v for k, v in params.items() if v})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bulk:
    """A bulk action and its filters, as a jobs page asks for it, its
    confirmation shows it and the confirming form carries it."""

    action: BulkAction
    queue: str | None
    kind: str | None
    status: Status | None
    #: Asked from the dead letters page (whose status is always failed).
    dead: bool

    @classmethod
    def parse(cls, fields: Any) -> Bulk:
        """From a query string or a form: 422 naming the field for anything
        malformed, or for a status the action never applies to."""
        action = fields.get("action", "")
        if action not in _BULK_ACTIONS:
            raise errors.InvalidInput(f"action: not one of retry, cancel, delete: {action!r}")
        bulk = cls(
            action=action,
            queue=_name("queue", fields.get("queue")),
            kind=_name("kind", fields.get("kind")),
            status=_enum("status", Status, fields.get("status")),
            dead=fields.get("from") == "dead",
        )
        bulk_statuses(action, bulk.status)
        return bulk

    @property
    def statuses(self) -> tuple[Status, ...]:
        """The statuses of the jobs it acts on."""
        return bulk_statuses(self.action, self.status)

    @property
    def fields(self) -> dict[str, str | None]:
        """The confirming form's fields."""
        status = self.status.value if self.status else None
        return {
            "action": self.action,
            "queue": self.queue,
            "kind": self.kind,
            "status": status,
            "from": "dead" if self.dead else None,
        }

    def back(self, **extra: str) -> str:
        """The page it was asked from, with its filters (and *extra*)."""
        path = f"{PREFIX}/dead" if self.dead else f"{PREFIX}/jobs"
        status = None if self.dead or self.status is None else self.status.value
        query = _query(queue=self.queue, kind=self.kind, status=status, **extra)
        return f"{path}?{query}" if query else path


def _over_tls() -> bool:
    """Whether the browser reached the dashboard over HTTPS: qftrio serves
    plain HTTP behind a TLS proxy, which says so in ``X-Forwarded-Proto``.
    Trusting that header can only make the cookie stricter."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.scheme == "https" or forwarded == "https"


def _see(path: str) -> Response:
    """After an action, the page to show (Post/Redirect/Get)."""
    return redirect(f"{PREFIX}/{path}", 303)


def _pages(filters: dict[str, str | None], cursor: str | None, next_cursor: str | None) -> dict[str, Any]:
    """The keyset pager's links: back to the newest page, and on to the next."""
    return {
        "first": cursor is None,
        "first_url": f"?{_query(**filters)}",
        "next_url": f"?{_query(**filters, cursor=next_cursor)}" if next_cursor else None,
    }


def _next(value: str | None) -> str:
    # Only a path of the dashboard itself: never an open redirect, and
    # only printable ASCII with no backslash, so nothing can break out
    # of the Location header or be read as another host.
    if value and value.startswith(PREFIX + "/") and all(" " < c < "\x7f" and c != "\\" for c in value):
        return value
    return f"{PREFIX}/"


# -- sessions and pages -------------------------------------------------------


async def signed_in() -> DashboardSession | None:
    """The request's valid session, if it has one (read once a request)."""
    if "qftrio_session" not in g:
        session_id = request.cookies.get(COOKIE, "")
        d = dashboard()
        g.qftrio_session = await d.engine.session_get(session_id, d.credentials.tokens_of) if session_id else None
    session: DashboardSession | None = g.qftrio_session
    return session


async def page(template: str, status: int = 200, **context: Any) -> Response:
    """*template* rendered for the request's session (if any)."""
    try:
        session = await signed_in()
    except errors.ApiError:  # the store is down: the error page shows no session
        session = None
    body = await render_template(
        template,
        tenant=session.tenant if session else None,
        csrf=csrf_token(session) if session else "",
        now=dashboard().engine.clock(),
        age=age,
        time=show_time,
        rate=show_rate,
        clip=clip,
        **context,
    )
    return Response(body, status=status, content_type="text/html; charset=utf-8")


def view(fn: View) -> View:
    """A page for signed-in tenants: without a session, GETs go to the
    sign-in form; the view is called with the tenant."""

    async def wrapper(**params: str) -> Response:
        session = await signed_in()
        if session is None:
            return redirect(f"{PREFIX}/signin?{_query(next=request.full_path.rstrip('?'))}", 303)
        return await fn(session.tenant, **params)

    wrapper.__name__ = fn.__name__
    return wrapper


def action(fn: View) -> View:
    """A POST of a signed-in tenant carrying the session's CSRF token; the
    view is called with the tenant and the form."""

    async def wrapper(**params: str) -> Response:
        session = await signed_in()
        if session is None:
            raise errors.Unauthorized("not signed in, or the session has ended: sign in again")
        form = await request.form
        given = form.get("csrf", "")
        if not hmac.compare_digest(given.encode(), csrf_token(session).encode()):
            raise errors.Forbidden("missing or wrong CSRF token: reload the page and try again")
        return await fn(session.tenant, form, **params)

    wrapper.__name__ = fn.__name__
    return wrapper


# -- what every answer goes through ---------------------------------------------


async def static(filename: str) -> Response:
    return await send_from_directory(STATIC, filename)


#: Read once: browsers ask for it on every site, and drop the request as
#: they please, which must leave no file open.
FAVICON = (STATIC / "favicon.ico").read_bytes()


async def favicon() -> Response:
    """``/favicon.ico``: the dashboard's icon."""
    response = Response(FAVICON, content_type="image/x-icon")
    response.headers["Cache-Control"] = "public, max-age=86400"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


async def small_same_origin_posts() -> None:
    if request.method != "POST":
        return
    # The app leaves body caps to each route; a form here is a few fields.
    if request.content_length is None or request.content_length > MAX_FORM_BYTES:
        raise errors.PayloadTooLarge(f"a dashboard form is at most {MAX_FORM_BYTES} bytes, with a Content-Length")
    origin = request.headers.get("Origin")
    if origin is None:
        return
    hosts = {request.host, request.headers.get("X-Forwarded-Host", "").split(",")[0].strip()}
    if origin == "null" or urllib.parse.urlsplit(origin).netloc not in hosts:
        raise errors.Forbidden("a cross-site form cannot act on the dashboard")


async def security_headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


async def api_error(exc: errors.ApiError) -> Response:
    title = ERROR_TITLES.get(exc.status_code, "Something went wrong")
    return await page("dashboard/error.html", exc.status_code, error=exc, title=title)


async def http_error(exc: HTTPException) -> Response:
    return await api_error(errors.error_for_status(exc.code or 500, None, exc.description or exc.name))


# -- signing in and out ---------------------------------------------------------


@route("GET", "/signin")
async def signin_form() -> Response:
    return await page("dashboard/signin.html", next=_next(request.args.get("next")), problem=None)


@route("POST", "/signin")
async def signin() -> Response:
    form = await request.form
    token = form.get("token", "").strip()
    target = _next(form.get("next"))
    engine = dashboard().engine
    try:
        tenant = dashboard().credentials.tenant(f"Bearer {token}")
    except errors.ApiError as exc:  # 401, or 429 (the front adds Retry-After)
        return await page("dashboard/signin.html", exc.status_code, next=target, problem=exc.message)
    # A session signed in over another one replaces it.
    await engine.session_delete(request.cookies.get(COOKIE, ""))
    session_id, _ = await engine.session_create(tenant, token)
    response = redirect(target, 303)
    response.set_cookie(COOKIE, session_id, path=PREFIX, httponly=True, samesite="Strict", secure=_over_tls())
    return response


@route("POST", "/signout")
@action
async def signout(tenant: str, form: Any) -> Response:
    await dashboard().engine.session_delete(request.cookies.get(COOKIE, ""))
    response = redirect(f"{PREFIX}/signin", 303)
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="Strict", secure=_over_tls())
    return response


# -- queues -----------------------------------------------------------------------


def queue_rows(tenant: str, stats: list[QueueStats]) -> list[dict[str, Any]]:
    d = dashboard()
    now = d.engine.clock()
    rows = []
    for s in stats:
        rate, series = d.throughput.observe(tenant, s)
        rows.append(
            {
                "queue": s.queue,
                "counts": {st.value: s.counts.get(st.value, 0) for st in Status},
                "oldest_ready": age(s.oldest_ready_at, now),
                "next_available": age(s.next_available_at, now),
                # ready jobs flow control holds back, counted up to a cap
                "held_concurrency": str(s.held_concurrency),
                "held_rate_limit": str(s.held_rate_limit),
                "rate": show_rate(rate),
                "paused": s.paused,
                "series": series,
            }
        )
    return rows


async def summary(tenant: str, stats: list[QueueStats]) -> dict[str, str]:
    """The queues page's summary row: jobs pending (and of them,
    scheduled) and running in the queues of the page, dead letters of the
    last hour, the oldest ready job's wait in the queues that are not
    paused (a queue paused on purpose holds its jobs back on purpose), and
    the ready jobs flow control holds back."""
    engine = dashboard().engine
    now = engine.clock()
    failed, more = await engine.jobs_failed_since(tenant, now - FAILED_WINDOW_SECS, limit=PAGE)
    ready = [s.oldest_ready_at for s in stats if s.oldest_ready_at is not None and not s.paused]
    # counted up to a cap per queue, as the queue's own page does
    concurrency = sum(s.held_concurrency for s in stats)
    rate_limit = sum(s.held_rate_limit for s in stats)
    return {
        "pending": str(sum(s.counts.get(Status.PENDING.value, 0) for s in stats)),
        "running": str(sum(s.counts.get(Status.RUNNING.value, 0) for s in stats)),
        # of the pending, those whose time has not come; counted up to a cap per queue
        "scheduled": str(sum(s.scheduled for s in stats)),
        "failed_last_hour": f"{failed}+" if more else str(failed),
        "oldest_ready": age(min(ready, default=None), now),
        "held_back": (
            f"{_jobs(concurrency)} by their concurrency key, {_jobs(rate_limit)} by their rate limit"
            if concurrency or rate_limit
            else "none"
        ),
    }


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


async def overview(tenant: str) -> dict[str, str]:
    """The overview's lines of the workers and schedules pages: one read
    each, of at most a page of them."""
    engine = dashboard().engine
    now = engine.clock()
    workers = await engine.workers(tenant)
    busy = sum(1 for w in workers if w.jobs)
    minutes = round(engine.WORKERS_SEEN_SECS / 60)
    many = "+" if len(workers) >= engine.MAX_WORKERS_LISTED else ""
    if workers:
        seen = "worker" if len(workers) == 1 else "workers"
        workers_line = f"{len(workers)}{many} {seen} seen in the last {minutes} minutes, {busy} of them running jobs"
    else:
        workers_line = f"no worker seen in the last {minutes} minutes"
    schedules, more = await engine.schedules_list(tenant, limit=SCHEDULES_COUNTED)
    if schedules:
        paused = sum(1 for s in schedules if s.paused)
        named = "schedule" if len(schedules) == 1 else "schedules"
        schedules_line = f"{len(schedules)}{'+' if more else ''} {named}, {paused} paused"
        due = [s.next_run_at for s in schedules if s.next_run_at is not None]
        if due:
            schedules_line += f"; the next tick {age(min(due), now)}"
    else:
        schedules_line = "none"
    return {"workers": workers_line, "schedules": schedules_line}


@route("GET", "/")
@view
async def queues(tenant: str) -> Response:
    # A page of queues at a time, so that a tenant with many queue
    # names gets a page whose size and cost do not grow with them.
    cursor = request.args.get("cursor") or None
    stats, next_cursor = await dashboard().engine.queues_page(tenant, cursor=cursor)
    return await page(
        "dashboard/queues.html",
        rows=queue_rows(tenant, stats),
        summary=await summary(tenant, stats),
        overview=await overview(tenant),
        statuses=[s.value for s in Status],
        paged=cursor is not None or next_cursor is not None,
        cursor=cursor,
        **_pages({}, cursor, next_cursor),
    )


@route("GET", "/queues.json")
@view
async def queues_json(tenant: str) -> Response:
    d = dashboard()
    queue = _name("queue", request.args.get("queue"))
    if queue is None:
        stats, _ = await d.engine.queues_page(tenant, cursor=request.args.get("cursor") or None)
    else:
        stats = await d.engine.queues_stats(tenant, queue)
    rows = queue_rows(tenant, stats)
    span = max((d.throughput.span(tenant, s.queue) for s in stats), default=0.0)
    answer: dict[str, Any] = {"queues": rows, "chart_note": idle_note([row["series"] for row in rows], span)}
    if queue is None:
        answer["summary"] = await summary(tenant, stats)
    return _json_answer(answer)


@route("GET", "/queues/<queue>")
@view
async def queue_page(tenant: str, queue: str) -> Response:
    _name("queue", queue)
    rows = queue_rows(tenant, await dashboard().engine.queues_stats(tenant, queue))
    if not rows:
        raise errors.NotFound(f"queue {queue} has no jobs")
    return await page("dashboard/queue.html", row=rows[0], statuses=[s.value for s in Status])


@route("POST", "/queues/<queue>/pause")
@action
async def queue_pause(tenant: str, form: Any, queue: str) -> Response:
    await dashboard().engine.queue_pause(tenant, _name("queue", queue) or "")
    return _see(f"queues/{queue}")


@route("POST", "/queues/<queue>/resume")
@action
async def queue_resume(tenant: str, form: Any, queue: str) -> Response:
    await dashboard().engine.queue_resume(tenant, _name("queue", queue) or "")
    return _see(f"queues/{queue}")


# -- jobs -------------------------------------------------------------------------


async def jobs_page(tenant: str, template: str, status: Status | None, source: str | None = None) -> Response:
    queue = _name("queue", request.args.get("queue"))
    kind = _name("kind", request.args.get("kind"))
    cursor = request.args.get("cursor") or None
    jobs, next_cursor = await dashboard().engine.jobs_list(
        tenant, queue=queue, status=status, kind=kind, limit=PAGE, cursor=cursor
    )
    filters = {"queue": queue, "status": status.value if status else None, "kind": kind}
    # Without a status filter, deleting is offered nowhere: it would
    # delete every finished job of the tenant. Each button leads to the
    # confirmation, which shows the count and acts.
    bulk = [
        (name, label, f"{PREFIX}/jobs/bulk?{_query(action=name, **filters, **{'from': source})}")
        for name, label in _BULK_ACTIONS.items()
        if (status is None and name != "delete") or status in BULK_STATUSES[name]
    ]
    done = request.args.get("done")
    count = request.args.get("count", "")
    notice = None
    if done in _BULK_DONE and count.isdigit():
        notice = f"{count} {'job' if count == '1' else 'jobs'} {_BULK_DONE[done]}"
    return await page(
        template,
        jobs=jobs,
        filters=filters,
        statuses=[s.value for s in Status],
        **_pages(filters, cursor, next_cursor),
        bulk=bulk,
        notice=notice,
    )


@route("GET", "/jobs")
@view
async def jobs(tenant: str) -> Response:
    return await jobs_page(tenant, "dashboard/jobs.html", _enum("status", Status, request.args.get("status")))


@route("GET", "/dead")
@view
async def dead(tenant: str) -> Response:
    return await jobs_page(tenant, "dashboard/dead.html", Status.FAILED, "dead")


@route("GET", "/scheduled")
@view
async def scheduled(tenant: str) -> Response:
    queue = _name("queue", request.args.get("queue"))
    jobs = await dashboard().engine.jobs_scheduled(tenant, queue=queue, limit=PAGE)
    return await page("dashboard/scheduled.html", jobs=jobs, filters={"queue": queue}, limit=PAGE)


@route("GET", "/jobs/bulk")
@view
async def jobs_bulk_confirm(tenant: str) -> Response:
    # Changes nothing: the count, and the form that confirms. The
    # counts are per queue and status; a kind filter can only lower it.
    bulk = Bulk.parse(request.args)
    stats = await dashboard().engine.queues_stats(tenant, bulk.queue)
    matching = sum(s.counts.get(status.value, 0) for s in stats for status in bulk.statuses)
    return await page(
        "dashboard/bulk.html",
        bulk=bulk,
        label=_BULK_ACTIONS[bulk.action],
        matching=matching,
        exact=bulk.kind is None,
        limit=BULK_LIMIT,
    )


@route("POST", "/jobs/bulk")
@action
async def jobs_bulk(tenant: str, form: Any) -> Response:
    bulk = Bulk.parse(form)
    # As the command line refuses a bare `qftrio jobs cancel`.
    if bulk.queue is None and form.get("every_queue") != "yes":
        raise errors.InvalidInput(
            "every_queue: no queue is chosen, so this acts on the jobs of every queue: "
            "choose a queue, or tick \"in every queue\" to confirm"
        )
    count = await dashboard().engine.jobs_bulk(
        tenant, bulk.action, queue=bulk.queue, status=bulk.status, kind=bulk.kind, limit=BULK_LIMIT
    )
    return redirect(bulk.back(done=bulk.action, count=str(count)), 303)


@route("GET", "/jobs/<job_id>")
@view
async def job_page(tenant: str, job_id: str) -> Response:
    job = await dashboard().engine.job_get(tenant, _job_id(job_id))
    return await page(
        "dashboard/job.html",
        job=job,
        payload=shown(job.payload),
        result=None if job.result is None else shown(job.result),
        failures=job.errors[-ERRORS_SHOWN:],
        error_chars=ERROR_CHARS,
        shown_chars=SHOWN_CHARS,
        events=timeline(job),
    )


@route("GET", "/jobs/<job_id>/json")
@view
async def job_json(tenant: str, job_id: str) -> Response:
    # The whole job, as the API's GET /api/v1/jobs/{id} answers it: a
    # page shows only the start of a big payload, result or error.
    return _json_answer((await dashboard().engine.job_get(tenant, _job_id(job_id))).to_wire())


@route("POST", "/jobs/<job_id>/retry")
@action
async def job_retry(tenant: str, form: Any, job_id: str) -> Response:
    job = await dashboard().engine.job_retry(tenant, _job_id(job_id))
    return _see(f"jobs/{urllib.parse.quote(job.id, safe='')}")


@route("POST", "/jobs/<job_id>/cancel")
@action
async def job_cancel(tenant: str, form: Any, job_id: str) -> Response:
    job = await dashboard().engine.job_cancel(tenant, _job_id(job_id))
    return _see(f"jobs/{urllib.parse.quote(job.id, safe='')}")


# -- workflows and workers -----------------------------------------------------------


@route("GET", "/workflows")
@view
async def workflows(tenant: str) -> Response:
    status = _enum("status", WorkflowStatus, request.args.get("status"))
    cursor = request.args.get("cursor") or None
    items, next_cursor = await dashboard().engine.workflows_list(tenant, status=status, limit=PAGE, cursor=cursor)
    filters = {"status": status.value if status else None}
    return await page(
        "dashboard/workflows.html",
        workflows=items,
        filters=filters,
        statuses=[s.value for s in WorkflowStatus],
        **_pages(filters, cursor, next_cursor),
    )


@route("GET", "/workflows/<workflow_id>")
@view
async def workflow_page(tenant: str, workflow_id: str) -> Response:
    workflow = await dashboard().engine.workflow_get(tenant, _job_id(workflow_id))
    return await page(
        "dashboard/workflow.html", workflow=workflow, context=shown(workflow.context), shown_chars=SHOWN_CHARS
    )


@route("GET", "/workflows/<workflow_id>/json")
@view
async def workflow_json(tenant: str, workflow_id: str) -> Response:
    return _json_answer((await dashboard().engine.workflow_get(tenant, _job_id(workflow_id))).to_wire())


@route("POST", "/workflows/<workflow_id>/cancel")
@action
async def workflow_cancel(tenant: str, form: Any, workflow_id: str) -> Response:
    workflow = await dashboard().engine.workflow_cancel(tenant, _job_id(workflow_id))
    return _see(f"workflows/{urllib.parse.quote(workflow.id, safe='')}")


@route("GET", "/workers")
@view
async def workers(tenant: str) -> Response:
    engine = dashboard().engine
    return await page(
        "dashboard/workers.html",
        workers=await engine.workers(tenant),
        seen_minutes=round(engine.WORKERS_SEEN_SECS / 60),
        shown_ids=WORKER_IDS_SHOWN,
    )


# -- schedules ------------------------------------------------------------------------


@route("GET", "/schedules")
@view
async def schedules(tenant: str) -> Response:
    cursor = _name("cursor", request.args.get("cursor"))
    found, next_cursor = await dashboard().engine.schedules_list(tenant, limit=100, cursor=cursor)
    return await page(
        "dashboard/schedules.html",
        schedules=found,
        first=cursor is None,
        next_url=None if next_cursor is None else f"{PREFIX}/schedules?{_query(cursor=next_cursor)}",
    )


def _schedule_action(verb: str) -> View:
    """``POST /schedules/<name>/<verb>``: the engine's ``schedule_<verb>``
    on the schedule, then back to the list."""

    async def act(tenant: str, form: Any, name: str) -> Response:
        await getattr(dashboard().engine, f"schedule_{verb}")(tenant, _name("schedule", name) or "")
        return _see("schedules")

    act.__name__ = f"schedule_{verb}"
    return act


for _verb in ("pause", "resume", "trigger"):
    route("POST", f"/schedules/<name>/{_verb}")(action(_schedule_action(_verb)))


@route("GET", "/<path:unknown>")
@view
async def not_found(tenant: str, unknown: str) -> Response:
    raise errors.NotFound(f"no dashboard page at {request.path}")
