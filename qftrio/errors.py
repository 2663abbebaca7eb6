"""qftrio's exceptions, one tree::

    QftrioError
    ├── ApiError                 an HTTP error answer (server side: raised to produce it;
    │   │                        client side: raised on receiving it)
    │   ├── BadRequest           400 malformed request
    │   ├── Unauthorized         401 missing or unknown credential
    │   ├── Forbidden            403 credential of the wrong kind
    │   ├── NotFound             404 unknown job, workflow or route
    │   ├── Conflict             409 stale lease token, terminal job, ...
    │   ├── PayloadTooLarge      413 request body over the cap
    │   ├── InvalidInput         422 body breaks the schema
    │   ├── TooManyRequests      429 throttled: retry after Retry-After
    │   └── Unavailable          503 the store cannot be reached
    ├── TransportError           the server could not be reached at all
    ├── UnexpectedAnswer         the server answered, but not as qftrio does
    ├── ConfigError              a setting that cannot work
    ├── PermanentError           raised by a handler: fail the job, do not retry
    ├── Snooze                   raised by a handler: run the job again later, the
    │                            attempt not used up
    └── RetryIn                  raised by a handler: fail the attempt, retried after
                                 the delay it gives instead of the backoff
"""

from __future__ import annotations

__all__ = [
    "QftrioError",
    "ApiError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "InvalidInput",
    "TooManyRequests",
    "UnexpectedAnswer",
    "Unavailable",
    "TransportError",
    "ConfigError",
    "PermanentError",
    "Snooze",
    "RetryIn",
    "error_for_status",
    "is_transient",
]


class QftrioError(Exception):
    """Base of every exception qftrio raises on purpose."""


class ApiError(QftrioError):
    """An error answer of the HTTP API.

    Attributes:
        status_code: the HTTP status.
        code: a short machine-readable code, e.g. ``"not_found"``.
        message: a sentence for people.
    """

    status_code: int = 500
    code: str = "internal"

    def __init__(self, message: str | None = None, *, code: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        if code is not None:
            self.code = code
        super().__init__(self.message)

    def to_wire(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class BadRequest(ApiError):
    """The request could not be read."""

    status_code = 400
    code = "bad_request"


class Unauthorized(ApiError):
    """A valid credential is required."""

    status_code = 401
    code = "unauthorized"


class Forbidden(ApiError):
    """This credential may not use this route."""

    status_code = 403
    code = "forbidden"


class NotFound(ApiError):
    """Not found."""

    status_code = 404
    code = "not_found"


class Conflict(ApiError):
    """The request conflicts with the job's current state."""

    status_code = 409
    code = "conflict"


class PayloadTooLarge(ApiError):
    """The request body is larger than the server accepts."""

    status_code = 413
    code = "payload_too_large"


class InvalidInput(ApiError):
    """The request body does not match the schema."""

    status_code = 422
    code = "invalid"


class TooManyRequests(ApiError):
    """Too many failed credentials from this address: retry later.

    ``retry_after``: seconds to wait before trying again (the answer's
    ``Retry-After``), when the server says.
    """

    status_code = 429
    code = "too_many_requests"

    def __init__(self, message: str | None = None, *, code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class Unavailable(ApiError):
    """The service is temporarily unavailable."""

    status_code = 503
    code = "unavailable"


class TransportError(QftrioError):
    """The server could not be reached, or the connection broke."""


class UnexpectedAnswer(QftrioError):
    """The server answered, but not as a qftrio server does: a wrong URL, or
    something else listening there. Retrying does not help."""


class ConfigError(QftrioError):
    """A setting that cannot work; the message says which and why."""


class PermanentError(QftrioError):
    """Raise from a handler to fail the job without retrying it."""


class Snooze(QftrioError):
    """Raise from a handler to put its job back to pending for *seconds*
    (0 to 30 days) without using up the attempt: "not now". The server
    raises the job's ``max_attempts`` by one, so a job snoozed any number of
    times is never dead-lettered for it."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds:g} s")
        self.seconds = seconds


class RetryIn(QftrioError):
    """Raise from a handler to fail the attempt with *error* and have it
    retried in *seconds* (0 to 30 days) instead of after the job's backoff:
    an upstream's ``Retry-After``, say. The last attempt is dead-lettered
    all the same."""

    def __init__(self, seconds: float, error: str = "retry requested") -> None:
        super().__init__(error)
        self.seconds = seconds
        self.error = error


_BY_STATUS: dict[int, type[ApiError]] = {
    cls.status_code: cls
    for cls in (
        BadRequest, Unauthorized, Forbidden, NotFound, Conflict, PayloadTooLarge, InvalidInput, TooManyRequests, Unavailable
    )
}


def error_for_status(status_code: int, code: str | None, message: str | None) -> ApiError:
    """The exception the client raises for an error answer."""
    cls = _BY_STATUS.get(status_code, ApiError)
    err = cls(message or f"HTTP {status_code}", code=code)
    if cls is ApiError:
        err.status_code = status_code
    return err


def is_transient(status_code: int) -> bool:
    """Whether an error answer with this status may be different if the same
    request is sent again: a request timeout, throttling (429), or a server
    error (the server, or a proxy before it, is down or busy for a while)
    other than those that say what it will never do (``501 Not
    Implemented``, ``505 HTTP Version Not Supported``). Any other error
    answer lasts."""
    return status_code in (408, 429) or (status_code >= 500 and status_code not in (501, 505))
