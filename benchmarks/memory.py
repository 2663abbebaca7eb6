#!/usr/bin/env python3
"""Memory: server RSS with 1M pending jobs (both stores), and a worker's RSS
sampled while it runs 100,000 jobs.

Server: the pending rows are bulk-loaded straight into the database, then a
real ``qftrio serve`` starts on it; its RSS (VmRSS) is read after start-up, and
again after it has served lease calls (1 and 25 jobs), queue stats, a job
listing and a 1,000-job enqueue batch.

Worker: ``--worker-jobs`` no-op jobs are enqueued (embedded store), one
``qftrio worker`` drains them, and its RSS is sampled every ``--interval``
seconds with the number of jobs completed so far. Flat means the RSS after the
first 10 % of the jobs grows by less than 10 % (and 10 MiB) to the end.

Example::

    .venv/bin/python benchmarks/memory.py --pending 1000000 --worker-jobs 100000
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
    p.add_argument("--stores", default="sqlite,postgres", help="stores for the server part (default sqlite,postgres; empty to skip)")
    p.add_argument("--pending", type=int, default=1_000_000, help="pending rows for the server part (default 1000000)")
    p.add_argument("--worker-jobs", type=int, default=100_000, help="jobs for the worker part (default 100000; 0 to skip)")
    p.add_argument("--lanes", type=int, default=32, help="the worker's --lanes (default 32)")
    p.add_argument("--batch", type=int, default=25, help="the worker's --batch (default 25)")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between worker RSS samples (default 3)")
    p.add_argument("--worker-log-level", default="WARNING", help="the worker's --log-level (default WARNING)")
    b.add_common(p)
    return p.parse_args(argv)


def exercise(url: str, queue: str) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        for n in (1, 25) * 10:
            r = c.post(f"/api/v1/queues/{queue}/lease", headers=b.worker_headers(), json={"max_jobs": n, "wait_secs": 0})
            r.raise_for_status()
        c.get(f"/api/v1/queues/{queue}/stats", headers=b.tenant_headers()).raise_for_status()
        c.get("/api/v1/queues", headers=b.tenant_headers()).raise_for_status()
        c.get("/api/v1/jobs", params={"limit": 1000}, headers=b.tenant_headers()).raise_for_status()
        r = c.post(
            "/api/v1/jobs/batch",
            headers=b.tenant_headers(),
            json={"jobs": [{"kind": "noop", "config": {"queue": queue}}] * 1000},
        )
        r.raise_for_status()


def server_part(store: str, args: argparse.Namespace, procs: b.Procs, db_url: str | None) -> dict:
    queue = "mem"
    path = procs.workdir / f"mem-{store}.db"
    if store == "sqlite":
        b.sqlite_init(path, procs)
        t = b.sqlite_bulk_pending(path, queue, args.pending)
    else:
        init = b.start_server(procs, store="postgres", database_url=db_url, name="init")
        procs.stop(init.proc)
        t = b.pg_bulk_pending(db_url, queue, args.pending)
    b.say(f"[{store}] loaded {args.pending:,} pending rows in {t:.1f}s")
    server = b.start_server(procs, store=store, database_url=db_url, sqlite_path=path, name=f"mem-{store}")
    time.sleep(2)
    idle = b.rss_mib(server.pid)
    t0 = time.perf_counter()
    exercise(server.url, queue)
    busy = b.rss_mib(server.pid)
    b.say(
        f"[{store}] server RSS with {args.pending:,} pending: {idle:.1f} MiB after start, {busy:.1f} MiB after "
        f"leases, stats, a 1,000-job listing and a 1,000-job enqueue ({time.perf_counter() - t0:.1f}s)"
    )
    procs.stop(server.proc)
    return {"store": store, "idle": idle, "busy": busy}


def worker_part(args: argparse.Namespace, procs: b.Procs) -> list[tuple[float, int, float, float]]:
    server = b.start_server(procs, store="sqlite", name="wserver")
    queue = f"wmem-{uuid.uuid4().hex[:6]}"
    t = b.enqueue_noop(server.url, queue, args.worker_jobs)
    b.say(f"[worker] enqueued {args.worker_jobs:,} jobs in {t:.1f}s")
    worker = b.start_worker(procs, server.url, queue, lanes=args.lanes, batch=args.batch, log_level=args.worker_log_level)
    samples = []
    t0 = time.monotonic()
    deadline = t0 + max(120.0, args.worker_jobs / 200)
    while True:
        time.sleep(args.interval)
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode}:\n{procs.log_tail(worker)}")
        counts = b.queue_counts(server.url, queue)
        done = counts["completed"] + counts["failed"]
        sample = (time.monotonic() - t0, done, b.rss_mib(worker.pid), b.rss_mib(server.pid))
        samples.append(sample)
        b.say(f"[worker] t={sample[0]:6.1f}s completed={done:>7,} worker RSS {sample[2]:6.1f} MiB  server RSS {sample[3]:6.1f} MiB")
        if done >= args.worker_jobs:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not finish in time")
    procs.stop_many([worker, server.proc])
    return samples


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("memory", args)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    servers = []
    samples: list = []
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        if "sqlite" in stores:
            servers.append(server_part("sqlite", args, procs, None))
        if "postgres" in stores:
            with b.pg_cluster(args.database_url) as base, b.fresh_database(base) as url:
                b.say("postgresql:", b.pg_version(url))
                servers.append(server_part("postgres", args, procs, url))
        if args.worker_jobs:
            samples = worker_part(args, procs)
        procs.stop_all()
    for s in servers:
        peak = max(s["idle"], s["busy"])
        b.say(
            f"RESULT memory server store={s['store']} pending={args.pending:,}: RSS {s['idle']:.1f} MiB idle, "
            f"{s['busy']:.1f} MiB after use (target < 200 MB: {'met' if peak * 1.048576 < 200 else 'NOT met'})"
        )
    if samples:
        base_sample = next((s for s in samples if s[1] >= args.worker_jobs * 0.1), samples[0])
        last = samples[-1]
        growth = last[2] - base_sample[2]
        flat = growth < max(10.0, 0.1 * base_sample[2])
        b.say(
            f"RESULT memory worker jobs={args.worker_jobs:,}: RSS {samples[0][2]:.1f} MiB first sample, "
            f"{base_sample[2]:.1f} MiB at {base_sample[1]:,} jobs, {last[2]:.1f} MiB at {last[1]:,} jobs, "
            f"max {max(s[2] for s in samples):.1f} MiB: {'flat' if flat else 'GROWING'} ({growth:+.1f} MiB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
