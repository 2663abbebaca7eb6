"""Request bodies and query strings: pydantic models the server validates
with and the client builds its calls from, so both sides agree on every
field; what no store keeps (U+0000) and the rules of a job's headers."""

from __future__ import annotations

import datetime as _dt
import re
import typing
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .. import errors
from .._json import dumps as _json_dumps
from .limits import (
    MAX_BATCH,
    MAX_BULK,
    MAX_DELAY_SECS,
    MAX_ERROR,
    MAX_HEADER_NAME,
    MAX_HEADERS_BYTES,
    MAX_IDEMPOTENCY_KEY,
    MAX_JOB_ID,
    MAX_JOB_WAIT_SECS,
    MAX_EVENT_STATS_SECS,
    MAX_LEASE_JOBS,
    MAX_LEASE_SECS,
    MAX_PROGRESS_BYTES,
    MAX_QUEUES_PAGE,
    MAX_TIMEOUT_SECS,
    MAX_TOKEN,
    MAX_WAIT_SECS,
    MAX_WORKER_ID,
    MAX_ADDED_STEPS,
    MAX_WORKFLOW_NAME,
    MAX_WORKFLOW_STEPS,
    MAX_WORKFLOWS_PAGE,
    NAME_PATTERN,
    QUEUES_PAGE,
)
from .records import Status, WorkflowStatus

def _json_number(value: Any) -> Any:
    # As JSON Schema (and /openapi.json) reads a body: a number is never a
    # string or a boolean; 3.0 is an integer, 3.5 is not.
    if isinstance(value, (bool, str)):
        raise ValueError("must be a JSON number")
    return value


def _json_time(value: Any) -> Any:
    if isinstance(value, (bool, int, float)):
        raise ValueError("must be an RFC 3339 time string")
    return value


# PostgreSQL cannot store the character U+0000 in text or jsonb, and SQLite
# can: refused in every string and JSON object of a request, both stores
# keep the same things (docs/protocol.md, "Limits").
_NUL = "\x00"
_NUL_ESCAPED = b"\\u0000"  # how JSON writes it: no other way


def find_nul(value: Any) -> str | None:
    """Where *value* holds U+0000, in a string or a key: the path to it
    (``"a.0.b"``; ``""`` for *value* itself), or ``None``."""
    if isinstance(value, str):
        return "" if _NUL in value else None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _NUL in key:
            return key.replace(_NUL, "\\u0000")
        found = find_nul(item)
        if found is not None:
            return f"{key}.{found}" if found else str(key)
    return None


def _nul_path(value: dict[str, Any]) -> str | None:
    # Serialising finds one far faster than walking the object, which is
    # done only to say where it is (a backslash followed by "u0000" reads
    # the same, hence the walk's word).
    try:
        if _NUL_ESCAPED not in _json_dumps(value):
            return None
    except (TypeError, ValueError):
        pass
    return find_nul(value)


_NUL_MESSAGE = "holds the character \\u0000{at}, which qftrio does not store"


def _no_nul_text(value: str) -> str:
    if _NUL in value:
        raise PydanticCustomError("nul_character", _NUL_MESSAGE.format(at=""))
    return value


def _no_nul_object(value: dict[str, Any]) -> dict[str, Any]:
    where = _nul_path(value)
    if where is not None:
        raise PydanticCustomError("nul_character", _NUL_MESSAGE.format(at=f" at {where}"))
    return value


def refuse_nul(value: dict[str, Any] | str, field: str) -> None:
    """Raise :class:`~qftrio.errors.InvalidInput` naming *field* when
    *value* holds U+0000: what a request body's model refuses, for what
    reaches the engine without one (the in-process worker's reports)."""
    where = find_nul(value) if isinstance(value, str) else _nul_path(value)
    if where is not None:
        at = f" at {where}" if where else ""
        raise errors.InvalidInput(f"{field}: {_NUL_MESSAGE.format(at=at)}")


Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Int = Annotated[int, BeforeValidator(_json_number)]
Number = Annotated[float, BeforeValidator(_json_number)]
TimeInput = Annotated[_dt.datetime, BeforeValidator(_json_time)]
#: A queue or kind name in a path, validated as in a body.
NAME = TypeAdapter(Name)
#: Free text of a request: a string without U+0000.
Text = Annotated[str, AfterValidator(_no_nul_text)]
#: A JSON object of a request (payload, result, context): no U+0000 in it.
JsonObject = Annotated[dict[str, Any], AfterValidator(_no_nul_object)]
Token = Annotated[Text, StringConstraints(min_length=1, max_length=MAX_TOKEN)]


# A job's headers go to workers untouched, which may pass them on as the
# headers of HTTP requests or messages (a traceparent does): names are HTTP
# field names (RFC 9110 tokens) and values hold no control character but the
# tab. The patterns are /openapi.json's; the checks' own words name the rule.
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
HEADER_VALUE_PATTERN = r"^[^\u0000-\u0008\u000a-\u001f\u007f]*$"
_HEADER_NAME_RE = re.compile(HEADER_NAME_PATTERN)
_HEADER_VALUE_RE = re.compile(HEADER_VALUE_PATTERN)


def _header_name(name: str) -> str:
    if not _HEADER_NAME_RE.fullmatch(name) or len(name) > MAX_HEADER_NAME:
        raise PydanticCustomError(
            "header_name",
            "a header name must be 1-{limit} characters of A-Z a-z 0-9 ! # $ % & ' * + . ^ _ ` | ~ -",
            {"limit": MAX_HEADER_NAME},
        )
    return name


def _header_value(value: str) -> str:
    if not _HEADER_VALUE_RE.fullmatch(value):
        raise PydanticCustomError("header_value", "must hold no control character (a tab is allowed)")
    return value


def headers_size(headers: dict[str, str]) -> int:
    """The bytes *headers* count against :data:`MAX_HEADERS_BYTES`: their
    names' and values' UTF-8, all together."""
    return sum(len(name.encode()) + len(value.encode()) for name, value in headers.items())


def _progress_fits(progress: dict[str, Any]) -> dict[str, Any]:
    size = len(_json_dumps(progress))
    if size > MAX_PROGRESS_BYTES:
        raise PydanticCustomError(
            "progress_too_large",
            "its JSON holds {size} bytes, over the {limit} allowed",
            {"size": size, "limit": MAX_PROGRESS_BYTES},
        )
    return progress


def _headers_fit(headers: dict[str, str]) -> dict[str, str]:
    size = headers_size(headers)
    if size > MAX_HEADERS_BYTES:
        raise PydanticCustomError(
            "headers_too_large",
            "names and values hold {size} bytes in all, over the {limit} allowed",
            {"size": size, "limit": MAX_HEADERS_BYTES},
        )
    return headers


#: A handler's progress: a JSON object of at most ``MAX_PROGRESS_BYTES``.
Progress = Annotated[
    dict[str, Any],
    AfterValidator(_no_nul_object),
    AfterValidator(_progress_fits),
    WithJsonSchema({"type": "object", "description": f"at most {MAX_PROGRESS_BYTES} bytes of JSON"}),
]

#: A job's ``config.headers``: ``{name: value}``, carried to its worker untouched.
Headers = Annotated[
    dict[Annotated[str, AfterValidator(_header_name)], Annotated[str, AfterValidator(_header_value)]],
    AfterValidator(_headers_fit),
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": HEADER_NAME_PATTERN, "maxLength": MAX_HEADER_NAME},
            "additionalProperties": {"type": "string", "pattern": HEADER_VALUE_PATTERN},
            "description": f"at most {MAX_HEADERS_BYTES} bytes of names and values in all (UTF-8)",
        }
    ),
]
JobId = Annotated[Text, StringConstraints(max_length=MAX_JOB_ID)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Fields(BaseModel):
    # Query strings carry only strings: numbers are read from them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackoffConfig(_Body):
    """A job's retry delays (``config.backoff``): the *n*-th failed attempt
    waits ``min(max_secs, initial_secs * factor**(n-1))``, less a random
    part of up to ``jitter`` of it. Each field left out is the server's
    default's."""

    initial_secs: Annotated[float, Field(gt=0, le=MAX_DELAY_SECS), BeforeValidator(_json_number)] = 1.0
    factor: Annotated[float, Field(ge=1, le=100), BeforeValidator(_json_number)] = 2.0
    max_secs: Annotated[float, Field(gt=0, le=MAX_DELAY_SECS), BeforeValidator(_json_number)] = 3600.0
    jitter: Annotated[float, Field(ge=0, le=1), BeforeValidator(_json_number)] = 0.5


class ConcurrencyConfig(_Body):
    """At most ``limit`` running jobs of the tenant carry ``key``."""

    key: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)]
    limit: Int = Field(1, ge=1, le=1_000_000)


class UniqueConfig(_Body):
    """While a job of the tenant with ``key`` is in one of ``statuses`` (and
    created less than ``period_secs`` ago), an enqueue answers it."""

    key: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)]
    statuses: list[typing.Literal["pending", "running", "completed", "failed", "cancelled"]] = Field(
        default_factory=lambda: ["pending", "running"], min_length=1, max_length=5
    )
    period_secs: Annotated[float, Field(gt=0, le=10 * 365 * 86400), BeforeValidator(_json_number)] | None = None


def _one_schedule_schema(schema: dict[str, Any]) -> None:
    # What _one_schedule says, for /openapi.json: not both of delay_secs and
    # scheduled_at (either may be null).
    both = ("delay_secs", "scheduled_at")
    schema["not"] = {"required": list(both), "properties": {name: {"not": {"type": "null"}} for name in both}}


class JobConfig(_Body):
    model_config = ConfigDict(json_schema_extra=_one_schedule_schema)

    queue: Name = "default"
    priority: Int = Field(0, ge=-(2**31), le=2**31 - 1)
    max_attempts: Int = Field(5, ge=1, le=1000)
    # The bounds on the float, before the number check: on the union, or
    # after the check, they would be left out of /openapi.json, which would
    # then let a negative delay through.
    delay_secs: Annotated[float, Field(ge=0, le=10 * 365 * 86400), BeforeValidator(_json_number)] | None = None
    scheduled_at: TimeInput | None = None
    idempotency_key: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)] | None = None
    timeout_secs: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECS), BeforeValidator(_json_number)] | None = None
    backoff: BackoffConfig | None = None
    headers: Headers | None = None
    concurrency: ConcurrencyConfig | None = None
    #: A rate limit the tenant declared: each claim of the job takes a unit.
    rate_limit: Name | None = None
    unique: UniqueConfig | None = None

    @model_validator(mode="after")
    def _one_schedule(self) -> JobConfig:
        if self.delay_secs is not None and self.scheduled_at is not None:
            raise ValueError("give delay_secs or scheduled_at, not both")
        # Times are written back with four-digit years; near the end of 9999
        # in any time zone, UTC (or microsecond rounding) reaches 10000.
        if self.scheduled_at is not None and self.scheduled_at.year > 9998:
            raise ValueError("scheduled_at must be before the year 9999")
        return self


#: The largest rate limit: a claim keeps the times of the last window's claims.
MAX_RATE_LIMIT = 10_000


class RateLimitRequest(_Body):
    limit: Int = Field(ge=1, le=MAX_RATE_LIMIT)
    per_secs: Annotated[float, Field(gt=0, le=30 * 86400), BeforeValidator(_json_number)]


class EnqueueRequest(_Body):
    kind: Name
    payload: JsonObject = Field(default_factory=dict)
    config: JobConfig = Field(default_factory=JobConfig)


class EnqueueBatchRequest(_Body):
    jobs: list[EnqueueRequest] = Field(min_length=1, max_length=MAX_BATCH)


class LeaseRequest(_Body):
    max_jobs: Int = Field(1, ge=1, le=MAX_LEASE_JOBS)
    lease_secs: Int = Field(60, ge=1, le=MAX_LEASE_SECS)
    wait_secs: Number = Field(0, ge=0, le=MAX_WAIT_SECS)
    worker_id: Annotated[Text, StringConstraints(max_length=MAX_WORKER_ID)] | None = None


class HeartbeatRequest(_Body):
    lease_token: Token
    extend_secs: Int = Field(ge=1, le=MAX_LEASE_SECS)


class CompleteRequest(_Body):
    lease_token: Token
    result: JsonObject = Field(default_factory=dict)


#: A delay of a report: seconds, 0 to 30 days.
Delay = Annotated[float, Field(ge=0, le=MAX_DELAY_SECS), BeforeValidator(_json_number)]


class FailRequest(_Body):
    lease_token: Token
    error: Annotated[Text, StringConstraints(max_length=MAX_ERROR)]
    retryable: bool = Field(True, strict=True)
    retry_in_secs: Delay | None = None


class SnoozeRequest(_Body):
    lease_token: Token
    delay_secs: Delay



class HeartbeatManyItem(HeartbeatRequest):
    id: JobId
    progress: Progress | None = None


class ProgressRequest(_Body):
    lease_token: Token
    progress: Progress


class CompleteManyItem(CompleteRequest):
    id: JobId


class FailManyItem(FailRequest):
    id: JobId


class SnoozeManyItem(SnoozeRequest):
    id: JobId


class HeartbeatManyRequest(_Body):
    items: list[HeartbeatManyItem] = Field(max_length=MAX_BATCH)


class CompleteManyRequest(_Body):
    items: list[CompleteManyItem] = Field(max_length=MAX_BATCH)


class FailManyRequest(_Body):
    items: list[FailManyItem] = Field(max_length=MAX_BATCH)


class SnoozeManyRequest(_Body):
    items: list[SnoozeManyItem] = Field(max_length=MAX_BATCH)


class WorkflowStepRequest(_Body):
    name: Name
    kind: Name
    payload: JsonObject = Field(default_factory=dict)
    depends_on: list[Name] = Field(default_factory=list, max_length=MAX_WORKFLOW_STEPS)
    max_attempts: Int = Field(5, ge=1, le=1000)


class WorkflowCreateRequest(_Body):
    """``POST /api/v1/workflows``. The step graph itself (unique names, known
    dependencies, no cycle) is checked by the server beyond this schema."""

    name: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_WORKFLOW_NAME)]
    context: JsonObject = Field(default_factory=dict)
    steps: list[WorkflowStepRequest] = Field(min_length=1, max_length=MAX_WORKFLOW_STEPS)


class StepsAddRequest(_Body):
    """``POST /api/v1/jobs/{id}/steps``: steps a running step adds to its
    workflow, and the context key their results are collected under. The
    graph (new names, dependencies on these steps or completed ones, no
    cycle, the workflow's cap) is checked by the server beyond this schema."""

    lease_token: Token
    steps: list[WorkflowStepRequest] = Field(min_length=1, max_length=MAX_ADDED_STEPS)
    collect: Name | None = None


#: A cron expression's longest text.
MAX_CRON = 200


class ScheduleRequest(_Body):
    """``PUT /api/v1/schedules/{name}``. The expression and the time zone
    are read by the server beyond this schema (``cron``, ``timezone``: 422
    naming the field)."""

    cron: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_CRON)]
    timezone: Annotated[Text, StringConstraints(min_length=1, max_length=100)] = "UTC"
    job: EnqueueRequest
    paused: bool = Field(False, strict=True)
    catch_up: Literal["latest", "none", "all"] = "latest"


class SchedulesListQuery(_Fields):
    """``GET /api/v1/schedules``: a page, by name."""

    limit: int = Field(100, ge=1, le=MAX_BATCH)
    cursor: Name | None = None


class EmptyBody(_Body):
    """A body that carries nothing: empty, or ``{}``."""


#: The filters of a bulk action: one of them, or ``"all": true``, is needed.
BULK_FILTERS = ("queue", "status", "kind", "created_after", "created_before")


def _bulk_schema(schema: dict[str, Any]) -> None:
    # What the validator below says, for /openapi.json: a filter that is not
    # null, or "all": true.
    schema["anyOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in BULK_FILTERS
    ] + [{"required": ["all"], "properties": {"all": {"const": True}}}]


class BulkRequest(_Body):
    """``POST /api/v1/jobs/bulk/{retry,cancel,delete}``: which of the tenant's
    jobs (created in ``[created_after, created_before)``), and how many at
    most. At least one filter, or ``"all": true`` to take every job the
    action applies to: an empty body changes nothing by mistake."""

    model_config = ConfigDict(json_schema_extra=_bulk_schema)

    queue: Name | None = None
    status: Status | None = None
    kind: Name | None = None
    created_after: TimeInput | None = None
    created_before: TimeInput | None = None
    limit: Int = Field(10_000, ge=1, le=MAX_BULK)
    all: bool = Field(False, strict=True, validate_default=True)

    @field_validator("all")
    @classmethod
    def _filtered(cls, value: bool, info: ValidationInfo) -> bool:
        # The fields before this one that failed are not in info.data: they
        # are named already, and this would be a second, wrong complaint.
        given = info.data
        if not value and len(given) == len(cls.model_fields) - 1 and all(given[name] is None for name in BULK_FILTERS):
            raise PydanticCustomError(
                "filter_required", "give a filter (" + ", ".join(BULK_FILTERS) + ') or "all": true'
            )
        return value


# --------------------------------------------------------------------------
# Query strings (validated by the server like bodies)


class JobsListQuery(_Fields):
    """``GET /api/v1/jobs``: filters and a page."""

    queue: Name | None = None
    status: Status | None = None
    kind: Name | None = None
    limit: int = Field(50, ge=1, le=MAX_BATCH)
    cursor: str | None = None


class JobWaitQuery(_Fields):
    """``GET /api/v1/jobs/{id}/wait``: how long to wait for the job to end."""

    timeout_secs: float = Field(30, ge=0, le=MAX_JOB_WAIT_SECS)


class EventsQuery(_Fields):
    """``GET /api/v1/events``: which of the tenant's jobs to watch (every
    one by default), and how often to send each queue's stats (never by
    default)."""

    queue: Name | None = None
    kind: Name | None = None
    job: uuid.UUID | None = None
    stats_secs: int | None = Field(None, ge=1, le=MAX_EVENT_STATS_SECS)


class QueuesListQuery(_Fields):
    """``GET /api/v1/queues``: a page."""

    limit: int = Field(QUEUES_PAGE, ge=1, le=MAX_QUEUES_PAGE)
    cursor: str | None = None


class WorkflowsListQuery(_Fields):
    """``GET /api/v1/workflows``: a filter and a page."""

    status: WorkflowStatus | None = None
    limit: int = Field(50, ge=1, le=MAX_WORKFLOWS_PAGE)
    cursor: str | None = None




# --------------------------------------------------------------------------
# What a request that breaks its model is told: the server's 422 and the
# client's local checks alike (docs/client.md), in qftrio's words.

#: What a pydantic error type means, in words; ``{}`` fields come from its context.
_WORDS = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "dict_type": "must be a JSON object",
    "list_type": "must be a list",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "string_too_short": "must have at least {min_length} character(s)",
    "string_too_long": "must have at most {max_length} characters",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} items",
    "datetime_type": "must be an RFC 3339 time, e.g. 2026-11-30T12:00:00Z",
    "datetime_parsing": "must be an RFC 3339 time, e.g. 2026-11-30T12:00:00Z",
    "datetime_from_date_parsing": "must be an RFC 3339 time, e.g. 2026-11-30T12:00:00Z",
}


def field_errors(exc: ValidationError, where: str) -> str:
    """Every field of a request that breaks its model, by its path in the
    body (``config.max_attempts: must be at least 1``; *where*, ``body`` or
    ``query``, for the request as a whole), joined by ``; ``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or where}: {_in_words(err, where)}"
        for err in exc.errors(include_url=False)
    )


def _in_words(err: Any, where: str) -> str:
    kind = err["type"]
    context = err.get("ctx", {})
    if kind == "extra_forbidden":
        return f"unknown {'parameter' if where == 'query' else 'field'}"
    if kind == "value_error" and "error" in context:
        return str(context["error"])  # a model's own check: its words, without "Value error, "
    if kind in ("too_short", "too_long") and isinstance(err.get("input"), str):
        kind = f"string_{kind}"  # a length checked after another check of the text: its characters
    if kind == "string_pattern_mismatch":
        if context.get("pattern") == NAME_PATTERN:
            return "must be 1-128 characters of A-Z a-z 0-9 _ . - (no spaces)"
        return f"must match {context.get('pattern')}"
    try:
        return _WORDS[kind].format(**context)
    except (KeyError, IndexError):
        return str(err.get("msg", "invalid"))
