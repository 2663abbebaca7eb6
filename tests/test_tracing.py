"""Tracing (docs/client.md and docs/worker.md, "Tracing"): with OpenTelemetry
in use, the clients carry the current trace context in the jobs they enqueue
and the worker runs each handler in a span continuing it; one trace from the
enqueuing span to the handler's, over the real server on every store. Spans
are read from the SDK's in-memory exporter. Without OpenTelemetry nothing of
it is imported (a process of its own)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import qftrio
from qftrio.models import MAX_HEADERS_BYTES

from .conftest import RunningServer

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exporter() -> Iterator[Any]:
    """The in-memory exporter of the process's tracer provider, emptied.
    The provider is set once (OpenTelemetry allows no second one); the
    modules are imported here, not at collection, so that the other suites
    run without OpenTelemetry in use."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    global _EXPORTER
    if _EXPORTER is None:
        _EXPORTER = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


_EXPORTER: Any = None


def handler_span(exporter: Any, job: qftrio.Job) -> Any:
    (span,) = [s for s in exporter.get_finished_spans() if s.attributes.get("qftrio.job.id") == job.id]
    return span


async def run_jobs(server: RunningServer, registry: qftrio.Registry, queue: str, jobs: list[qftrio.Job]) -> list[qftrio.Job]:
    """Run a worker of *queue* until every job of *jobs* has ended; the jobs
    as they ended."""
    ended: set[str] = set()
    all_ended = trio.Event()

    def on_event(event: qftrio.WorkerEvent) -> None:
        if event.type in ("completed", "failed") and event.job_id is not None:
            ended.add(event.job_id)
            if ended >= {job.id for job in jobs}:
                all_ended.set()

    async with qftrio.Client(server.url, server.worker_token) as client:
        async with qftrio.open_worker(qftrio.HttpTransport(client), queue, registry, wait_secs=1, on_event=on_event):
            await all_ended.wait()
    async with qftrio.Client(server.url, server.tenants["acme"]) as tenant:
        return [await tenant.job_get(job.id) for job in jobs]


async def test_one_trace_from_the_enqueuing_span_to_the_handler(server: RunningServer, exporter: Any) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, StatusCode

    tracer = trace.get_tracer("test")
    async with qftrio.Client(server.url, server.tenants["acme"]) as tenant:
        with tracer.start_as_current_span("request") as request:
            one = await tenant.enqueue("traced", queue="tracing", headers={"x-app": "shop"})
            (many,) = await tenant.enqueue_many([{"kind": "traced", "queue": "tracing"}])
        untraced = await tenant.enqueue("traced", queue="tracing")

    def from_a_thread() -> qftrio.Job:
        # SyncClient, as a Django view calls it, in its own request's span.
        with qftrio.SyncClient(server.url, server.tenants["acme"]) as client:
            with tracer.start_as_current_span("sync request"):
                return client.enqueue("traced", queue="tracing")

    synced = await trio.to_thread.run_sync(from_a_thread)
    (sync_request,) = [s for s in exporter.get_finished_spans() if s.name == "sync request"]

    context = request.get_span_context()
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert one.headers == {"x-app": "shop", "traceparent": expected}
    assert many.headers == {"traceparent": expected}
    assert untraced.headers is None, "no span active: nothing added"
    assert synced.headers is not None and f"{sync_request.context.span_id:016x}" in synced.headers["traceparent"]

    inside: dict[str, int] = {}
    registry = qftrio.Registry()

    @registry.handler("traced")
    async def traced(job: qftrio.Job) -> None:
        inside[job.id] = trace.get_current_span().get_span_context().span_id

    await run_jobs(server, registry, "tracing", [one, many, untraced, synced])
    for job, parent in ((one, request), (many, request), (synced, sync_request)):
        span = handler_span(exporter, job)
        assert span.name == "traced" and span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == parent.get_span_context().trace_id
        assert span.parent.span_id == parent.get_span_context().span_id and span.parent.is_remote
        assert dict(span.attributes) == {"qftrio.job.id": job.id, "qftrio.job.queue": "tracing", "qftrio.job.attempt": 1}
        assert span.status.status_code is StatusCode.UNSET
        # The handler runs in its span: what it traces is the span's child.
        assert inside[job.id] == span.context.span_id
    # A job enqueued outside any span starts a trace of its own.
    own = handler_span(exporter, untraced)
    assert own.parent is None and own.context.trace_id != context.trace_id
    assert inside[untraced.id] == own.context.span_id


async def test_a_handler_error_is_the_span_error(server: RunningServer, exporter: Any) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import StatusCode

    tracer = trace.get_tracer("test")
    registry = qftrio.Registry()

    @registry.handler("broken")
    async def broken(job: qftrio.Job) -> None:
        raise ValueError("no such image")

    @registry.handler("refused")
    def refused(job: qftrio.Job) -> None:
        # A synchronous handler, in a thread: its spans are children too.
        with tracer.start_as_current_span("inside the thread"):
            raise qftrio.PermanentError("bad payload")

    async with qftrio.Client(server.url, server.tenants["acme"]) as tenant:
        with tracer.start_as_current_span("request"):
            jobs = await tenant.enqueue_many(
                [{"kind": kind, "queue": "tracing-errors", "max_attempts": 1} for kind in ("broken", "refused")]
            )
    assert [job.status for job in await run_jobs(server, registry, "tracing-errors", jobs)] == [qftrio.Status.FAILED] * 2
    broken_span, refused_span = (handler_span(exporter, job) for job in jobs)
    assert broken_span.status.status_code is StatusCode.ERROR
    assert broken_span.status.description == "ValueError: no such image"
    (event,) = broken_span.events
    assert event.name == "exception" and event.attributes["exception.message"] == "no such image"
    assert refused_span.status.description == "PermanentError: bad payload"
    (inner,) = [s for s in exporter.get_finished_spans() if s.name == "inside the thread"]
    assert inner.parent.span_id == refused_span.context.span_id


async def test_headers_the_caller_set_are_kept(server: RunningServer, exporter: Any) -> None:
    from opentelemetry import trace

    async with qftrio.Client(server.url, server.tenants["acme"]) as tenant:
        with trace.get_tracer("test").start_as_current_span("request"):
            kept = await tenant.enqueue("k", headers={"TraceParent": TRACEPARENT})
            state_only = await tenant.enqueue("k", headers={"tracestate": "rojo=1"})
            # Near the cap the trace context is left out: the enqueue goes through.
            full = {"big": "x" * (MAX_HEADERS_BYTES - 3 - 60)}
            near_the_cap = await tenant.enqueue("k", headers=full)
    assert kept.headers == {"TraceParent": TRACEPARENT}
    assert state_only.headers == {"tracestate": "rojo=1"}
    assert near_the_cap.headers == full


@pytest.mark.parametrize("opentelemetry", ["absent", "installed"])
def test_nothing_of_opentelemetry_is_imported_unless_the_application_does(opentelemetry: str) -> None:
    # A process of its own: import qftrio, serve, enqueue and run a job.
    # With OpenTelemetry absent (its import blocked) or installed and unused,
    # no module of it is loaded, and the job runs as ever.
    script = textwrap.dedent(
        """
        import importlib.abc
        import sys

        class Absent(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.partition(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        if sys.argv[1] == "absent":
            sys.meta_path.insert(0, Absent())

        import trio
        import qftrio
        from qftrio.testing import open_test_server

        registry = qftrio.Registry()

        @registry.handler("plain")
        async def plain(job):
            return {"headers": job.headers}

        async def main():
            async with open_test_server() as server:
                job = await server.run_job(registry, "plain")
            loaded = sorted(name for name in sys.modules if name.partition(".")[0] == "opentelemetry")
            print(job.status.value, job.result, loaded)

        trio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, opentelemetry], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed {'headers': None} []"
