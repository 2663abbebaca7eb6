"""Routes declared once, and the one envelope every route is answered in.

A :class:`Route` says what a route is: its method and path, who may call it,
the models of its body, query string and path parameters, and what it
answers. :class:`Envelope` does for every route what the declaration implies,
in one place: authorise the caller, cap and read the body, parse body, query
and path into their models, and map every error to its JSON answer. A
route's handler only calls the engine.

The same declarations give ``/openapi.json`` (see :mod:`qftrio.server.openapi`)
and the router: :class:`Router` finds a route by method and path, or the
methods a path allows.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NamedTuple, TypeVar
from urllib.parse import parse_qsl

import pydantic

from .. import errors
from ..models import NAME_PATTERN
from .auth import Credentials
from .engine import Engine

__all__ = ["Call", "Caller", "ChunkReceiver", "Handler", "Route", "Router", "Envelope", "Disconnected", "Reply", "parse_body", "parse_query"]

log = logging.getLogger("qftrio.server")

M = TypeVar("M", bound=pydantic.BaseModel)
Reply = tuple[int, Any]

#: Who may call a route: the worker token, a tenant token (the handler gets
#: the tenant), the metrics token (anyone when none is set), or anyone.
Caller = Literal["worker", "tenant", "metrics", "anyone"]


@dataclasses.dataclass(slots=True)
class Call:
    """One request, parsed: what a handler gets."""

    tenant: str | None
    body: Any
    query: Any
    path: dict[str, str]


Handler = Callable[[Engine, Call], Awaitable[Reply]]

#: The next chunk of a request's body, and whether more follow.
ChunkReceiver = Callable[[], Awaitable[tuple[bytes, bool]]]


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """A route, declared once.

    Args:
        method: the HTTP method.
        path: the path, Quart's syntax (``/api/v1/jobs/<job_id>``).
        handler: answers a parsed call with ``(status, payload)`` (``None``
            for no body), or raises :class:`~qftrio.errors.ApiError`.
        caller: who may call it.
        answers: each success status and the model of its body (``None``
            for none).
        errors: the error statuses the handler itself may answer; those of
            the envelope (credentials, body, query and path) are added.
        body: the body's model, or ``None`` for a route that reads none.
        query: the query string's model; ``None`` for a route that takes no
            parameter (any given is refused).
        path_params: the validators of the path parameters that are more
            than opaque ids (a queue's name), by parameter.
        waits: whether a call may wait long (a long poll); its answer is then
            abandoned when the client disconnects.
        media: the content type of a success answer that is not JSON (the
            handler's payload is then its bytes).
        documented: whether ``/openapi.json`` lists it.
    """

    method: str
    path: str
    handler: Handler
    caller: Caller
    answers: dict[int, type[pydantic.BaseModel] | None]
    errors: tuple[int, ...] = ()
    body: type[pydantic.BaseModel] | None = None
    query: type[pydantic.BaseModel] | None = None
    path_params: dict[str, pydantic.TypeAdapter[Any]] = dataclasses.field(default_factory=dict)
    waits: Callable[[Call], bool] | None = None
    media: str | None = None
    documented: bool = True

    @property
    def name(self) -> str:
        return self.handler.__name__

    def path_names(self) -> list[str]:
        """The path's parameters, in order."""
        return re.findall(r"<(\w+)>", self.path)

    def statuses(self) -> list[int]:
        """Every status the route answers, in order."""
        # 422 for an unknown query parameter, on every route.
        found = set(self.answers) | set(self.errors) | {422, 503}
        if self.caller in ("worker", "tenant"):
            found |= {401, 403, 429}  # 429: the client's address gave too many wrong credentials
        elif self.caller == "metrics":
            found |= {401, 429}
        if self.body is not None:
            found |= {400, 413}
        return sorted(found)


# -- routing -----------------------------------------------------------------


class Router:
    """Finds the route of a method and path."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self._static: dict[str, list[Route]] = {}
        self._patterns: list[tuple[re.Pattern[str], Route]] = []
        for route in routes:
            if "<" in route.path:
                regex = "^" + re.sub(r"<(\w+)>", r"(?P<\1>[^/]+)", route.path) + "$"
                self._patterns.append((re.compile(regex), route))
            else:
                self._static.setdefault(route.path, []).append(route)

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | list[str] | None:
        """The route and its path parameters (a ``GET`` route answers
        ``HEAD`` too); or, when routes have the path but not the method, the
        methods they allow; or ``None``."""
        wanted = "GET" if method == "HEAD" else method
        static = self._static.get(path)
        if static is not None:
            # A path of its own shadows the patterns it also matches
            # (``/api/v1/jobs/batch`` is not a job id).
            for route in static:
                if route.method == wanted:
                    return route, {}
            return _allowed(static)
        found: list[Route] = []
        for pattern, route in self._patterns:
            m = pattern.match(path)
            if m is not None:
                if route.method == wanted:
                    return route, m.groupdict()
                found.append(route)
        return _allowed(found) if found else None


def _allowed(routes: list[Route]) -> list[str]:
    methods = {route.method for route in routes}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


# -- parsing -------------------------------------------------------------------


def _field_errors(exc: pydantic.ValidationError, where: str) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        name = ".".join(str(p) for p in err["loc"]) or where
        if err["type"] == "string_pattern_mismatch":
            message = f"must match {NAME_PATTERN}"
        elif err["type"] == "extra_forbidden":
            message = f"unknown {'field' if where == 'body' else 'parameter'}"
        else:
            message = err["msg"]
        parts.append(f"{name}: {message}")
    return "; ".join(parts)


def parse_body(model: type[M], raw: bytes) -> M:
    """*raw* parsed into *model* (an empty body counts as ``{}``): 400 for
    malformed JSON, 422 naming every field that breaks the schema, and 422
    naming a number qftrio cannot hold."""
    if not raw.strip():
        raw = b"{}"
    try:
        parsed = model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        for err in exc.errors(include_url=False):
            if err["type"] == "json_invalid":
                if "number out of range" in err["msg"]:
                    _reject_unheld_numbers(raw)
                raise errors.BadRequest("the body is not valid JSON", code="malformed_json") from None
        raise errors.InvalidInput(_field_errors(exc, "body")) from None
    if _may_hold_unheld_number(raw):
        _reject_unheld_numbers(raw)
    return parsed


def parse_query(model: type[M] | None, query_string: bytes) -> M | None:
    """A query string parsed into *model*: 422 naming an unknown, repeated
    or invalid parameter. With no model, any parameter is unknown."""
    if not query_string:
        return None if model is None else model()
    try:
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True, errors="strict")
    except (UnicodeError, ValueError):
        raise errors.InvalidInput("query: not a valid query string") from None
    values: dict[str, str] = {}
    for name, value in pairs:
        if name in values:
            raise errors.InvalidInput(f"{name}: given more than once")
        values[name] = value
    if model is None:
        if values:
            raise errors.InvalidInput("; ".join(f"{name}: unknown parameter" for name in values))
        return None
    try:
        return model.model_validate(values)
    except pydantic.ValidationError as exc:
        raise errors.InvalidInput(_field_errors(exc, "query")) from None


# JSON has no NaN or Infinity, and qftrio holds no number beyond a double's
# range nor an integer of more than 4,300 digits (Python's limit for reading
# one), but the parser takes the first and refuses the last without saying
# where. A body holding one needs one of these in its text (a number with a
# three-digit exponent, or 309 digits in a row); only then is it read again,
# number by number, to name the field. Each test is linear in the body's
# size. A number starts after ":", "[" or ",": a bare "4e123" inside a UUID
# (in almost every report) is not one.
# The regular expression scans slowly for its first character, so it runs
# only on a body whose digits, all read as "0", show an exponent of three.
_EXPONENT_3 = re.compile(rb"[:\[,]\s*-?\d+(?:\.\d+)?[eE][+-]?\d{3}")
_EXPONENTS_3 = tuple(e + sign + b"000" for e in (b"e", b"E") for sign in (b"", b"+", b"-"))
_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 309
_MAX_INT_DIGITS = 4300


def _may_hold_unheld_number(raw: bytes) -> bool:
    if b"NaN" in raw or b"Infinity" in raw:
        return True
    zeros = raw.translate(_DIGITS_AS_ZEROS)
    return _LONG_RUN in zeros or (
        any(exponent in zeros for exponent in _EXPONENTS_3) and _EXPONENT_3.search(raw) is not None
    )


class _Unheld:
    """Stands for a number qftrio cannot hold while the body is re-read."""

    def __init__(self, why: str) -> None:
        self.why = why


def _reject_unheld_numbers(raw: bytes) -> None:
    """Raise 422 naming the first number in *raw* qftrio cannot hold."""

    def integer(text: str) -> Any:
        if len(text.lstrip("-")) > _MAX_INT_DIGITS:
            return _Unheld(f"an integer of more than {_MAX_INT_DIGITS} digits")
        return int(text)

    def number(text: str) -> Any:
        value = float(text)
        if not math.isfinite(value):
            return _Unheld(f"{text[:40]} is beyond the range of a JSON number")
        return value

    def constant(name: str) -> Any:
        return _Unheld(f"{name} is not a JSON number")

    try:
        document = json.loads(raw, parse_constant=constant, parse_float=number, parse_int=integer)
    except ValueError:
        raise errors.BadRequest("the body is not valid JSON", code="malformed_json") from None
    found = _find_unheld(document, [])
    if found is not None:
        where, why = found
        raise errors.InvalidInput(f"{'.'.join(where) or 'body'}: {why}")


def _find_unheld(value: Any, where: list[str]) -> tuple[list[str], str] | None:
    if isinstance(value, _Unheld):
        return where, value.why
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _find_unheld(item, [*where, str(key)])
        if found is not None:
            return found
    return None


# -- the envelope ----------------------------------------------------------------


class Disconnected(Exception):
    """The client went away before its request was read or answered."""


class Answer(NamedTuple):
    """A route's answer: its status and payload, whether the connection
    must close after it, and for a ``429`` the seconds of ``Retry-After``
    the handler named."""

    status: int
    payload: Any
    close: bool = False
    retry_after: float | None = None


class Envelope:
    """Authorisation, body cap, parsing and error mapping, for every route."""

    def __init__(self, engine: Engine, credentials: Credentials, *, max_body_bytes: int) -> None:
        self.engine = engine
        self.credentials = credentials
        self.max_body_bytes = max_body_bytes

    async def prepare(
        self,
        route: Route,
        params: dict[str, str],
        *,
        authorization: str | None,
        content_length: str | None,
        query_string: bytes,
        receive_chunk: ChunkReceiver,
    ) -> Call:
        """The parsed call; raises :class:`~qftrio.errors.ApiError` for what
        refuses it (the credential first: a refusal leaves the body unread)."""
        tenant = None
        if route.caller == "tenant":
            tenant = self.credentials.tenant(authorization)
        elif route.caller == "worker":
            self.credentials.worker(authorization)
        elif route.caller == "metrics":
            self.credentials.metrics(authorization)
        for name, adapter in route.path_params.items():
            try:
                adapter.validate_python(params[name])
            except pydantic.ValidationError as exc:
                raise errors.InvalidInput(_field_errors(exc, name)) from None
        query = parse_query(route.query, query_string) if query_string or route.query is not None else None
        body = None
        if route.body is not None:
            body = parse_body(route.body, await self._read_body(content_length, receive_chunk))
        return Call(tenant=tenant, body=body, query=query, path=params)

    async def run(self, route: Route, call: Call) -> Answer:
        """The handler's answer to *call*, errors mapped."""
        try:
            status, payload = await route.handler(self.engine, call)
        except Exception as exc:
            return self.refusal(route, exc)
        return Answer(status, payload)

    async def answer(self, route: Route, params: dict[str, str], **request: Any) -> Answer:
        """:meth:`prepare` then :meth:`run`."""
        try:
            call = await self.prepare(route, params, **request)
        except Exception as exc:
            return self.refusal(route, exc)
        return await self.run(route, call)

    def refusal(self, route: Route, exc: Exception) -> Answer:
        """The answer to *exc*, raised while answering *route* (call it in
        the ``except`` block: a bug is logged with its traceback)."""
        if isinstance(exc, errors.ApiError):
            # A 413 leaves the body unread: the connection cannot carry
            # another request.
            retry_after = exc.retry_after if isinstance(exc, errors.TooManyRequests) else None
            return Answer(exc.status_code, exc.to_wire(), isinstance(exc, errors.PayloadTooLarge), retry_after)
        log.exception("request failed: %s %s", route.method, route.path)
        return Answer(500, errors.ApiError("internal error").to_wire())

    async def _read_body(self, declared: str | None, receive_chunk: ChunkReceiver) -> bytes:
        cap = self.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise errors.PayloadTooLarge(f"the request body is larger than {cap} bytes")
        parts: list[bytes] = []
        size = 0
        more = True
        while more:
            chunk, more = await receive_chunk()
            size += len(chunk)
            if size > cap:
                raise errors.PayloadTooLarge(f"the request body is larger than {cap} bytes")
            parts.append(chunk)
        return b"".join(parts)
