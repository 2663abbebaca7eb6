#!/usr/bin/env python3
"""Throughput: enqueue N no-op jobs in batches, then drain them with W remote
``qftrio worker`` processes over HTTP.

Each run uses a fresh queue: the N jobs are enqueued through
``POST /api/v1/jobs/batch`` (one call at a time), then the workers start and
drain the queue. Reported per run and as the median of the runs:

* enqueue rate: N / the time the batch calls took;
* processed jobs/s: completions per second between the first and the last
  completion, from the rows' ``updated_at`` (server clock), so worker
  start-up is not counted;
* wall jobs/s: N / (workers started .. all completed), start-up included.

The workers run with their own defaults unless ``--lanes``/``--batch`` say
otherwise. ``--ab DIR`` alternates every run with one whose workers import
qftrio from DIR (a copy of another version, e.g. ``git archive HEAD qftrio |
tar -x -C DIR``), on the same server, and prints both medians: an A/B of the
worker on a noisy machine.

Examples::

    .venv/bin/python benchmarks/throughput.py                      # embedded store
    .venv/bin/python benchmarks/throughput.py --store postgres --servers 2 --workers 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import _bench as b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--jobs", "-n", type=int, default=20_000, help="jobs per run (default 20000)")
    p.add_argument("--enqueue-batch", type=int, default=1000, help="jobs per enqueue call (default 1000)")
    p.add_argument("--workers", "-w", type=int, default=2, help="qftrio worker processes (default 2)")
    p.add_argument("--lanes", type=int, default=None, help="--lanes of each worker (default: the worker's own)")
    p.add_argument("--batch", type=int, default=None, help="--batch of each worker (default: the worker's own)")
    p.add_argument("--runs", "-r", type=int, default=3, help="runs; the median is reported (default 3)")
    p.add_argument("--servers", "-k", type=int, default=1, help="qftrio serve processes (PostgreSQL only; default 1)")
    p.add_argument("--pool-size", type=int, default=None, help="--pool-size of each server (PostgreSQL)")
    p.add_argument("--worker-log-level", default="WARNING", help="--log-level of the workers (default WARNING; the CLI's own default is INFO)")
    p.add_argument("--profile-server", metavar="SVG", help="record the (first) server with py-spy during run 1 (.svg flame graph, or .txt for raw collapsed stacks)")
    p.add_argument("--profile-worker", metavar="SVG", help="record the first worker with py-spy during run 1 (.svg or .txt)")
    p.add_argument("--profile-gil", action="store_true", help="profile only the thread holding the GIL (py-spy --gil)")
    p.add_argument("--ab", metavar="DIR", help="alternate every run with one whose workers import qftrio from DIR (a copy of another version); both medians are printed")
    b.add_common(p)
    args = p.parse_args(argv)
    if args.store == "sqlite" and args.servers != 1:
        p.error("--servers > 1 needs --store postgres (one process owns a SQLite file)")
    return args


def one_run(args, procs: b.Procs, servers: list[b.Server], run: int, database_url: str | None,
            worker_env: dict[str, str] | None = None) -> dict:  # fmt: skip
    queue = f"tp{run}-{uuid.uuid4().hex[:8]}"
    enqueue_secs = b.enqueue_noop(servers[0].url, queue, args.jobs, batch=args.enqueue_batch)
    started = time.perf_counter()
    cpu_before = {s.pid: b.cpu_seconds(s.pid) for s in servers}
    urls = [s.url for s in servers]
    reports_before = b.reports_seen(urls)
    # the benchmark's own cluster only: others' test clusters count for nothing
    postmaster = b.postmaster_of(database_url) if args.store == "postgres" else 0
    pg_before = b.cluster_cpu_seconds(postmaster) if postmaster else 0.0
    workers = [
        b.start_worker(procs, servers[i % len(servers)].url, queue, lanes=args.lanes, batch=args.batch,
                       log_level=args.worker_log_level, env=worker_env)
        for i in range(args.workers)
    ]  # fmt: skip
    spies = []
    if run == 1:
        for path, pid in ((args.profile_server, servers[0].pid), (args.profile_worker, workers[0].pid)):
            if path:
                spies.append(b.start_pyspy(procs, path, pid, gil=args.profile_gil))
    deadline = time.monotonic() + max(60.0, args.jobs / 100)
    while True:
        if b.reports_seen(urls) - reports_before >= args.jobs:
            break
        for w in workers:
            if w.poll() is not None:
                raise RuntimeError(f"a worker exited with {w.returncode}:\n{procs.log_tail(w)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not drained in time: {b.queue_counts(servers[0].url, queue)}")
        time.sleep(0.2)
    wall = time.perf_counter() - started
    cpu = {
        "server": sum(b.cpu_seconds(s.pid) - cpu_before[s.pid] for s in servers),
        "workers": sum(b.cpu_seconds(w.pid) for w in workers),
        "postgres": b.cluster_cpu_seconds(postmaster) - pg_before if postmaster else 0.0,
    }
    for spy in spies:  # py-spy writes its file on SIGINT/SIGTERM
        b.stop_pyspy(procs, spy)
    procs.stop_many(workers)
    counts = b.queue_counts(servers[0].url, queue)
    n, first, last = b.completed_span(args.store, queue, database_url=database_url, sqlite_path=procs.workdir / "qftrio.db")
    return {
        "run": run,
        "completed": n,
        "failed": counts["failed"],
        "enqueue_jobs_per_s": args.jobs / enqueue_secs,
        "processed_jobs_per_s": (n - 1) / (last - first) if last > first else float("nan"),
        "drain_secs": last - first,
        "wall_jobs_per_s": args.jobs / wall,
        "cpu_us_per_job": {k: v / args.jobs * 1e6 for k, v in cpu.items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("throughput", args)
    results = []
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        if args.store == "postgres":
            cluster = b.pg_cluster(args.database_url)
            base = cluster.__enter__()
            db = b.fresh_database(base)
            url = db.__enter__()
            b.say("postgresql:", b.pg_version(url))
        else:
            cluster = db = None
            url = None
        try:
            servers = [
                b.start_server(procs, store=args.store, database_url=url, pool_size=args.pool_size, name=f"server{i}")
                for i in range(args.servers)
            ]
            sides = [("", None)]
            if args.ab:
                sides.append(("B ", {"PYTHONPATH": os.pathsep.join([os.path.abspath(args.ab), str(b.BENCH_DIR)])}))
            for run, (side, env) in enumerate([side for _ in range(args.runs) for side in sides], 1):
                r = one_run(args, procs, servers, run, url, env)
                r["side"] = side
                results.append(r)
                b.say(
                    f"{side}run {run}: enqueue {r['enqueue_jobs_per_s']:,.0f} jobs/s; processed {r['processed_jobs_per_s']:,.0f} jobs/s "
                    f"({r['completed']} completed, {r['failed']} failed, drain {r['drain_secs']:.2f}s); "
                    f"wall incl. worker start {r['wall_jobs_per_s']:,.0f} jobs/s"
                )
                b.say("  CPU µs per job: " + ", ".join(f"{k} {v:,.0f}" for k, v in r["cpu_us_per_job"].items()))
            procs.stop_all()
        finally:
            procs.stop_all()
            if db is not None:
                db.__exit__(None, None, None)
            if cluster is not None:
                cluster.__exit__(None, None, None)
    for side in dict.fromkeys(r["side"] for r in results):
        summarise(args, side, [r for r in results if r["side"] == side])
    return 0


def summarise(args: argparse.Namespace, side: str, results: list[dict]) -> None:
    enq = b.median([r["enqueue_jobs_per_s"] for r in results])
    proc_rate = b.median([r["processed_jobs_per_s"] for r in results])
    wall = b.median([r["wall_jobs_per_s"] for r in results])
    cpu = {k: b.median([r["cpu_us_per_job"][k] for r in results]) for k in results[0]["cpu_us_per_job"]}
    b.say(
        f"{side}RESULT throughput store={args.store} servers={args.servers} workers={args.workers} lanes={args.lanes} "
        f"batch={args.batch} jobs={args.jobs} runs={args.runs}: enqueue {enq:,.0f} jobs/s, "
        f"processed {proc_rate:,.0f} jobs/s (median), wall {wall:,.0f} jobs/s; CPU µs/job (median) "
        + ", ".join(f"{k} {v:,.0f}" for k, v in cpu.items())
    )


if __name__ == "__main__":
    sys.exit(main())
