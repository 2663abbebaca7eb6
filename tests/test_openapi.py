"""The API contract: /openapi.json documents every route, and the real
server, on every backend, answers exactly as it says (schemathesis)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from qftrio.server.api import ALL_ROUTES
from qftrio.server.engine import Engine
from qftrio.server.serve import run_server
from qftrio.server.store.base import Store

from .conftest import server_config

# What the document cannot say. A cursor is a string the server issued, and
# any other string is a 422; a workflow's step graph (no cycle, known
# dependencies) is checked beyond its schema, and so are a schedule's cron
# expression and time zone. A body over the cap is a 413 before its items
# are counted.
SCHEMATHESIS_CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]

[[operations]]
include-path-regex = "^/api/v1/(jobs|workflows)$"
include-method = "GET"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422"]

[[operations]]
include-path = "/api/v1/workflows"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422"]

[[operations]]
include-path = "/api/v1/schedules/{name}"
include-method = "PUT"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422"]
"""


@pytest.fixture
async def dev_url(storage: Store, nursery: trio.Nursery) -> AsyncIterator[str]:
    """A real server in dev mode: the worker token is good on every route,
    so one credential lets schemathesis reach all of them."""
    stop = trio.Event()
    # schemathesis sends wrong credentials on purpose, more than the burst
    # after which an address is answered 429
    config = server_config(dev=True, tenants={}, failed_credentials_burst=1_000_000)
    binds = await nursery.start(functools.partial(run_server, Engine(storage), config, shutdown_trigger=stop.wait))
    yield binds[0]
    stop.set()


async def test_schemathesis_finds_nothing(dev_url: str, tmp_path: Path) -> None:
    # Every check, every phase but the stateful one, few examples: a few
    # seconds per store. The seed keeps a failure reproducible.
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    argv = [
        str(Path(sys.executable).parent / "st"), "--config-file", str(config), "run", f"{dev_url}/openapi.json",
        "--checks", "all", "--phases", "examples,coverage,fuzzing", "--max-examples", "4", "--seed", "1",
        "--header", "Authorization: Bearer worker-secret", "--workers", "1", "--request-timeout", "10",
        "--generation-database", "none", "--no-color", "--report-dir", str(tmp_path),
        # The event stream answers for as long as its client reads: every
        # case would last the whole request timeout (tests/test_events.py).
        "--exclude-path", "/api/v1/events",
    ]  # fmt: skip
    with trio.fail_after(120):
        done = await trio.run_process(
            argv, cwd=tmp_path, capture_stdout=True, stderr=subprocess.STDOUT, check=False, env={**os.environ, "NO_COLOR": "1"}
        )
    # Failures quote whole bodies: each line is cut short here.
    output = "\n".join(line[:300] for line in done.stdout.decode(errors="replace").splitlines())
    (tmp_path / "schemathesis.txt").write_text(output)
    assert done.returncode == 0, output[-30000:]


async def test_the_document_is_complete(http: httpx.AsyncClient) -> None:
    doc = (await http.get("/openapi.json")).json()
    paths = doc["paths"]
    for route in ALL_ROUTES:
        path = route.path.replace("<", "{").replace(">", "}")
        operation = paths[path][route.method.lower()]
        documented = {int(status) for status in operation["responses"]}
        assert documented == set(route.statuses()), (route.method, path)
        for status, response in operation["responses"].items():
            if int(status) not in route.answers:
                schema = response["content"]["application/json"]["schema"]
                assert schema.get("title") == "ErrorAnswer", (path, status)
        # the document's default is a bearer token; a route that needs none says so
        assert ("security" in operation) == (route.caller == "anyone"), path
    # the list routes' query parameters, with their constraints
    listed = {p["name"]: p for p in paths["/api/v1/jobs"]["get"]["parameters"]}
    assert set(listed) == {"queue", "status", "kind", "limit", "cursor"}
    assert listed["limit"]["schema"]["maximum"] == 1000
    assert {p["name"] for p in paths["/api/v1/workflows"]["get"]["parameters"]} == {"status", "limit", "cursor"}
    # required fields are marked
    schemas = doc["components"]["schemas"]
    lease_body = paths["/api/v1/jobs/{job_id}/heartbeat"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(lease_body["required"]) == {"lease_token", "extend_secs"}
    assert "kind" in schemas["EnqueueRequest"]["required"] or "kind" in paths["/api/v1/jobs"]["post"]["requestBody"][
        "content"
    ]["application/json"]["schema"]["required"]
    # the operations: a bulk body's bounds, and paused in every queue's stats
    bulk = paths["/api/v1/jobs/bulk/cancel"]["post"]["requestBody"]
    assert bulk["required"] is False
    limit = bulk["content"]["application/json"]["schema"]["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, 1_000_000, 10_000)
    # each action's statuses, and a filter or "all": true (an empty body is refused)
    for action, statuses in (
        ("retry", ["failed", "cancelled"]), ("cancel", ["pending", "running"]), ("delete", ["completed", "failed", "cancelled"])
    ):
        body = paths[f"/api/v1/jobs/bulk/{action}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        body = schemas[body["$ref"].rpartition("/")[2]] if "$ref" in body else body
        (status,) = [s for s in body["properties"]["status"]["anyOf"] if "enum" in s]
        assert status["enum"] == statuses, action
        needs = [branch["required"] for branch in body["anyOf"]]
        assert needs == [["queue"], ["status"], ["kind"], ["created_after"], ["created_before"], ["all"]], action
    # a job's delay_secs and scheduled_at, not both
    config = schemas["JobConfig"]["not"]
    assert config["required"] == ["delay_secs", "scheduled_at"]
    assert all(config["properties"][name] == {"not": {"type": "null"}} for name in config["required"])
    assert "paused" in schemas["QueueStatsAnswer"]["required"]
    assert "200" in paths["/api/v1/queues/{queue}/pause"]["post"]["responses"]
    assert "200" in paths["/api/v1/workers"]["get"]["responses"]
    # path names carry their pattern
    (queue,) = paths["/api/v1/queues/{queue}/stats"]["get"]["parameters"]
    assert queue["schema"]["pattern"] == "^[A-Za-z0-9_.-]{1,128}$"
    # health and metrics need no credential
    assert doc["security"] == [{"bearer": []}]
    for path in ("/healthz", "/metrics"):
        assert paths[path]["get"]["security"] == [], path
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]


async def test_docs_page_is_served_from_the_package(http: httpx.AsyncClient) -> None:
    r = await http.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in r.text
    # nothing loaded from elsewhere: no script, style or link with an address
    assert "http://" not in r.text and "https://" not in r.text and "//cdn" not in r.text
