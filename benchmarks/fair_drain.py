#!/usr/bin/env python3
"""Fair tenants' cost: drain N no-op jobs of one queue enqueued by one tenant,
and the same N spread over T tenants (a lease then serves them in turn),
alternating the two, with W remote ``qftrio worker`` processes over HTTP.

Each run uses a fresh queue, and the two sides take turns to go first. The
jobs are enqueued through ``POST /api/v1/jobs/batch`` (the tenants' batches
interleaved), then the workers start and drain it. The drain rate is completions per second between
the first and the last completion (the rows' ``updated_at``), as in
``throughput.py``; the medians of both sides and their ratio are printed, with
the server's CPU per job of the drain (from ``/proc``, which a busy machine
disturbs far less than the rates).

Example::

    .venv/bin/python benchmarks/fair_drain.py --store postgres --tenants 10 --runs 3
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import httpx

import _bench as b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--jobs", "-n", type=int, default=20_000, help="jobs per run (default 20000)")
    p.add_argument("--tenants", "-t", type=int, default=10, help="tenants of the fair side (default 10)")
    p.add_argument("--workers", "-w", type=int, default=2, help="qftrio worker processes (default 2)")
    p.add_argument("--runs", "-r", type=int, default=3, help="runs of each side; the medians are reported (default 3)")
    p.add_argument("--profile-server", metavar="PREFIX", help="record the server with py-spy during each side's drain of run 1, into PREFIX-1.txt and PREFIX-T.txt (raw collapsed stacks, see profile_summary.py)")
    b.add_common(p)
    return p.parse_args(argv)


def token(i: int) -> str:
    return f"fair-tenant-{i:03d}-token"


def enqueue(url: str, queue: str, n: int, tenants: int) -> None:
    """*n* jobs of *queue*, 1000 per call, the tenants' calls in turn."""
    clients = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token(i)}"}, timeout=120) for i in range(tenants)]
    try:
        left = n
        call = 0
        while left:
            k = min(1000, left)
            r = clients[call % tenants].post(
                "/api/v1/jobs/batch", json={"jobs": [{"kind": "noop", "payload": {}, "config": {"queue": queue}}] * k}
            )
            if r.status_code != 201:
                raise RuntimeError(f"enqueue answered {r.status_code}: {r.text[:300]}")
            left -= k
            call += 1
    finally:
        for c in clients:
            c.close()


def one_run(
    args: argparse.Namespace, procs: b.Procs, server: b.Server, tenants: int, url: str | None, profile: str | None
) -> tuple[float, float]:
    """The drain's rate (jobs/s) and the server's CPU per job (µs)."""
    queue = f"fair{tenants}-{uuid.uuid4().hex[:8]}"
    enqueue(server.url, queue, args.jobs, tenants)
    before = b.reports_seen([server.url])
    spy = b.start_pyspy(procs, profile, server.pid) if profile else None
    cpu = b.cpu_seconds(server.pid)
    workers = [b.start_worker(procs, server.url, queue, lanes=None, batch=None) for _ in range(args.workers)]
    deadline = time.monotonic() + max(60.0, args.jobs / 100)
    while b.reports_seen([server.url]) - before < args.jobs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not drained in time: {b.queue_counts(server.url, queue)}")
        time.sleep(0.2)
    cpu = b.cpu_seconds(server.pid) - cpu
    procs.stop_many(workers)
    if spy is not None:
        b.stop_pyspy(procs, spy)
    n, first, last = b.completed_span(args.store, queue, database_url=url, sqlite_path=procs.workdir / "qftrio.db")
    return (n - 1) / (last - first) if last > first else float("nan"), cpu / args.jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("fair_drain", args)
    rates: dict[int, list[float]] = {1: [], args.tenants: []}
    cpus: dict[int, list[float]] = {1: [], args.tenants: []}
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        cluster = db = None
        url = None
        if args.store == "postgres":
            cluster = b.pg_cluster(args.database_url)
            db = b.fresh_database(cluster.__enter__())
            url = db.__enter__()
        try:
            extra = [f for i in range(args.tenants) for f in ("--tenant", f"t{i}={token(i)}")]
            server = b.start_server(procs, store=args.store, database_url=url, extra=extra)
            for run in range(1, args.runs + 1):
                # ABBA: whichever side runs second in a run finds the table
                # bigger (the drained jobs stay), so the sides take turns
                for tenants in list(rates) if run % 2 else list(rates)[::-1]:
                    profile = f"{args.profile_server}-{tenants}.txt" if args.profile_server and run == 1 else None
                    rate, cpu = one_run(args, procs, server, tenants, url, profile)
                    rates[tenants].append(rate)
                    cpus[tenants].append(cpu)
                    b.say(f"run {run}: {tenants} tenant(s): processed {rate:,.0f} jobs/s, server CPU {cpu:.1f} µs/job")
        finally:
            procs.stop_all()
            if db is not None:
                db.__exit__(None, None, None)
            if cluster is not None:
                cluster.__exit__(None, None, None)
    one, many = (b.median(rates[t]) for t in rates)
    cpu_one, cpu_many = (b.median(cpus[t]) for t in cpus)
    b.say(
        f"RESULT fair_drain store={args.store} jobs={args.jobs} workers={args.workers} runs={args.runs}: "
        f"1 tenant {one:,.0f} jobs/s, {args.tenants} tenants {many:,.0f} jobs/s (median), ratio {many / one:.2f}; "
        f"server CPU 1 tenant {cpu_one:.1f} µs/job, {args.tenants} tenants {cpu_many:.1f} µs/job (median)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
