"""Workflows (docs/workflows.md) over real HTTP, on every backend: the application API
creates and inspects them, and steps run through the worker protocol."""

from __future__ import annotations

import functools
import json
import uuid
from pathlib import Path

import httpx
import pytest
import trio

from qftrio import errors
from qftrio.cli import main
from qftrio.client import Client
from qftrio.models import MAX_WORKFLOW_DEPENDENCIES, MAX_WORKFLOW_STEPS, StepStatus, WorkflowStatus

from .conftest import RunningServer

DIAMOND = [
    {"name": "a", "kind": "fetch", "payload": {"url": "u"}},
    {"name": "b", "kind": "left", "depends_on": ["a"]},
    {"name": "c", "kind": "right", "depends_on": ["a"]},
    {"name": "d", "kind": "join", "depends_on": ["b", "c"], "max_attempts": 2},
]


async def create(http: httpx.AsyncClient, server: RunningServer, steps=DIAMOND, who: str = "acme", **body) -> dict:
    body = {"name": "wf", "steps": steps, **body}
    r = await http.post("/api/v1/workflows", json=body, headers=server.headers(who))
    assert r.status_code == 201, r.text
    return r.json()


async def get(http: httpx.AsyncClient, server: RunningServer, workflow_id: str) -> dict:
    r = await http.get(f"/api/v1/workflows/{workflow_id}", headers=server.headers())
    assert r.status_code == 200, r.text
    return r.json()


async def lease(http: httpx.AsyncClient, server: RunningServer, **body) -> dict[str, dict]:
    """Lease from ``default``; returns step name -> lease item."""
    body.setdefault("max_jobs", 100)
    r = await http.post("/api/v1/queues/default/lease", json=body, headers=server.headers("worker"))
    assert r.status_code == 200, r.text
    return {item["job"]["step"]: item for item in r.json()["jobs"]}


async def report(http, server, item: dict, action: str, **body) -> httpx.Response:
    body["lease_token"] = item["lease_token"]
    return await http.post(f"/api/v1/jobs/{item['job']['id']}/{action}", json=body, headers=server.headers("worker"))


def statuses(workflow: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in workflow["steps"]}


async def test_diamond_end_to_end(http, server) -> None:
    wf = await create(http, server, context={"order": 7})
    uuid.UUID(wf["id"])
    assert (wf["tenant"], wf["name"], wf["status"], wf["context"]) == ("acme", "wf", "running", {"order": 7})
    assert wf["created_at"].endswith("Z") and wf["updated_at"] == wf["created_at"]
    assert statuses(wf) == {"a": "pending", "b": "waiting", "c": "waiting", "d": "waiting"}
    a = wf["steps"][0]
    assert a["job"]["id"] == a["job_id"] and a["payload"] == {"url": "u"} and a["depends_on"] == []
    assert (a["job"]["queue"], a["job"]["workflow_id"], a["job"]["step"]) == ("default", wf["id"], "a")
    assert a["job"]["context"] == {"order": 7}
    assert wf["steps"][3] == {
        "name": "d", "kind": "join", "payload": {}, "depends_on": ["b", "c"], "max_attempts": 2,
        "status": "waiting", "job_id": None, "added_by": None,
    }  # fmt: skip

    leased = await lease(http, server)
    assert list(leased) == ["a"]
    assert leased["a"]["job"]["context"] == {"order": 7}
    assert (await report(http, server, leased["a"], "complete", result={"fetched": "F"})).status_code == 204
    leased = await lease(http, server)
    assert sorted(leased) == ["b", "c"]
    assert all(x["job"]["context"] == {"order": 7, "fetched": "F"} for x in leased.values())
    assert (await report(http, server, leased["b"], "complete", result={"left": 1})).status_code == 204
    assert await lease(http, server) == {}  # d waits for c
    assert (await report(http, server, leased["c"], "complete", result={"right": 2})).status_code == 204
    (d,) = (await lease(http, server)).values()
    assert d["job"]["step"] == "d" and d["job"]["max_attempts"] == 2
    assert d["job"]["context"] == {"order": 7, "fetched": "F", "left": 1, "right": 2}
    assert (await report(http, server, d, "complete", result={"order": 8})).status_code == 204

    wf = await get(http, server, wf["id"])
    assert wf["status"] == "completed"
    assert wf["context"] == {"order": 8, "fetched": "F", "left": 1, "right": 2}
    assert set(statuses(wf).values()) == {"completed"}
    assert all(s["job"]["status"] == "completed" for s in wf["steps"])
    job = (await http.get(f"/api/v1/jobs/{d['job']['id']}", headers=server.headers())).json()
    assert job["workflow_id"] == wf["id"] and job["step"] == "d" and job["result"] == {"order": 8}


async def test_fan_out_fan_in_with_batch_reports(http, server) -> None:
    steps = [{"name": "split", "kind": "k"}]
    steps += [{"name": f"part{i}", "kind": "k", "payload": {"i": i}, "depends_on": ["split"]} for i in range(20)]
    steps += [{"name": "merge", "kind": "k", "depends_on": [f"part{i}" for i in range(20)]}]
    wf = await create(http, server, steps=steps)
    (split,) = (await lease(http, server)).values()
    await report(http, server, split, "complete", result={"parts": 20})
    parts = await lease(http, server)
    assert sorted(parts) == sorted(f"part{i}" for i in range(20))
    items = [
        {"id": x["job"]["id"], "lease_token": x["lease_token"], "result": {name: x["job"]["payload"]["i"]}}
        for name, x in parts.items()
    ]
    r = await http.post("/api/v1/leases/complete", json={"items": items}, headers=server.headers("worker"))
    assert [x["code"] for x in r.json()["results"]] == [204] * 20
    (merge,) = (await lease(http, server)).values()
    assert merge["job"]["step"] == "merge"
    assert merge["job"]["context"] == {"parts": 20, **{f"part{i}": i for i in range(20)}}
    await report(http, server, merge, "complete")
    assert (await get(http, server, wf["id"]))["status"] == "completed"


async def test_long_poll_wakes_when_a_step_is_unblocked(http, server) -> None:
    await create(http, server, steps=[{"name": "a", "kind": "k"}, {"name": "b", "kind": "k", "depends_on": ["a"]}])
    (a,) = (await lease(http, server)).values()
    got: list[dict] = []
    woke: list[float] = []

    async def waiter() -> None:
        got.append(await lease(http, server, wait_secs=20))
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.3)
        await report(http, server, a, "complete")
        completed = trio.current_time()
    assert list(got[0]) == ["b"]
    assert woke[0] - completed < 0.5  # the wake-up, not the 1 s safety poll


async def test_failed_step_fails_the_workflow_and_cancels_the_rest(http, server) -> None:
    steps = [
        {"name": "a", "kind": "k", "max_attempts": 1},
        {"name": "b", "kind": "k"},
        {"name": "c", "kind": "k", "depends_on": ["a"]},
    ]
    wf = await create(http, server, steps=steps)
    leased = await lease(http, server)
    r = await report(http, server, leased["a"], "fail", error="disk full")
    assert r.status_code == 204
    wf = await get(http, server, wf["id"])
    assert wf["status"] == "failed"
    assert statuses(wf) == {"a": "failed", "b": "cancelled", "c": "cancelled"}
    assert wf["steps"][0]["job"]["error"] == "disk full"
    # the running sibling's worker is told on its next heartbeat
    r = await report(http, server, leased["b"], "heartbeat", extend_secs=30)
    assert r.status_code == 200 and r.json() == {"status": "cancelled"}
    assert (await report(http, server, leased["b"], "complete")).status_code == 409
    assert await lease(http, server) == {}
    r = await http.post(f"/api/v1/workflows/{wf['id']}/cancel", headers=server.headers())
    assert r.status_code == 409


async def test_expired_lease_on_the_last_attempt_fails_the_workflow(http, server) -> None:
    steps = [{"name": "a", "kind": "k", "max_attempts": 1}, {"name": "b", "kind": "k", "depends_on": ["a"]}]
    wf = await create(http, server, steps=steps)
    await lease(http, server, lease_secs=2)
    server.clock.advance(3)
    with trio.fail_after(5):
        while (got := await get(http, server, wf["id"]))["status"] == "running":
            await trio.sleep(0.05)
    assert got["status"] == "failed" and statuses(got) == {"a": "failed", "b": "cancelled"}
    assert got["steps"][0]["job"]["error"] == "lease expired"


async def test_cancel_reaches_running_steps(http, server) -> None:
    wf = await create(http, server)
    (a,) = (await lease(http, server)).values()
    r = await http.post(f"/api/v1/workflows/{wf['id']}/cancel", headers=server.headers())
    assert r.status_code == 200
    cancelled = r.json()
    assert cancelled["status"] == "cancelled"
    assert statuses(cancelled) == {"a": "cancelled", "b": "cancelled", "c": "cancelled", "d": "cancelled"}
    r = await report(http, server, a, "heartbeat", extend_secs=30)
    assert r.status_code == 200 and r.json() == {"status": "cancelled"}
    assert (await report(http, server, a, "complete")).status_code == 409
    r = await http.post(f"/api/v1/workflows/{wf['id']}/cancel", headers=server.headers())
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    # a cancelled workflow is final
    r = await http.post(f"/api/v1/jobs/{a['job']['id']}/retry", headers=server.headers())
    assert r.status_code == 409 and "cancelled" in r.json()["error"]["message"]
    assert await lease(http, server) == {}


async def test_cancelling_a_step_job_cancels_the_workflow(http, server) -> None:
    wf = await create(http, server)
    (a,) = (await lease(http, server)).values()
    await report(http, server, a, "complete")
    b_job = (await get(http, server, wf["id"]))["steps"][1]["job_id"]
    r = await http.post(f"/api/v1/jobs/{b_job}/cancel", headers=server.headers())
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    wf = await get(http, server, wf["id"])
    assert wf["status"] == "cancelled"
    assert statuses(wf) == {"a": "completed", "b": "cancelled", "c": "cancelled", "d": "cancelled"}


async def test_retrying_the_failed_step_resumes_the_workflow(http, server) -> None:
    steps = [
        {"name": "a", "kind": "k", "max_attempts": 1},
        {"name": "b", "kind": "k"},
        {"name": "c", "kind": "k", "depends_on": ["a", "b"]},
    ]
    wf = await create(http, server, steps=steps)
    leased = await lease(http, server)
    await report(http, server, leased["a"], "fail", error="flaky", retryable=False)
    assert (await get(http, server, wf["id"]))["status"] == "failed"
    r = await http.post(f"/api/v1/jobs/{leased['b']['job']['id']}/retry", headers=server.headers())
    assert r.status_code == 409 and "step 'a'" in r.json()["error"]["message"]
    r = await http.post(f"/api/v1/jobs/{leased['a']['job']['id']}/retry", headers=server.headers())
    assert r.status_code == 200 and r.json()["status"] == "pending" and r.json()["attempt"] == 0
    wf = await get(http, server, wf["id"])
    assert wf["status"] == "running"
    assert statuses(wf) == {"a": "pending", "b": "pending", "c": "waiting"}
    leased_again = await lease(http, server)
    assert sorted(leased_again) == ["a", "b"]
    assert leased_again["b"]["job"]["id"] == leased["b"]["job"]["id"]
    # the lease held when the workflow failed is stale for good
    assert (await report(http, server, leased["b"], "complete")).status_code == 409
    for item in leased_again.values():
        assert (await report(http, server, item, "complete", result={item["job"]["step"]: "ok"})).status_code == 204
    (c,) = (await lease(http, server)).values()
    assert c["job"]["context"] == {"a": "ok", "b": "ok"}
    await report(http, server, c, "complete")
    assert (await get(http, server, wf["id"]))["status"] == "completed"


async def test_validation_is_a_422_that_stores_nothing(http, server) -> None:
    h = server.headers()
    k = "k"
    cases = [
        ({"name": "w", "steps": []}, "steps"),
        ({"steps": [{"name": "a", "kind": k}]}, "name"),
        ({"name": "w", "steps": [{"name": "a", "kind": k}, {"name": "a", "kind": k}]}, "duplicate step name 'a'"),
        ({"name": "w", "steps": [{"name": "a", "kind": k, "depends_on": ["x"]}]}, "unknown step 'x'"),
        ({"name": "w", "steps": [{"name": "a", "kind": k, "depends_on": ["a"]}]}, "depends on itself"),
        (
            {"name": "w", "steps": [
                {"name": "a", "kind": k, "depends_on": ["c"]}, {"name": "b", "kind": k, "depends_on": ["a"]},
                {"name": "c", "kind": k, "depends_on": ["b"]}, {"name": "ok", "kind": k},
            ]},
            "dependency cycle a -> c -> b -> a",
        ),  # fmt: skip
        ({"name": "w", "steps": [{"name": "a", "kind": k}, {"name": "b", "kind": k, "depends_on": ["a", "a"]}]}, "twice"),
        ({"name": "w", "steps": [{"name": "a", "kind": "bad kind"}]}, "steps.0.kind"),
        ({"name": "w", "steps": [{"name": "a/b", "kind": k}]}, "steps.0.name"),
        ({"name": "w", "steps": [{"name": "a", "kind": k, "max_attempts": 0}]}, "steps.0.max_attempts"),
        ({"name": "w", "steps": [{"name": "a", "kind": k, "payload": [1]}]}, "steps.0.payload"),
        ({"name": "w", "context": [1], "steps": [{"name": "a", "kind": k}]}, "context"),
        ({"name": "w", "steps": [{"name": "a", "kind": k, "queue": "q"}]}, "steps.0.queue"),
        ({"name": "", "steps": [{"name": "a", "kind": k}]}, "name"),
        ({"name": "w", "steps": [{"name": f"s{i}", "kind": k} for i in range(MAX_WORKFLOW_STEPS + 1)]}, "steps"),
        (
            {"name": "w", "steps": [
                {"name": f"s{i}", "kind": k, "depends_on": [f"s{j}" for j in range(max(0, i - 21), i)]}
                for i in range(MAX_WORKFLOW_STEPS)
            ]},
            f"at most {MAX_WORKFLOW_DEPENDENCIES} dependencies",
        ),  # fmt: skip
    ]
    for body, needle in cases:
        r = await http.post("/api/v1/workflows", json=body, headers=h)
        assert r.status_code == 422, body
        assert r.json()["error"]["code"] == "invalid"
        assert needle in r.json()["error"]["message"], (needle, r.json())
    r = await http.post("/api/v1/workflows", content=b'{"name": ', headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json"
    assert (await http.get("/api/v1/workflows", headers=h)).json() == {"workflows": [], "next_cursor": None}
    assert (await http.get("/api/v1/jobs", headers=h)).json()["jobs"] == []
    spec = (await http.get("/openapi.json")).json()
    assert "/api/v1/workflows" in spec["paths"] and "/api/v1/workflows/{workflow_id}/cancel" in spec["paths"]


async def test_tenant_scoping_and_credentials(http, server) -> None:
    wf = await create(http, server)
    r = await http.get(f"/api/v1/workflows/{wf['id']}", headers=server.headers("globex"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await http.post(f"/api/v1/workflows/{wf['id']}/cancel", headers=server.headers("globex"))
    assert r.status_code == 404
    assert (await http.get("/api/v1/workflows", headers=server.headers("globex"))).json()["workflows"] == []
    r = await http.get("/api/v1/workflows/not-a-uuid", headers=server.headers())
    assert r.status_code == 404
    r = await http.post("/api/v1/workflows", json={"name": "w", "steps": DIAMOND}, headers=server.headers("worker"))
    assert r.status_code == 403
    assert (await http.get("/api/v1/workflows")).status_code == 401
    # the steps' jobs belong to the workflow's tenant
    job_id = wf["steps"][0]["job_id"]
    assert (await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers("globex"))).status_code == 404
    assert (await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())).json()["tenant"] == "acme"


async def test_list_pagination_and_filters(http, server) -> None:
    ids = [(await create(http, server, name=f"w{i}"))["id"] for i in range(5)]
    await create(http, server, who="globex")
    await http.post(f"/api/v1/workflows/{ids[2]}/cancel", headers=server.headers())
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await http.get("/api/v1/workflows", params=params, headers=server.headers())).json()
        seen += [w["id"] for w in page["workflows"]]
        assert all("job" not in s for w in page["workflows"] for s in w["steps"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    r = await http.get("/api/v1/workflows", params={"status": "cancelled"}, headers=server.headers())
    assert [w["id"] for w in r.json()["workflows"]] == [ids[2]]
    for bad in ({"status": "pending"}, {"limit": "0"}, {"limit": "101"}, {"limit": "x"}, {"cursor": "garbage!"}):
        r = await http.get("/api/v1/workflows", params=bad, headers=server.headers())
        assert r.status_code == 422, bad
        assert r.json()["error"]["message"]


async def test_a_thousand_steps_over_http(http, server) -> None:
    # a root, 998 steps in parallel, and a step that waits for all of them
    steps = [{"name": "root", "kind": "k"}]
    steps += [{"name": f"m{i}", "kind": "k", "depends_on": ["root"]} for i in range(998)]
    steps += [{"name": "sink", "kind": "k", "depends_on": [f"m{i}" for i in range(998)]}]
    wf = await create(http, server, steps=steps)
    assert len(wf["steps"]) == 1000
    assert sum(1 for s in wf["steps"] if s["job_id"]) == 1
    done = 0
    with trio.fail_after(120):
        while True:
            leased = await lease(http, server)
            if not leased:
                break
            items = [{"id": x["job"]["id"], "lease_token": x["lease_token"], "result": {n: 1}} for n, x in leased.items()]
            r = await http.post("/api/v1/leases/complete", json={"items": items}, headers=server.headers("worker"))
            assert {x["code"] for x in r.json()["results"]} == {204}
            done += len(items)
    assert done == 1000
    wf = await get(http, server, wf["id"])
    assert wf["status"] == "completed" and len(wf["context"]) == 1000
    assert sum(1 for s in wf["steps"] if s["status"] == "completed") == 1000


async def test_client_methods(server) -> None:
    async with Client(server.url, server.tenants["acme"]) as client:
        wf = await client.workflow_create("via-client", DIAMOND, context={"x": 1})
        assert wf.status is WorkflowStatus.RUNNING and wf.context == {"x": 1}
        assert wf.step("a").status is StepStatus.PENDING and wf.step("a").job is not None
        assert await client.workflow_get(wf.id) == wf
        listed, cursor = await client.workflows_list(status="running", limit=10)
        assert [w.id for w in listed] == [wf.id] and cursor is None
        assert listed[0].step("a").job is None
        cancelled = await client.workflow_cancel(wf.id)
        assert cancelled.status is WorkflowStatus.CANCELLED
        with pytest.raises(errors.Conflict):
            await client.workflow_cancel(wf.id)
        with pytest.raises(errors.InvalidInput, match="cycle"):
            loop = [{"name": "a", "kind": "k", "depends_on": ["b"]}, {"name": "b", "kind": "k", "depends_on": ["a"]}]
            await client.workflow_create("loop", loop)
        with pytest.raises(errors.NotFound):
            await client.workflow_get(str(uuid.uuid4()))


async def run_cli(*argv: str) -> int:
    return await trio.to_thread.run_sync(functools.partial(main, list(argv)))


async def test_cli(server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    spec = tmp_path / "wf.json"
    spec.write_text(json.dumps({"name": "from-cli", "context": {"k": "v"}, "steps": DIAMOND}))
    assert await run_cli("workflows", "create", str(spec), *opts) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["name"] == "from-cli" and created["status"] == "running" and len(created["steps"]) == 4

    assert await run_cli("workflows", "get", created["id"], *opts) == 0
    assert json.loads(capsys.readouterr().out)["id"] == created["id"]
    assert await run_cli("workflows", "list", "--status", "running", *opts) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [w["id"] for w in listed["workflows"]] == [created["id"]] and listed["next_cursor"] is None
    assert await run_cli("workflows", "cancel", created["id"], *opts) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"

    assert await run_cli("workflows", "cancel", created["id"], *opts) == 1
    err = capsys.readouterr().err
    assert err.startswith("qftrio: 409 conflict:") and err.count("\n") == 1
    spec.write_text(json.dumps({"name": "bad", "steps": [{"name": "a", "kind": "k", "depends_on": ["nope"]}]}))
    assert await run_cli("workflows", "create", str(spec), *opts) == 1
    assert "unknown step 'nope'" in capsys.readouterr().err
    assert await run_cli("workflows", "create", str(tmp_path / "missing.json"), *opts) == 2
    assert "cannot read" in capsys.readouterr().err
    spec.write_text("{nope")
    assert await run_cli("workflows", "create", str(spec), *opts) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert await run_cli("workflows", "get", str(uuid.uuid4()), *opts) == 1
    assert "404 not_found" in capsys.readouterr().err
