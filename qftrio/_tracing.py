"""OpenTelemetry, when the application uses it (the ``qftrio[otel]`` extra).

A job carries its enqueuer's W3C trace context (``traceparent``,
``tracestate``) in its ``headers``: the clients put the current span's there
(:func:`with_trace_context`), and the worker runs each handler in a span
continuing it (:func:`handler_span`).

qftrio never imports OpenTelemetry on its own. Until the application has
imported ``opentelemetry.trace``, no span can be active and no tracer
provider can be set, so there is nothing to carry and nothing to record:
both functions then cost one dictionary lookup, and a process that does not
trace (or has no OpenTelemetry installed) loads none of it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ContextManager

from .errors import Snooze
from .models import MAX_HEADERS_BYTES, headers_size

if TYPE_CHECKING:
    from .models import Job

__all__ = ["with_trace_context", "handler_span", "TRACE_HEADERS"]

#: The headers of the W3C trace context, as qftrio writes them.
TRACE_HEADERS = ("traceparent", "tracestate")

#: Present in :data:`sys.modules` once the application uses OpenTelemetry.
_API = "opentelemetry.trace"

_NO_SPAN = contextlib.nullcontext()

# Made at first use, once the application has imported OpenTelemetry.
_propagator: Any = None
_tracer: Any = None


def _w3c() -> Any:
    # The W3C propagator itself, not the global one: the headers are W3C
    # trace context whatever else the application propagates (its baggage
    # would count against the headers' cap, and a worker in another
    # language reads traceparent).
    global _propagator
    if _propagator is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _propagator = TraceContextTextMapPropagator()
    return _propagator


def with_trace_context(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """*headers* with the current span's trace context added, for a job to
    enqueue. They are left as they are when no span is active, when they
    hold a trace context of their own (``traceparent`` or ``tracestate``,
    in any case), or when the context would take them over the cap
    (:data:`~qftrio.models.MAX_HEADERS_BYTES`): tracing never makes an
    enqueue fail."""
    given = None if headers is None else dict(headers)
    if _API not in sys.modules:
        return given
    if given and any(name.lower() in TRACE_HEADERS for name in given):
        return given
    carrier: dict[str, str] = {}
    _w3c().inject(carrier)
    if not carrier:
        return given
    merged = {**given, **carrier} if given else carrier
    return merged if headers_size(merged) <= MAX_HEADERS_BYTES else given


def handler_span(job: Job) -> ContextManager[object]:
    """The span a handler of *job* runs in: kind ``CONSUMER``, named after
    the job's kind, a child of the trace context in its headers (a new trace
    without one), with the job's id, queue and attempt. An exception out of
    the handler is recorded on it as its error. Nothing at all when the
    application does not use OpenTelemetry."""
    if _API not in sys.modules:
        return _NO_SPAN
    return _span(job)


@contextlib.contextmanager
def _span(job: Job) -> Iterator[object]:
    global _tracer
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    if _tracer is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours: str | None = version("qftrio")
        except PackageNotFoundError:  # run from a source tree
            ours = None
        # A proxy until the application sets a tracer provider, which it
        # then follows.
        _tracer = trace.get_tracer("qftrio", ours)
    parent = _w3c().extract(job.headers or {})
    attributes = {"qftrio.job.id": job.id, "qftrio.job.queue": job.queue, "qftrio.job.attempt": job.attempt}
    with _tracer.start_as_current_span(
        job.kind,
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Snooze as exc:
            # "not now" is the handler's answer, not a failure
            span.set_attribute("qftrio.job.snoozed_secs", exc.seconds)
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        except BaseException as exc:
            # Cancelled (the job was cancelled, lost or timed out) or the
            # process stopping: the handler did not finish.
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
