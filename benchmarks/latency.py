#!/usr/bin/env python3
"""Enqueue -> handler start latency on an idle long-poll.

One ``qftrio worker`` process (lanes 1, batch 1) sits in a long poll on an
empty queue. The benchmark enqueues one job at a time (``POST /api/v1/jobs``)
carrying ``time.time()`` taken just before the request is sent; the ``stamp``
handler (``noop_handlers.py``) appends that and its own ``time.time()`` at
start to a file. Same host, same clock. After each job it waits until the
stamp is written, then ``--gap`` seconds more so that the worker has reported
and is parked in its next long poll before the next enqueue.

Example::

    .venv/bin/python benchmarks/latency.py --store sqlite --samples 200
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
    p.add_argument("--samples", type=int, default=200, help="jobs measured (default 200)")
    p.add_argument("--warmup", type=int, default=10, help="jobs run first and not counted (default 10)")
    p.add_argument("--gap", type=float, default=0.05, help="idle seconds between a job's start and the next enqueue (default 0.05)")
    p.add_argument("--wait-secs", type=float, default=20, help="the worker's --wait-secs (default 20)")
    b.add_common(p)
    return p.parse_args(argv)


def measure(args: argparse.Namespace, procs: b.Procs, database_url: str | None) -> list[float]:
    server = b.start_server(procs, store=args.store, database_url=database_url)
    queue = f"lat-{uuid.uuid4().hex[:8]}"
    stamps = procs.workdir / "stamps.txt"
    stamps.touch()
    worker = b.start_worker(
        procs, server.url, queue, lanes=1, batch=1, wait_secs=args.wait_secs,
        env={"QFTRIO_BENCH_STAMPS": str(stamps)},
    )  # fmt: skip
    latencies: list[float] = []
    with httpx.Client(base_url=server.url, headers=b.tenant_headers(), timeout=30) as client:
        total = args.warmup + args.samples
        for i in range(total):
            t = time.time()
            r = client.post("/api/v1/jobs", json={"kind": "stamp", "payload": {"t": t}, "config": {"queue": queue}})
            if r.status_code != 201:
                raise RuntimeError(f"enqueue answered {r.status_code}: {r.text[:200]}")
            deadline = time.monotonic() + (60 if i == 0 else 10)  # the first waits for the worker to start
            while True:
                lines = stamps.read_text().splitlines()
                if len(lines) > i:
                    break
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited with {worker.returncode}:\n{procs.log_tail(worker)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {i} did not start in time")
                time.sleep(0.0005)
            sent, started, _ = lines[i].split()
            if i >= args.warmup:
                latencies.append(float(started) - float(sent))
            time.sleep(args.gap if i else 1.0)
    return latencies


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("enqueue -> handler start latency, idle long-poll", args)
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        with b.pg_cluster(args.database_url if args.store == "postgres" else "unused") as base:
            db_ctx = b.fresh_database(base) if args.store == "postgres" else None
            url = db_ctx.__enter__() if db_ctx else None
            try:
                if url:
                    b.say("postgresql:", b.pg_version(url))
                lat = measure(args, procs, url)
                procs.stop_all()
            finally:
                if db_ctx:
                    db_ctx.__exit__(None, None, None)
    ms = [x * 1000 for x in lat]
    b.say(
        f"RESULT latency store={args.store} samples={len(ms)}: p50 {b.percentile(ms, 50):.2f} ms, "
        f"p90 {b.percentile(ms, 90):.2f} ms, p99 {b.percentile(ms, 99):.2f} ms, max {max(ms):.2f} ms, "
        f"min {min(ms):.2f} ms (targets p50 < 5 ms, p99 < 50 ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
