#!/usr/bin/env python3
"""What each completion costs while a workflow of steps added at run time
advances (DESIGN §4, "Steps added at run time").

A workflow ``split -> join`` is created; ``split``, leased, adds ``--steps``
steps (in calls of 1,000, their results collected under ``pages``) and
completes. Then every added step is leased (100 at a time) and completed
alone, each completion timed through the engine: a store transaction that
records it, merges its result, counts it down for ``join`` and for the
collected list. The last one also writes the whole list (``--steps`` results)
into the context and enqueues ``join``, once.

Printed per store: the median and 90th percentile cost of a completion in
each tenth of the workflow's completions, and the last tenth's median over
the first's, which stays near 1 when advancing is flat in the workflow's
size; then the same for workflows of a tenth and a hundredth the size.

Examples::

    .venv/bin/python benchmarks/workflow_growth.py
    .venv/bin/python benchmarks/workflow_growth.py --store sqlite --steps 10000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import _bench as b
import trio

from qftrio.models import CompleteItem, StepsAddRequest, WorkflowCreateRequest, WorkflowStatus
from qftrio.server.engine import Engine
from qftrio.server.store.base import Store
from qftrio.server.store.postgres import open_postgres_store
from qftrio.server.store.sqlite import open_sqlite_store

TENANT = "acme"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10_000, help="steps added to the largest workflow (default 10,000)")
    p.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    b.add_common(p)
    return p.parse_args(argv)


async def advance(engine: Engine, steps: int) -> tuple[list[float], float, float]:
    """The cost (ms) of each completion of the added steps in order, the
    cost of adding them, and that of ``split``'s completion."""
    body = WorkflowCreateRequest(
        name="pdf",
        steps=[{"name": "split", "kind": "split"}, {"name": "join", "kind": "join", "depends_on": ["split"]}],
    )
    workflow = await engine.workflow_create(TENANT, body)
    (split,) = await engine.lease("default", max_jobs=1, lease_secs=3600)
    start = time.perf_counter()
    for first in range(0, steps, 1000):
        last = min(steps, first + 1000)
        pages = [{"name": f"page-{i}", "kind": "page", "payload": {"page": i}} for i in range(first, last)]
        body = StepsAddRequest(lease_token=split.lease_token, steps=pages, collect="pages")
        await engine.steps_add(split.job.id, body)
    added = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    await engine.complete([CompleteItem(split.job.id, split.lease_token)])
    split_done = (time.perf_counter() - start) * 1000
    costs: list[float] = []
    while len(costs) < steps:
        leases = await engine.lease("default", max_jobs=100, lease_secs=3600)
        assert leases, f"{len(costs)} of {steps} completed, none pending"
        for lease in leases:
            start = time.perf_counter()
            item = CompleteItem(lease.job.id, lease.lease_token, {"page": lease.job.payload["page"]})
            (result,) = await engine.complete([item])
            costs.append((time.perf_counter() - start) * 1000)
            assert result.outcome.code() == 204
    (join,) = await engine.lease("default", max_jobs=1)
    assert join.job.step == "join" and len(join.job.context["pages"]) == steps
    await engine.complete([CompleteItem(join.job.id, join.lease_token)])
    assert (await engine.workflow_get(TENANT, workflow.id)).status is WorkflowStatus.COMPLETED
    return costs, added, split_done


def report(store: str, steps: int, costs: list[float], added: float, split_done: float) -> float:
    tenth = max(1, steps // 10)
    parts = [costs[i : i + tenth] for i in range(0, steps, tenth)]
    b.say(
        f"{store}, {steps} added steps: adding them took {added:.0f} ms,"
        f" the adding step's completion {split_done:.1f} ms"
    )
    b.say("  completions     median ms   p90 ms")
    for i, part in enumerate(parts):
        b.say(f"  {i * tenth + 1:>6}-{i * tenth + len(part):<6}   {b.median(part):8.3f} {b.percentile(part, 90):8.3f}")
    ratio = b.median(parts[-1][:-1] or parts[-1]) / b.median(parts[0])
    b.say(f"  the last completion (writes the list of {steps} results, enqueues join): {costs[-1]:.1f} ms")
    b.say(f"  last tenth's median / first tenth's: {ratio:.2f}")
    return ratio


async def measure(store_name: str, store: Store, steps: int) -> None:
    engine = Engine(store)
    await advance(engine, 10)  # warm-up: connections, statements
    for size in (steps // 100, steps // 10, steps):
        if size >= 10:
            report(store_name, size, *(await advance(engine, size)))


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.print_settings("workflow_growth: each completion of a workflow of added steps", args)
    if args.store in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:

            async def on_sqlite() -> None:
                async with open_sqlite_store(Path(tmp) / "qftrio.db") as store:
                    await measure("sqlite", store, args.steps)

            trio.run(on_sqlite)
    if args.store in ("postgres", "both"):
        with b.pg_cluster(args.database_url) as cluster, b.fresh_database(cluster) as url:

            async def on_postgres() -> None:
                async with open_postgres_store(url) as store:
                    await measure("postgres", store, args.steps)

            trio.run(on_postgres)
    return 0


if __name__ == "__main__":
    sys.exit(run())
