"""Seams that keep one thing in one place: no import cycle in the package;
a job's wire form and schema derived from its fields; the worker's two
transports (over HTTP, and in-process against the engine) answering each
report with the same outcome, on every backend."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from qftrio import errors
from qftrio.client import Client
from qftrio.models import (
    CompleteItem,
    EnqueueRequest,
    ErrorEntry,
    FailItem,
    HeartbeatItem,
    HeartbeatReply,
    Job,
    JobAnswer,
    Outcome,
    ReportReply,
    Status,
    to_datetime as when,
)
from qftrio.server.inprocess import EngineTransport
from qftrio.worker.transport import HttpTransport, Transport

from .conftest import RunningServer

PACKAGE = Path(__file__).resolve().parent.parent / "qftrio"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules *name* imports, anywhere in it (an import inside
    a function is still a dependency)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out |= {f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in modules and m != name}


def test_no_module_of_the_package_imports_itself_back() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "qftrio.server.protocol" in graph["qftrio.server.api"]  # the walk sees imports at all

    def back_to(start: str, node: str, seen: set[str]) -> list[str] | None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                return [node, start]
            if nxt not in seen:
                seen.add(nxt)
                path = back_to(start, nxt, seen)
                if path is not None:
                    return [node, *path]
        return None

    for name in sorted(graph):
        cycle = back_to(name, name, {name})
        assert cycle is None, " -> ".join(cycle or ())


@pytest.fixture
async def transports(server: RunningServer) -> AsyncIterator[dict[str, Transport]]:
    async with Client(server.url, server.worker_token, timeout=5) as client:
        yield {"http": HttpTransport(client), "in-process": EngineTransport(server.engine)}


async def test_both_transports_answer_the_same_outcomes(server: RunningServer, transports: dict[str, Transport]) -> None:
    answers: dict[str, list[object]] = {}
    for name, transport in transports.items():
        await server.engine.enqueue("acme", [EnqueueRequest(kind="k") for _ in range(3)])
        a, b, c = await transport.lease("default", max_jobs=3, lease_secs=60, wait_secs=0, worker_id=name)
        unknown = "00000000-0000-7000-8000-000000000000"
        beats = await transport.heartbeat(
            [HeartbeatItem(a.job.id, a.lease_token, 60), HeartbeatItem(b.job.id, "stale", 60), HeartbeatItem(unknown, "t", 60)]
        )
        done = await transport.complete([CompleteItem(a.job.id, a.lease_token, {}), CompleteItem(b.job.id, "stale", {})])
        failed = await transport.fail([FailItem(c.job.id, c.lease_token, "e"), FailItem(unknown, "t", "e")])
        replay = await transport.heartbeat([HeartbeatItem(a.job.id, a.lease_token, 60)])
        assert all(type(r) is HeartbeatReply for r in beats + replay)
        assert all(type(r) is ReportReply for r in done + failed)
        answers[name] = [
            [(r.outcome, r.status, r.locked_until is not None) for r in beats],
            [r.outcome for r in done],
            [r.outcome for r in failed],
            [(r.outcome, r.status, r.locked_until) for r in replay],
        ]
    assert answers["http"] == answers["in-process"] == [
        [(Outcome.OK, "running", True), (Outcome.CONFLICT, None, False), (Outcome.NOT_FOUND, None, False)],
        [Outcome.OK, Outcome.CONFLICT],
        [Outcome.OK, Outcome.NOT_FOUND],
        [(Outcome.OK, "completed", None)],
    ]


async def test_both_transports_refuse_the_nul_character_in_a_report(
    server: RunningServer, transports: dict[str, Transport]
) -> None:
    for name, transport in transports.items():
        await server.engine.enqueue("acme", [EnqueueRequest(kind="k")])
        (lease,) = await transport.lease("default", max_jobs=1, lease_secs=60, wait_secs=0, worker_id=name)
        with pytest.raises(errors.InvalidInput, match="result: holds the character"):
            await transport.complete([CompleteItem(lease.job.id, lease.lease_token, {"r": "\x00"})])
        with pytest.raises(errors.InvalidInput, match="error: holds the character"):
            await transport.fail([FailItem(lease.job.id, lease.lease_token, "\x00")])
        job = await server.engine.job_get("acme", lease.job.id)
        assert (job.status.value, job.result, job.error) == ("running", None, None), name


def test_a_job_s_wire_form_and_schema_follow_its_fields() -> None:
    job = Job(
        id="01a22c53-8200-7e63-a775-0bf6e4422d36", tenant="t", queue="q", kind="k", payload={"p": [1]},
        status=Status.FAILED, priority=-3, attempt=2, max_attempts=2, scheduled_at=when(1.5e9),
        created_at=when(1.5e9 - 1), updated_at=when(1.5e9 + 0.25), locked_until=when(1.5e9 + 60), worker_id="w",
        result={"r": 1}, error="boom", errors=(ErrorEntry(attempt=1, error="first", at=when(1.5e9 + 0.5)),),
        workflow_id="wf", step="s", context={"c": 2},
    )  # fmt: skip
    wire = job.to_wire()
    # each field under its own name, but last_progress: the wire's progress
    names = [field.metadata.get("wire", field.name) for field in dataclasses.fields(Job)]
    assert list(wire) == names == list(JobAnswer.model_fields)
    assert "progress" in wire and "last_progress" not in wire
    assert wire["status"] == "failed" and wire["updated_at"] == "2017-07-14T02:40:00.250000Z"
    assert wire["errors"] == [{"attempt": 1, "error": "first", "at": "2017-07-14T02:40:00.500000Z"}]
    assert Job.from_wire(wire) == job and Job.from_wire(json.loads(json.dumps(wire))) == job
    JobAnswer.model_validate(wire)  # the schema /openapi.json shows holds the wire form
    # the fields with a default may be left out of what is read
    required = [field.name for field in dataclasses.fields(Job) if field.default is dataclasses.MISSING]
    bare = {name: wire[name] for name in required}
    assert Job.from_wire(bare) == dataclasses.replace(
        job, locked_until=None, worker_id=None, result=None, error=None, errors=(), workflow_id=None, step=None, context=None
    )
    schema = JobAnswer.model_json_schema()
    assert set(schema["required"]) == set(names)
    assert schema["properties"]["locked_until"]["anyOf"][1] == {"type": "null"}
