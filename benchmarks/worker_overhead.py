#!/usr/bin/env python3
"""CPU cost of the worker runtime itself, per job: a :class:`Worker` runs N
no-op jobs against an in-memory fake transport (no HTTP, no store). Leases
come back at once with pre-built ``Lease`` objects and every report is
acknowledged at once, so what is measured is the runtime's own machinery:
task spawns, cancel scopes, the batching, events.

Prints jobs/s (wall) and CPU microseconds per job (``time.process_time()``).
The machine may be noisy: run it several times and take the median, or
compare two versions with ``--ab DIR``: every run alternates with one of the
qftrio in DIR (a copy of another version, e.g. ``git archive main qftrio |
tar -x -C DIR``), each in a process of its own, and both medians are printed.

Example::

    .venv/bin/python benchmarks/worker_overhead.py --lanes 32 --batch 25 --jobs 20000
    .venv/bin/python benchmarks/worker_overhead.py --profile
    .venv/bin/python benchmarks/worker_overhead.py --lanes 200 --runs 8 --ab /tmp/main
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# ``--qftrio-from DIR`` (what --ab runs) imports the qftrio in DIR instead.
_FROM = sys.argv[sys.argv.index("--qftrio-from") + 1] if "--qftrio-from" in sys.argv else str(ROOT)
if _FROM not in sys.path:
    sys.path.insert(0, _FROM)

import trio

from qftrio.models import HeartbeatReply, Job, Lease, Outcome, ReportReply, Status
from qftrio.worker.registry import Registry
from qftrio.worker.runtime import Worker, WorkerEvent
from qftrio.worker.transport import CompleteItem, FailItem, HeartbeatItem, Transport


def make_leases(n: int) -> list[Lease]:
    leases = []
    for i in range(n):
        job = Job(
            id=f"job-{i:08d}",
            tenant="bench",
            queue="q",
            kind="noop",
            payload={},
            status=Status.RUNNING,
            priority=0,
            attempt=1,
            max_attempts=5,
            scheduled_at=0.0,
            created_at=0.0,
            updated_at=0.0,
        )
        leases.append(Lease(job=job, lease_token=f"token-{i:08d}"))
    return leases


class FakeTransport(Transport):
    """Hands out pre-built leases at once and acknowledges every report at
    once. Once the leases run out, a lease call waits until cancelled (the
    worker's stop() cancels it)."""

    def __init__(self, leases: list[Lease], coalesce_secs: float) -> None:
        self.coalesce_secs = coalesce_secs
        self._leases = leases
        self._next = 0
        self.completed = 0
        self.failed = 0
        self.heartbeats = 0
        self.lease_calls = 0
        self.report_calls = 0
        self.all_done = trio.Event()

    async def lease(
        self, queue: str, *, max_jobs: int, lease_secs: int, wait_secs: float, worker_id: str | None
    ) -> list[Lease]:
        self.lease_calls += 1
        if self._next >= len(self._leases):
            await trio.sleep_forever()
        out = self._leases[self._next : self._next + max_jobs]
        self._next += len(out)
        return out

    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatReply]:
        self.heartbeats += len(items)
        return [HeartbeatReply(job_id=i.job_id, outcome=Outcome.OK, status="running") for i in items]

    def _count(self, n: int) -> None:
        self.report_calls += 1
        if self.completed + self.failed >= len(self._leases):
            self.all_done.set()

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportReply]:
        self.completed += len(items)
        self._count(len(items))
        return [ReportReply(job_id=i.job_id, outcome=Outcome.OK) for i in items]

    async def fail(self, items: Sequence[FailItem]) -> list[ReportReply]:
        self.failed += len(items)
        self._count(len(items))
        return [ReportReply(job_id=i.job_id, outcome=Outcome.OK) for i in items]

    async def snooze(self, items: Sequence[Any]) -> list[ReportReply]:
        return await self.fail(items)


def make_registry() -> Registry:
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Job) -> dict[str, Any]:
        return {}

    return reg


async def one_run(args: argparse.Namespace, leases: list[Lease]) -> tuple[float, float, FakeTransport]:
    transport = FakeTransport(leases, args.coalesce)
    events: list[WorkerEvent] = []
    on_event = events.append if args.on_event else None
    worker = Worker(
        transport,
        "q",
        make_registry(),
        lanes=args.lanes,
        batch=args.batch,
        lease_secs=60,
        wait_secs=20,
        worker_id="bench",
        on_event=on_event,
    )
    with trio.fail_after(args.timeout):
        async with trio.open_nursery() as nursery:
            wall0, cpu0 = time.perf_counter(), time.process_time()
            await nursery.start(worker.run)
            await transport.all_done.wait()
            worker.stop()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if transport.completed != len(leases) or transport.failed:
        raise SystemExit(f"expected {len(leases)} completions, got {transport.completed} (+{transport.failed} failed)")
    return wall, cpu, transport


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lanes", type=int, default=32)
    p.add_argument("--batch", type=int, default=None, help="the worker's batch (default: its own, the free lanes)")
    p.add_argument("--jobs", type=int, default=20000, help="no-op jobs per run")
    p.add_argument("--runs", type=int, default=5, help="runs; the median is reported")
    p.add_argument("--coalesce", type=float, default=Transport.coalesce_secs, help="the transport's coalesce_secs")
    p.add_argument("--on-event", action="store_true", help="pass an on_event callback (a list's append)")
    p.add_argument("--profile", action="store_true", help="cProfile one run, print the top 25 by own time")
    p.add_argument("--ab", metavar="DIR", help="alternate every run with one of the qftrio in DIR; print both medians")
    p.add_argument("--qftrio-from", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    if args.ab:
        ab(args)
        return

    print(
        f"worker_overhead: lanes={args.lanes} batch={args.batch or 'free lanes'} jobs={args.jobs} runs={args.runs} "
        f"coalesce={args.coalesce:g}s on_event={'yes' if args.on_event else 'no'} "
        f"profile={'yes' if args.profile else 'no'} python={sys.version.split()[0]} trio={trio.__version__}"
    )
    leases = make_leases(args.jobs)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        wall, cpu, t = trio.run(one_run, args, leases)
        prof.disable()
        print(
            f"profiled run: {args.jobs / wall:,.0f} jobs/s, {cpu / args.jobs * 1e6:.1f} us CPU/job (with profiler overhead)"
        )
        stats = pstats.Stats(prof).strip_dirs()
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)
        return
    rates, costs = [], []
    for n in range(1, args.runs + 1):
        wall, cpu, t = trio.run(one_run, args, leases)
        rate, cost = args.jobs / wall, cpu / args.jobs * 1e6
        rates.append(rate)
        costs.append(cost)
        print(
            f"run {n}: {rate:9,.0f} jobs/s  {cost:6.1f} us CPU/job  "
            f"(lease calls {t.lease_calls}, report calls {t.report_calls}, heartbeats {t.heartbeats})"
        )
    print(
        f"median: {statistics.median(rates):,.0f} jobs/s  {statistics.median(costs):.1f} us CPU/job"
        f"  (best {max(rates):,.0f} jobs/s, {min(costs):.1f} us CPU/job)"
    )


def ab(args: argparse.Namespace) -> None:
    """Alternate runs of this tree's qftrio (A) and DIR's (B), one process
    per run, and print the CPU per job of each side."""
    passed = ["--lanes", str(args.lanes), "--jobs", str(args.jobs), "--coalesce", str(args.coalesce)]
    passed += ["--timeout", str(args.timeout), *(["--batch", str(args.batch)] if args.batch else [])]
    passed += ["--on-event"] if args.on_event else []
    sides = {"A": str(ROOT), "B": os.path.abspath(args.ab)}
    costs: dict[str, list[float]] = {side: [] for side in sides}
    print(f"worker_overhead --ab: A={sides['A']} B={sides['B']} runs={args.runs} args={' '.join(passed) or '-'}")
    for n in range(1, args.runs + 1):
        for side, where in sides.items():
            out = subprocess.run(
                [sys.executable, __file__, *passed, "--runs", "1", "--qftrio-from", where],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            found = re.search(r"^run 1: .*?([0-9.]+) us CPU/job", out, re.M)
            if found is None:
                raise SystemExit(f"no figure in the output of side {side}:\n{out}")
            costs[side].append(float(found.group(1)))
            print(f"run {n} {side}: {costs[side][-1]:6.1f} us CPU/job")
    a, b = statistics.median(costs["A"]), statistics.median(costs["B"])
    print(f"median: A {a:.1f} us CPU/job, B {b:.1f} us CPU/job (A/B {a / b:.2f})")


if __name__ == "__main__":
    main()
