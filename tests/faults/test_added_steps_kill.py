"""``kill -9`` of the server between a step's add of steps and its
completion, on each store: the steps added stand, the add sent again changes
nothing, and the workflow runs every added step once and fans in all their
results (docs/workflows.md, "Steps added at run time")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from qftrio import Client
from qftrio.models import StepStatus, WorkflowStatus

from .conftest import Rig, wait_for, worker_client

pytestmark = pytest.mark.slow

PAGES = [{"name": f"page-{n}", "kind": "ok", "payload": {"page": n}} for n in range(50)]


async def test_kill_9_between_the_add_and_the_completion_loses_nothing(
    rig: Rig, store: list[str], app: Callable[[str], Client]
) -> None:
    (first,) = await rig.servers(store, "first")
    steps = [{"name": "split", "kind": "split"}, {"name": "join", "kind": "ok", "depends_on": ["split"]}]
    workflow = await app(first.url).workflow_create("pdf", steps)
    async with worker_client(first.url) as worker:
        (split,) = await worker.lease("default", lease_secs=600)
        grown = await worker.steps_add(split.job.id, split.lease_token, PAGES, collect="pages")
    assert len(grown.steps) == 52
    first.kill()

    (second,) = await rig.servers(store, "second")
    client = app(second.url)
    kept = await client.workflow_get(workflow.id)
    assert [(s.name, s.added_by, s.status) for s in kept.steps[2:]] == [
        (p["name"], "split", StepStatus.WAITING) for p in PAGES
    ]
    async with worker_client(second.url) as worker:
        # the worker, unsure its add landed, sends it again: nothing changes
        again = await worker.steps_add(split.job.id, split.lease_token, PAGES, collect="pages")
        assert [s.name for s in again.steps] == [s.name for s in grown.steps]
        await worker.complete(split.job.id, split.lease_token, {"pages": 50})
    rig.worker("w", "default", second.url, lanes=8, batch=8)

    async def done() -> bool:
        return (await client.workflow_get(workflow.id)).status is WorkflowStatus.COMPLETED

    await wait_for(done, timeout=60, what="the workflow's 50 added steps and its join")
    finished = await client.workflow_get(workflow.id)
    assert len(finished.steps) == 52 and {s.status for s in finished.steps} == {StepStatus.COMPLETED}
    pages = finished.context["pages"]
    assert len(pages) == 50 and all(page["attempt"] == 1 for page in pages)
    for step in finished.steps[2:]:
        assert step.job is not None and rig.ran(step.job.id) == {1}, step.name
    assert second.proc.poll() is None, rig.log("second")
