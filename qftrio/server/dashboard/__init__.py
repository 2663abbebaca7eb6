"""The web dashboard: server-rendered pages for operators under ``/dashboard/``.

Every page calls the engine's operations directly (an indexed query with a
limit each); the dashboard adds pages, not queries.

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

import collections
import dataclasses
import hashlib
import hmac
import json
import pathlib
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from quart import Blueprint, Response, g, redirect, render_template, request, send_from_directory
from quart_schema import hide
from werkzeug.exceptions import HTTPException

from ... import errors
from ...models import MAX_JOB_ID, Job, QueueStats, Status, WorkflowStatus, format_time, valid_name
from ..auth import Credentials
from ..engine import Engine
from ..store.base import BulkAction, DashboardSession
from ..transitions import BULK_STATUSES, bulk_statuses

__all__ = ["create_dashboard"]

PREFIX = "/dashboard"
STATIC = pathlib.Path(__file__).parent / "static"
COOKIE = "qftrio_dashboard"
MAX_FORM_BYTES = 16 * 1024
#: Jobs, workflows per page.
PAGE = 50
#: How far back the completed-per-second rate looks.
RATE_WINDOW_SECS = 60.0
#: Samples kept per queue for the throughput chart.
CHART_POINTS = 60
#: Jobs a bulk action changes at most per click.
BULK_LIMIT = 10_000
#: How far back the queues page's "failed in the last hour" looks.
FAILED_WINDOW_SECS = 3600.0
#: Characters of a payload, result, error or context a page shows; the rest
#: is one link away (the whole job as JSON), so that no page is megabytes.
SHOWN_CHARS = 16 * 1024
#: Characters of one failed attempt's error on a job's page, and of a
#: job's last error in a list.
ERROR_CHARS = 2000
LIST_ERROR_CHARS = 200
#: Failed attempts a job's page lists (the latest).
ERRORS_SHOWN = 20
#: Held jobs the workers page links per worker (the rest as a count).
WORKER_IDS_SHOWN = 5

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


def csrf_token(session: DashboardSession) -> str:
    """The CSRF token of *session*, derived from its own secret."""
    return hmac.new(session.secret.encode(), b"qftrio-dashboard-csrf", hashlib.sha256).hexdigest()


class Throughput:
    """Completed jobs per second, per tenant and queue, from the samples of
    the completed count this server's pages have read.

    Counts are exact and shared by every server (they come from the store),
    so any server's samples give the rate; a server only keeps the last
    :data:`CHART_POINTS` samples of each queue, one a second at most.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: dict[tuple[str, str], collections.deque[tuple[float, int]]] = {}

    def observe(self, tenant: str, stats: QueueStats) -> tuple[float | None, list[float]]:
        """Record the queue's completed count; returns the rate over the
        last :data:`RATE_WINDOW_SECS` (None until two samples) and the
        chart's series of rates between successive samples."""
        now = self._clock()
        samples = self._samples.setdefault((tenant, stats.queue), collections.deque(maxlen=CHART_POINTS))
        completed = stats.counts.get(Status.COMPLETED.value, 0)
        if not samples or now - samples[-1][0] >= 1.0:
            samples.append((now, completed))
        since = next((s for s in samples if now - s[0] <= RATE_WINDOW_SECS), None)
        rate = None
        if since is not None and now > since[0]:
            # Deleting completed jobs lowers the count: never a negative rate.
            rate = max(0.0, (completed - since[1]) / (now - since[0]))
        pairs = zip(samples, list(samples)[1:])
        series = [max(0.0, (b[1] - a[1]) / (b[0] - a[0])) for a, b in pairs]
        return rate, series


def _age(ts: float | None, now: float) -> str:
    """A short relative time: ``12s``, ``3m 04s``, ``2h 05m``, ``4d 03h``."""
    if ts is None:
        return "–"
    secs = now - ts
    future = secs < 0
    secs = abs(secs)
    if secs < 60:
        text = f"{secs:.0f}s"
    elif secs < 3600:
        text = f"{secs // 60:.0f}m {secs % 60:02.0f}s"
    elif secs < 86400:
        text = f"{secs // 3600:.0f}h {secs % 3600 // 60:02.0f}m"
    else:
        text = f"{secs // 86400:.0f}d {secs % 86400 // 3600:02.0f}h"
    return f"in {text}" if future else f"{text} ago"


def _time(ts: float | None) -> str:
    text = format_time(ts)
    return "–" if text is None else text.replace("T", " ")[:19] + " UTC"


def _rate(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:.1f}"


def timeline(job: Job) -> list[tuple[float, str]]:
    """A job's transitions as far as the job itself records them, oldest
    first: enqueued, when it became available, each failed attempt, and
    where it is now."""
    events: list[tuple[float, str]] = [(job.created_at, "enqueued")]
    failed = {entry.attempt for entry in job.errors}
    for entry in job.errors:
        if job.status is Status.FAILED and entry.attempt == job.attempt:
            events.append((entry.at, f"attempt {entry.attempt} failed; no attempt left (dead letter)"))
        else:
            events.append((entry.at, f"attempt {entry.attempt} failed"))
    if job.status is Status.PENDING:
        if job.scheduled_at > job.created_at:
            events.append((job.scheduled_at, f"available for attempt {job.attempt + 1}"))
    elif job.status is Status.RUNNING:
        worker = job.worker_id or "a worker"
        events.append((job.updated_at, f"attempt {job.attempt} leased by {worker}"))
        if job.locked_until is not None:
            events.append((job.locked_until, "lease deadline"))
    elif job.status is Status.COMPLETED:
        events.append((job.updated_at, f"completed on attempt {job.attempt}"))
    elif job.status is Status.CANCELLED:
        events.append((job.updated_at, "cancelled"))
    elif job.attempt not in failed:
        events.append((job.updated_at, "failed"))
    events.sort(key=lambda event: event[0])
    return events


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def clip(text: str | None, limit: int = LIST_ERROR_CHARS) -> str:
    """*text* cut to *limit* characters, an ellipsis saying it was cut."""
    if text is None:
        return ""
    return text if len(text) <= limit else text[:limit] + "…"


def _shown(value: Any) -> tuple[str, int]:
    """JSON as a page shows it: pretty, its first :data:`SHOWN_CHARS`
    characters, and how many it leaves out."""
    text = _pretty(value)
    return text[:SHOWN_CHARS], max(0, len(text) - SHOWN_CHARS)


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


def create_dashboard(engine: Engine, credentials: Credentials) -> Blueprint:
    """The dashboard's blueprint, serving *engine* to the tenants of
    *credentials*."""
    bp = Blueprint(
        "dashboard",
        __name__,
        url_prefix=PREFIX,
        template_folder="templates",
    )
    throughput = Throughput()

    async def signed_in() -> DashboardSession | None:
        """The request's valid session, if it has one (read once a request)."""
        if "qftrio_session" not in g:
            session_id = request.cookies.get(COOKIE, "")
            g.qftrio_session = await engine.session_get(session_id, credentials.tokens_of) if session_id else None
        session: DashboardSession | None = g.qftrio_session
        return session

    async def page(template: str, status: int = 200, **context: Any) -> Response:
        try:
            session = await signed_in()
        except errors.ApiError:  # the store is down: the error page shows no session
            session = None
        body = await render_template(
            template,
            tenant=session.tenant if session else None,
            csrf=csrf_token(session) if session else "",
            now=engine.clock(),
            age=_age,
            time=_time,
            rate=_rate,
            clip=clip,
            **context,
        )
        return Response(body, status=status, content_type="text/html; charset=utf-8")

    def view(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        """A page for signed-in tenants: without a session, GETs go to the
        sign-in form; the view is called with the tenant."""

        async def wrapper(**params: str) -> Response:
            session = await signed_in()
            if session is None:
                return redirect(f"{PREFIX}/signin?{_query(next=request.full_path.rstrip('?'))}", 303)
            return await fn(session.tenant, **params)

        wrapper.__name__ = fn.__name__
        return wrapper

    def action(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        """A POST of a signed-in tenant carrying the session's CSRF token."""

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

    @bp.get("/static/<path:filename>")
    async def static(filename: str) -> Response:
        return await send_from_directory(STATIC, filename)

    @bp.before_request
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

    @bp.after_request
    async def security_headers(response: Response) -> Response:
        for name, value in SECURITY_HEADERS.items():
            response.headers[name] = value
        return response

    @bp.errorhandler(errors.ApiError)
    async def api_error(exc: errors.ApiError) -> Response:
        title = ERROR_TITLES.get(exc.status_code, "Something went wrong")
        return await page("dashboard/error.html", exc.status_code, error=exc, title=title)

    @bp.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        return await api_error(errors.error_for_status(exc.code or 500, None, exc.description or exc.name))

    # -- signing in and out ------------------------------------------------


    def _next(value: str | None) -> str:
        # Only a path of the dashboard itself: never an open redirect, and
        # only printable ASCII with no backslash, so nothing can break out
        # of the Location header or be read as another host.
        if (
            value
            and value.startswith(PREFIX + "/")
            and all(" " < c < "\x7f" and c != "\\" for c in value)
        ):
            return value
        return f"{PREFIX}/"

    @bp.get("/signin")
    async def signin_form() -> Response:
        return await page("dashboard/signin.html", next=_next(request.args.get("next")), problem=None)

    @bp.post("/signin")
    async def signin() -> Response:
        form = await request.form
        token = form.get("token", "").strip()
        target = _next(form.get("next"))
        try:
            tenant = credentials.tenant(f"Bearer {token}")
        except errors.ApiError as exc:  # 401, or 429 (the front adds Retry-After)
            return await page("dashboard/signin.html", exc.status_code, next=target, problem=exc.message)
        # A session signed in over another one replaces it.
        await engine.session_delete(request.cookies.get(COOKIE, ""))
        session_id, _ = await engine.session_create(tenant, token)
        response = redirect(target, 303)
        response.set_cookie(
            COOKIE, session_id, path=PREFIX, httponly=True, samesite="Strict", secure=_over_tls()
        )
        return response

    @bp.post("/signout")
    @action
    async def signout(tenant: str, form: Any) -> Response:
        await engine.session_delete(request.cookies.get(COOKIE, ""))
        response = redirect(f"{PREFIX}/signin", 303)
        response.delete_cookie(
            COOKIE, path=PREFIX, httponly=True, samesite="Strict", secure=_over_tls()
        )
        return response

    # -- queues ------------------------------------------------------------

    def queue_rows(tenant: str, stats: list[QueueStats]) -> list[dict[str, Any]]:
        now = engine.clock()
        rows = []
        for s in stats:
            rate, series = throughput.observe(tenant, s)
            rows.append(
                {
                    "queue": s.queue,
                    "counts": {st.value: s.counts.get(st.value, 0) for st in Status},
                    "oldest_ready": _age(s.oldest_ready_at, now),
                    "next_available": _age(s.next_available_at, now),
                    # ready jobs flow control holds back, counted up to a cap
                    "held_concurrency": str(s.held_concurrency),
                    "held_rate_limit": str(s.held_rate_limit),
                    "rate": _rate(rate),
                    "paused": s.paused,
                    "series": series,
                }
            )
        return rows

    async def summary(tenant: str, stats: list[QueueStats]) -> dict[str, str]:
        """The queues page's summary row: jobs pending (and of them,
        scheduled) and running in the queues of the page, dead letters of the
        last hour, the oldest ready job's wait."""
        now = engine.clock()
        failed, more = await engine.jobs_failed_since(tenant, now - FAILED_WINDOW_SECS, limit=PAGE)
        ready = [s.oldest_ready_at for s in stats if s.oldest_ready_at is not None]
        return {
            "pending": str(sum(s.counts.get(Status.PENDING.value, 0) for s in stats)),
            "running": str(sum(s.counts.get(Status.RUNNING.value, 0) for s in stats)),
            # of the pending, those whose time has not come; counted up to a cap per queue
            "scheduled": str(sum(s.scheduled for s in stats)),
            "failed_last_hour": f"{failed}+" if more else str(failed),
            "oldest_ready": _age(min(ready, default=None), now),
        }

    @bp.get("/")
    @view
    async def queues(tenant: str) -> Response:
        # A page of queues at a time, so that a tenant with many queue
        # names gets a page whose size and cost do not grow with them.
        cursor = request.args.get("cursor") or None
        stats, next_cursor = await engine.queues_page(tenant, cursor=cursor)
        return await page(
            "dashboard/queues.html",
            rows=queue_rows(tenant, stats),
            summary=await summary(tenant, stats),
            statuses=[s.value for s in Status],
            paged=cursor is not None or next_cursor is not None,
            cursor=cursor,
            **_pages({}, cursor, next_cursor),
        )

    @bp.get("/queues.json")
    @view
    async def queues_json(tenant: str) -> Response:
        queue = _name("queue", request.args.get("queue"))
        if queue is None:
            stats, _ = await engine.queues_page(tenant, cursor=request.args.get("cursor") or None)
        else:
            stats = await engine.queues_stats(tenant, queue)
        answer: dict[str, Any] = {"queues": queue_rows(tenant, stats)}
        if queue is None:
            answer["summary"] = await summary(tenant, stats)
        return _json_answer(answer)

    @bp.get("/queues/<queue>")
    @view
    async def queue_page(tenant: str, queue: str) -> Response:
        _name("queue", queue)
        rows = queue_rows(tenant, await engine.queues_stats(tenant, queue))
        if not rows:
            raise errors.NotFound(f"queue {queue} has no jobs")
        return await page("dashboard/queue.html", row=rows[0], statuses=[s.value for s in Status])

    @bp.post("/queues/<queue>/pause")
    @action
    async def queue_pause(tenant: str, form: Any, queue: str) -> Response:
        await engine.queue_pause(tenant, _name("queue", queue) or "")
        return _see(f"queues/{queue}")

    @bp.post("/queues/<queue>/resume")
    @action
    async def queue_resume(tenant: str, form: Any, queue: str) -> Response:
        await engine.queue_resume(tenant, _name("queue", queue) or "")
        return _see(f"queues/{queue}")

    # -- jobs --------------------------------------------------------------

    async def jobs_page(tenant: str, template: str, status: Status | None, source: str | None = None) -> Response:
        queue = _name("queue", request.args.get("queue"))
        kind = _name("kind", request.args.get("kind"))
        cursor = request.args.get("cursor") or None
        jobs, next_cursor = await engine.jobs_list(
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

    @bp.get("/jobs")
    @view
    async def jobs(tenant: str) -> Response:
        return await jobs_page(tenant, "dashboard/jobs.html", _enum("status", Status, request.args.get("status")))

    @bp.get("/dead")
    @view
    async def dead(tenant: str) -> Response:
        return await jobs_page(tenant, "dashboard/dead.html", Status.FAILED, "dead")

    @bp.get("/scheduled")
    @view
    async def scheduled(tenant: str) -> Response:
        queue = _name("queue", request.args.get("queue"))
        jobs = await engine.jobs_scheduled(tenant, queue=queue, limit=PAGE)
        return await page("dashboard/scheduled.html", jobs=jobs, filters={"queue": queue}, limit=PAGE)

    @bp.get("/jobs/bulk")
    @view
    async def jobs_bulk_confirm(tenant: str) -> Response:
        # Changes nothing: the count, and the form that confirms. The
        # counts are per queue and status; a kind filter can only lower it.
        bulk = Bulk.parse(request.args)
        stats = await engine.queues_stats(tenant, bulk.queue)
        matching = sum(s.counts.get(status.value, 0) for s in stats for status in bulk.statuses)
        return await page(
            "dashboard/bulk.html",
            bulk=bulk,
            label=_BULK_ACTIONS[bulk.action],
            matching=matching,
            exact=bulk.kind is None,
            limit=BULK_LIMIT,
        )

    @bp.post("/jobs/bulk")
    @action
    async def jobs_bulk(tenant: str, form: Any) -> Response:
        bulk = Bulk.parse(form)
        # As the command line refuses a bare `qftrio jobs cancel`.
        if bulk.queue is None and form.get("every_queue") != "yes":
            raise errors.InvalidInput(
                "every_queue: no queue is chosen, so this acts on the jobs of every queue: "
                "choose a queue, or tick \"in every queue\" to confirm"
            )
        count = await engine.jobs_bulk(
            tenant, bulk.action, queue=bulk.queue, status=bulk.status, kind=bulk.kind, limit=BULK_LIMIT
        )
        return redirect(bulk.back(done=bulk.action, count=str(count)), 303)

    @bp.get("/jobs/<job_id>")
    @view
    async def job_page(tenant: str, job_id: str) -> Response:
        job = await engine.job_get(tenant, _job_id(job_id))
        return await page(
            "dashboard/job.html",
            job=job,
            payload=_shown(job.payload),
            result=None if job.result is None else _shown(job.result),
            failures=job.errors[-ERRORS_SHOWN:],
            error_chars=ERROR_CHARS,
            shown_chars=SHOWN_CHARS,
            events=timeline(job),
        )

    @bp.get("/jobs/<job_id>/json")
    @view
    async def job_json(tenant: str, job_id: str) -> Response:
        # The whole job, as the API's GET /api/v1/jobs/{id} answers it: a
        # page shows only the start of a big payload, result or error.
        return _json_answer((await engine.job_get(tenant, _job_id(job_id))).to_wire())

    @bp.post("/jobs/<job_id>/retry")
    @action
    async def job_retry(tenant: str, form: Any, job_id: str) -> Response:
        job = await engine.job_retry(tenant, _job_id(job_id))
        return _see(f"jobs/{urllib.parse.quote(job.id, safe='')}")

    @bp.post("/jobs/<job_id>/cancel")
    @action
    async def job_cancel(tenant: str, form: Any, job_id: str) -> Response:
        job = await engine.job_cancel(tenant, _job_id(job_id))
        return _see(f"jobs/{urllib.parse.quote(job.id, safe='')}")

    # -- workflows and workers ---------------------------------------------

    @bp.get("/workflows")
    @view
    async def workflows(tenant: str) -> Response:
        status = _enum("status", WorkflowStatus, request.args.get("status"))
        cursor = request.args.get("cursor") or None
        items, next_cursor = await engine.workflows_list(tenant, status=status, limit=PAGE, cursor=cursor)
        filters = {"status": status.value if status else None}
        return await page(
            "dashboard/workflows.html",
            workflows=items,
            filters=filters,
            statuses=[s.value for s in WorkflowStatus],
            **_pages(filters, cursor, next_cursor),
        )

    @bp.get("/workflows/<workflow_id>")
    @view
    async def workflow_page(tenant: str, workflow_id: str) -> Response:
        workflow = await engine.workflow_get(tenant, _job_id(workflow_id))
        return await page(
            "dashboard/workflow.html", workflow=workflow, context=_shown(workflow.context), shown_chars=SHOWN_CHARS
        )

    @bp.get("/workflows/<workflow_id>/json")
    @view
    async def workflow_json(tenant: str, workflow_id: str) -> Response:
        return _json_answer((await engine.workflow_get(tenant, _job_id(workflow_id))).to_wire())

    @bp.post("/workflows/<workflow_id>/cancel")
    @action
    async def workflow_cancel(tenant: str, form: Any, workflow_id: str) -> Response:
        workflow = await engine.workflow_cancel(tenant, _job_id(workflow_id))
        return _see(f"workflows/{urllib.parse.quote(workflow.id, safe='')}")

    @bp.get("/workers")
    @view
    async def workers(tenant: str) -> Response:
        return await page(
            "dashboard/workers.html",
            workers=await engine.workers(tenant),
            seen_minutes=round(engine.WORKERS_SEEN_SECS / 60),
            shown_ids=WORKER_IDS_SHOWN,
        )

    # -- schedules ------------------------------------------------------------

    @bp.get("/schedules")
    @view
    async def schedules(tenant: str) -> Response:
        cursor = _name("cursor", request.args.get("cursor"))
        found, next_cursor = await engine.schedules_list(tenant, limit=100, cursor=cursor)
        return await page(
            "dashboard/schedules.html",
            schedules=found,
            first=cursor is None,
            next_url=None if next_cursor is None else f"{PREFIX}/schedules?{_query(cursor=next_cursor)}",
        )

    def schedule_action(verb: str, act: Callable[[str, str], Awaitable[Any]]) -> None:
        """``POST /schedules/<name>/<verb>``: *act* on the schedule, back to the list."""

        async def fn(tenant: str, form: Any, name: str) -> Response:
            await act(tenant, _name("schedule", name) or "")
            return _see("schedules")

        fn.__name__ = f"schedule_{verb}"
        bp.post(f"/schedules/<name>/{verb}")(action(fn))

    for verb, act in (
        ("pause", engine.schedule_pause), ("resume", engine.schedule_resume), ("trigger", engine.schedule_trigger)
    ):  # fmt: skip
        schedule_action(verb, act)

    @bp.get("/<path:unknown>")
    @view
    async def not_found(tenant: str, unknown: str) -> Response:
        raise errors.NotFound(f"no dashboard page at {request.path}")

    @bp.record_once
    def hide_from_the_document(state: Any) -> None:
        # Pages, not API routes: /openapi.json documents the API only.
        for endpoint, fn in state.app.view_functions.items():
            if endpoint.startswith(f"{bp.name}."):
                hide(fn)

    return bp

