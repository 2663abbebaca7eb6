#!/usr/bin/env python3
"""A drain through the PostgreSQL store alone: the database's CPU per job, and
the calling process's, with no server or worker around it.

Each run is a fresh database migrated by the code under test; N jobs are
inserted in batches of 1,000, then claimed ``--claim`` at a time and each
claim completed at once, until none is left. The database's CPU is its
cluster's processes' (``/proc``), read around the drain; the caller's is this
process's. ``--ab DIR`` alternates every run with one importing qftrio from
DIR (a copy of another version: ``git archive main qftrio | tar -x -C DIR``),
each in a process of its own, and prints both medians.

Examples::

    .venv/bin/python benchmarks/store_drain.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    .venv/bin/python benchmarks/store_drain.py --ab /tmp/before --runs 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time

import _bench as b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", "-n", type=int, default=10_000, help="jobs per run (default 10000)")
    p.add_argument("--claim", type=int, default=50, help="jobs per claim and per complete (default 50)")
    p.add_argument("--runs", "-r", type=int, default=3, help="runs of each side; medians reported (default 3)")
    p.add_argument("--ab", metavar="DIR", help="alternate every run with one importing qftrio from DIR")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a subprocess's single run: its database URL
    b.add_common(p)
    return p.parse_args(argv)


async def _drain(url: str, jobs: int, claim: int) -> tuple[float, float]:
    from qftrio.models import CompleteItem
    from qftrio.server.store.base import NewJob
    from qftrio.server.store.postgres import open_postgres_store

    postmaster = b.postmaster_of(url)
    async with open_postgres_store(url, pool_size=2) as store:
        now = time.time()
        for start in range(0, jobs, 1000):
            batch = [
                NewJob(tenant="t", queue="q", kind="k", payload={"i": i}, scheduled_at=now)
                for i in range(start, min(jobs, start + 1000))
            ]
            await store.jobs_insert(batch, now=now)
        pg0, own0, done = b.cluster_cpu_seconds(postmaster), time.process_time(), 0
        while True:
            now = time.time()
            leases = await store.jobs_claim("q", limit=claim, lease_secs=60, worker_id="host-4242-w1", now=now)
            if not leases:
                break
            await store.jobs_complete([CompleteItem(lease.job.id, lease.lease_token, {}) for lease in leases], now=now)
            done += len(leases)
        return (b.cluster_cpu_seconds(postmaster) - pg0) / done * 1e6, (time.process_time() - own0) / done * 1e6


def _run(args: argparse.Namespace, url: str, checkout: str | None) -> tuple[float, float]:
    """One run in a process of its own, importing qftrio from *checkout* (or this one)."""
    env = dict(os.environ)
    if checkout:
        env["PYTHONPATH"] = checkout
    argv = [sys.executable, __file__, "--one", url, f"--jobs={args.jobs}", f"--claim={args.claim}"]
    # from elsewhere than the checkout, so that PYTHONPATH alone decides which qftrio is imported
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, cwd=checkout or "/").stdout
    database, caller = out.split()
    return float(database), float(caller)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        import trio

        print("%.1f %.1f" % trio.run(_drain, args.one, args.jobs, args.claim))
        return 0
    b.arm_timeout(args.timeout)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(b.pg_cluster(args.database_url))
        sides = {"this": None, **({"other": args.ab} if args.ab else {})}
        got: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        for run in range(1, args.runs + 1):
            for side, checkout in sides.items():
                with b.fresh_database(url) as fresh:
                    got[side].append(_run(args, fresh, checkout))
                database, caller = got[side][-1]
                print(f"run {run} {side}: database {database:.1f} µs per job, caller {caller:.1f} µs per job")
        for side, values in got.items():
            database = b.median([v[0] for v in values])
            caller = b.median([v[1] for v in values])
            print(f"RESULT store_drain {side} jobs={args.jobs} claim={args.claim} runs={args.runs}: "
                  f"database {database:.1f} µs per job, caller {caller:.1f} µs per job (medians)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
