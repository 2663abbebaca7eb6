"""Steps added at run time (DESIGN §4, docs/workflows.md "Fan-out and fan-in")
over real HTTP, on every backend: a running step adds steps to its workflow
through the worker protocol, and the workflow waits for them."""

from __future__ import annotations

import json
import random

import pytest
import trio

from qftrio.client import Client
from qftrio.models import Job
from qftrio.server import workflows
from qftrio.worker import HttpTransport, Registry, open_worker

from .test_workflows import create, get, lease, report, run_cli, statuses

SPLIT_JOIN = [
    {"name": "split", "kind": "split"},
    {"name": "join", "kind": "join", "depends_on": ["split"]},
]


def pages(n: int, prefix: str = "page") -> list[dict]:
    return [{"name": f"{prefix}-{i}", "kind": "page", "payload": {"page": i}} for i in range(n)]


async def add(http, server, item: dict, steps: list[dict], **body):
    return await report(http, server, item, "steps", steps=steps, **body)


async def started(http, server, steps=SPLIT_JOIN, **body) -> tuple[dict, dict]:
    """A workflow and the lease of its first step."""
    wf = await create(http, server, steps=steps, **body)
    first = steps[0]["name"]
    return wf, (await lease(http, server))[first]


async def complete_all(http, server, expect: int, order: random.Random | None = None) -> dict[str, dict]:
    """Lease and complete every pending step, *expect* of them, with the
    result ``{"page": n}`` of their payload, in batches (shuffled by
    *order*); returns their leases by step."""
    done: dict[str, dict] = {}
    while len(done) < expect:
        leased = list((await lease(http, server)).values())
        assert leased, f"{len(done)} of {expect} steps leased"
        if order is not None:
            order.shuffle(leased)
        items = [
            {"id": item["job"]["id"], "lease_token": item["lease_token"],
             "result": {"page": item["job"]["payload"]["page"]}}  # fmt: skip
            for item in leased
        ]
        r = await http.post("/api/v1/leases/complete", json={"items": items}, headers=server.headers("worker"))
        assert r.status_code == 200 and {x["code"] for x in r.json()["results"]} == {204}, r.text
        done.update((item["job"]["step"], item) for item in leased)
    return done


async def test_fan_out_of_1000_and_fan_in_sees_every_result_in_order(http, server) -> None:
    wf, split = await started(http, server, context={"pdf": "report.pdf"})
    r = await add(http, server, split, pages(1000), collect="pages")
    assert r.status_code == 201, r.text
    grown = r.json()
    assert len(grown["steps"]) == 1002 and grown["id"] == wf["id"]
    assert [s["added_by"] for s in grown["steps"][:3]] == [None, None, "split"]
    assert grown["steps"][2] == {
        "name": "page-0", "kind": "page", "payload": {"page": 0}, "depends_on": [], "max_attempts": 5,
        "status": "waiting", "job_id": None, "added_by": "split",
    }  # fmt: skip
    # nothing runs before the adding step completes
    assert await lease(http, server) == {}
    assert (await report(http, server, split, "complete", result={"pages_total": 1000})).status_code == 204
    mid = await get(http, server, wf["id"])
    assert statuses(mid)["join"] == "waiting" and statuses(mid)["page-999"] == "pending"
    # completed in a shuffled order: the list follows the order added
    await complete_all(http, server, 1000, random.Random(7))
    join = (await lease(http, server))["join"]
    context = join["job"]["context"]
    assert context["pages"] == [{"page": i} for i in range(1000)]
    assert (context["pdf"], context["pages_total"]) == ("report.pdf", 1000)
    assert (await report(http, server, join, "complete")).status_code == 204
    done = await get(http, server, wf["id"])
    assert done["status"] == "completed" and set(statuses(done).values()) == {"completed"}
    assert done["context"]["pages"] == context["pages"]


async def test_a_retried_add_changes_nothing(http, server) -> None:
    wf, split = await started(http, server)
    first = await add(http, server, split, pages(3), collect="pages")
    assert first.status_code == 201
    again = await add(http, server, split, pages(3), collect="pages")
    assert again.status_code == 201 and again.json()["steps"] == first.json()["steps"]
    # the same names with other fields, or another key: the add landed, this is not its replay
    other = pages(3)
    other[1]["payload"] = {"page": 99}
    for steps, body in ((other, {"collect": "pages"}), (pages(3), {"collect": "other"}), (pages(3), {})):
        r = await add(http, server, split, steps, **body)
        assert r.status_code == 409 and "a retried add must send the same steps" in r.json()["error"]["message"], r.text
    # more steps under the same token are a further add
    assert (await add(http, server, split, pages(2, "extra"), collect="pages")).status_code == 201
    # the workflow waits for each once
    assert (await report(http, server, split, "complete")).status_code == 204
    await complete_all(http, server, 5)
    join = (await lease(http, server))["join"]
    assert join["job"]["context"]["pages"] == [{"page": i} for i in (0, 1, 2, 0, 1)]
    assert len((await get(http, server, wf["id"]))["steps"]) == 7


async def test_an_added_step_that_fails_fails_the_workflow_and_cancels_the_rest(http, server) -> None:
    wf, split = await started(http, server)
    assert (await add(http, server, split, pages(3) + [
        {"name": "after", "kind": "page", "payload": {"page": 3}, "depends_on": ["page-0"]},
    ])).status_code == 201  # fmt: skip
    assert (await report(http, server, split, "complete")).status_code == 204
    leased = await lease(http, server)
    assert sorted(leased) == ["page-0", "page-1", "page-2"]
    assert (await report(http, server, leased["page-0"], "complete", result={})).status_code == 204
    assert (await report(http, server, leased["page-1"], "fail", error="torn page", retryable=False)).status_code == 204
    failed = await get(http, server, wf["id"])
    assert failed["status"] == "failed"
    assert statuses(failed) == {
        "split": "completed", "join": "cancelled", "page-0": "completed", "page-1": "failed", "page-2": "cancelled",
        "after": "cancelled",
    }  # fmt: skip
    # the still running page learns it as any cancelled job does
    r = await report(http, server, leased["page-2"], "heartbeat", extend_secs=30)
    assert r.json()["status"] == "cancelled"
    assert await lease(http, server) == {}


async def test_an_add_after_the_lease_was_lost_is_409_and_adds_nothing(http, server) -> None:
    wf, split = await started(http, server, steps=SPLIT_JOIN)
    server.clock.advance(120)  # past the 60 s lease
    again = (await lease(http, server))["split"]
    r = await add(http, server, split, pages(2))
    assert r.status_code == 409 and r.json()["error"]["code"] == "lease_lost", r.text
    assert len((await get(http, server, wf["id"]))["steps"]) == 2
    # the current holder adds; the workflow cancelled, it cannot any more
    assert (await add(http, server, again, pages(1))).status_code == 201
    r = await http.post(f"/api/v1/workflows/{wf['id']}/cancel", headers=server.headers())
    assert r.status_code == 200 and statuses(r.json())["page-0"] == "cancelled"
    r = await add(http, server, again, pages(1, "late"))
    assert r.status_code == 409 and "cancelled" in r.json()["error"]["message"], r.text
    assert len((await get(http, server, wf["id"]))["steps"]) == 3


async def test_added_steps_may_depend_on_each_other_and_on_completed_steps(http, server) -> None:
    steps = [
        {"name": "a", "kind": "k"},
        {"name": "s", "kind": "k", "depends_on": ["a"]},
        {"name": "t", "kind": "k", "depends_on": ["a"]},
    ]
    wf = await create(http, server, steps=steps)
    assert (await report(http, server, (await lease(http, server))["a"], "complete")).status_code == 204
    leased = await lease(http, server)
    s = leased["s"]
    r = await add(http, server, s, [
        {"name": "x", "kind": "k", "depends_on": ["a"]},
        {"name": "y", "kind": "k", "depends_on": ["x", "a"]},
    ])  # fmt: skip
    assert r.status_code == 201, r.text
    assert (await report(http, server, s, "complete")).status_code == 204
    assert list(await lease(http, server)) == ["x"]
    assert statuses(await get(http, server, wf["id"]))["y"] == "waiting"


@pytest.mark.parametrize(
    ("steps", "body", "message"),
    [
        ([{"name": "split", "kind": "k"}], {}, "the workflow already has a step 'split'"),
        ([{"name": "x", "kind": "k", "depends_on": ["join"]}], {}, "which has not completed"),
        ([{"name": "x", "kind": "k", "depends_on": ["nope"]}], {}, "unknown step 'nope'"),
        ([{"name": "x", "kind": "k"}, {"name": "x", "kind": "k"}], {}, "duplicate step name 'x'"),
        (
            [{"name": "x", "kind": "k", "depends_on": ["y"]}, {"name": "y", "kind": "k", "depends_on": ["x"]}],
            {},
            "cycle",
        ),
        ([{"name": "x", "kind": "k"}], {"collect": "bad key!"}, "collect"),
        ([], {}, "steps"),
    ],
)
async def test_steps_that_do_not_fit_are_422_and_add_nothing(http, server, steps, body, message) -> None:
    wf, split = await started(http, server)
    r = await add(http, server, split, steps, **body)
    assert r.status_code == 422 and message in r.text, r.text
    assert len((await get(http, server, wf["id"]))["steps"]) == 2


async def test_the_caps(http, server, monkeypatch) -> None:
    wf, split = await started(http, server)
    r = await add(http, server, split, pages(1001))
    assert r.status_code == 422 and "steps" in r.text
    monkeypatch.setattr(workflows, "MAX_WORKFLOW_GROWN", 10)
    assert (await add(http, server, split, pages(10))).status_code == 201
    r = await add(http, server, split, pages(1, "more"))
    message = "at most 10 steps are added to a workflow; 10 were, 1 more asked"
    assert r.status_code == 422 and message in r.json()["error"]["message"], r.text


async def test_a_collect_key_belongs_to_one_step_and_jobs_outside_workflows_add_nothing(http, server) -> None:
    steps = [{"name": "a", "kind": "k"}, {"name": "b", "kind": "k"}]
    await create(http, server, steps=steps)
    leased = await lease(http, server)
    assert (await add(http, server, leased["a"], pages(1, "a"), collect="pages")).status_code == 201
    r = await add(http, server, leased["b"], pages(1, "b"), collect="pages")
    assert r.status_code == 422 and "step 'a' collects under 'pages' already" in r.text
    r = await http.post("/api/v1/jobs", json={"kind": "plain"}, headers=server.headers())
    leased = await http.post("/api/v1/queues/default/lease", json={}, headers=server.headers("worker"))
    plain = leased.json()["jobs"][0]
    r = await add(http, server, plain, pages(1))
    assert r.status_code == 422 and "not a workflow step" in r.text
    r = await http.post(
        "/api/v1/jobs/00000000-0000-0000-0000-000000000000/steps",
        json={"lease_token": "t", "steps": pages(1)}, headers=server.headers("worker"),
    )  # fmt: skip
    assert r.status_code == 404
    r = await http.post(
        f"/api/v1/jobs/{plain['job']['id']}/steps", json={"lease_token": "t", "steps": pages(1)}, headers=server.headers()
    )
    assert r.status_code == 403


async def test_the_python_runtime_fans_out_a_pdfs_pages_and_fans_in_their_thumbnails(http, server) -> None:
    reg = Registry()

    @reg.handler("split-pdf")
    async def split_pdf(job: Job) -> dict:
        count = job.payload["pages"]
        pages = [{"name": f"page-{n}", "kind": "thumbnail", "payload": {"page": n}} for n in range(count)]
        await job.add_steps(pages, collect="thumbnails")
        return {"pages": len(pages)}

    @reg.handler("thumbnail")
    async def thumbnail(job: Job) -> dict:
        return {"url": f"thumbs/{job.payload['page']}.png"}

    @reg.handler("zip")
    async def zip_(job: Job) -> dict:
        return {"zipped": [t["url"] for t in job.context["thumbnails"]]}

    steps = [
        {"name": "split", "kind": "split-pdf", "payload": {"pages": 40}},
        {"name": "zip", "kind": "zip", "depends_on": ["split"]},
    ]
    wf = await create(http, server, steps=steps)
    async with Client(server.url, server.worker_token) as worker_client:
        async with open_worker(HttpTransport(worker_client), "default", reg, lanes=8, lease_secs=30, wait_secs=1):
            with trio.fail_after(60):
                while (done := await get(http, server, wf["id"]))["status"] == "running":
                    await trio.sleep(0.05)
    assert done["status"] == "completed"
    assert done["context"]["zipped"] == [f"thumbs/{n}.png" for n in range(40)]
    assert [s["added_by"] for s in done["steps"]] == [None, None] + ["split"] * 40


async def test_the_cli_shows_added_steps_with_added_by(http, server, capsys: pytest.CaptureFixture[str]) -> None:
    wf, split = await started(http, server)
    assert (await add(http, server, split, pages(2))).status_code == 201
    assert await run_cli("workflows", "get", wf["id"], "--url", server.url, "--token", server.tenants["acme"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(s["name"], s["added_by"]) for s in shown["steps"]] == [
        ("split", None), ("join", None), ("page-0", "split"), ("page-1", "split"),
    ]  # fmt: skip


async def test_a_handler_run_again_adds_the_same_steps_again_and_nothing_changes(http, server) -> None:
    wf, split = await started(http, server)
    assert (await add(http, server, split, pages(3), collect="pages")).status_code == 201
    assert (await report(http, server, split, "fail", error="crashed", retry_in_secs=0)).status_code == 204
    again = (await lease(http, server))["split"]
    assert again["lease_token"] != split["lease_token"]
    r = await add(http, server, again, pages(3), collect="pages")
    assert r.status_code == 201 and len(r.json()["steps"]) == 5
    # the first attempt's token is stale now, even for the same steps
    r = await add(http, server, split, pages(3), collect="pages")
    assert r.status_code == 409 and r.json()["error"]["code"] == "lease_lost"
    assert (await report(http, server, again, "complete")).status_code == 204
    await complete_all(http, server, 3)
    assert (await lease(http, server))["join"]["job"]["context"]["pages"] == [{"page": i} for i in range(3)]
