#!/usr/bin/env python3
"""pgqueuer as the reference, then qftrio, on the same PostgreSQL in the same run.

pgqueuer (``.venv/bin/pip install pgqueuer``; not a qftrio dependency): its
schema is installed in a fresh database, ``--jobs`` no-op jobs are enqueued in
batches of 1,000 (``Queries.enqueue`` with lists), and one worker drains them
with ``batch_size=25`` in drain mode (its own benchmark's drain strategy:
``PgQueuer(AsyncpgDriver(conn)).run(batch_size=..., mode=drain)``), on uvloop
as pgqueuer's benchmark does. Its rate is jobs / (run start .. drain end).

Then qftrio on the same database: a real ``qftrio serve``, the same number of
jobs enqueued through ``POST /api/v1/jobs/batch`` in batches of 1,000, drained
by ``qftrio worker`` processes over HTTP (``--qftrio-workers``, each
``--lanes``/``--batch``); its rate is as in ``throughput.py`` (first to last
completion). The ratio qftrio / pgqueuer is printed for each worker count.

Example::

    .venv/bin/python benchmarks/pgqueuer_reference.py --jobs 20000 --qftrio-workers 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import _bench as b
import throughput


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", "-n", type=int, default=20_000, help="jobs (default 20000)")
    p.add_argument("--pgq-batch", type=int, default=25, help="pgqueuer's batch_size (default 25)")
    p.add_argument("--no-uvloop", action="store_true", help="run pgqueuer on the plain asyncio loop")
    p.add_argument("--qftrio-workers", default="1,2", help="qftrio worker process counts to try (default 1,2)")
    p.add_argument("--lanes", type=int, default=32, help="each qftrio worker's --lanes (default 32)")
    p.add_argument("--batch", type=int, default=25, help="each qftrio worker's --batch (default 25)")
    p.add_argument("--runs", type=int, default=1, help="qftrio runs per worker count; median (default 1)")
    p.add_argument("--worker-log-level", default="WARNING")
    b.add_common(p)
    return p.parse_args(argv)


def run_pgqueuer(url: str, args: argparse.Namespace) -> dict[str, float]:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    async def main() -> dict[str, float]:
        conn = await asyncpg.connect(url)
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        t0 = time.perf_counter()
        left = args.jobs
        while left:
            k = min(1000, left)
            await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
            left -= k
        enqueue_secs = time.perf_counter() - t0
        await conn.close()

        conn = await asyncpg.connect(url)
        pgq = PgQueuer(AsyncpgDriver(conn))
        done = 0

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            nonlocal done
            done += 1

        t0 = time.perf_counter()
        cpu0, pg0 = time.process_time(), b.postgres_cpu_seconds()
        await pgq.run(batch_size=args.pgq_batch, mode=QueueExecutionMode.drain)
        drain_secs = time.perf_counter() - t0
        cpu = {"pgqueuer": time.process_time() - cpu0, "postgres": b.postgres_cpu_seconds() - pg0}
        await conn.close()
        return {
            "enqueue": args.jobs / enqueue_secs,
            "processed": done / drain_secs,
            "done": done,
            "secs": drain_secs,
            "cpu_us_per_job": {k: v / max(done, 1) * 1e6 for k, v in cpu.items()},
        }

    if not args.no_uvloop:
        try:
            import uvloop

            return uvloop.run(main())
        except ImportError:
            pass
    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    import pgqueuer

    b.print_settings("pgqueuer reference vs qftrio, same PostgreSQL", args, pgqueuer_version=pgqueuer.__version__)
    counts = [int(x) for x in args.qftrio_workers.split(",")]
    qf: dict[int, list[dict]] = {}
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        with b.pg_cluster(args.database_url) as base, b.fresh_database(base) as url:
            b.say("postgresql:", b.pg_version(url))
            pg = run_pgqueuer(url, args)
            b.say(
                f"pgqueuer {pgqueuer.__version__}: enqueue {pg['enqueue']:,.0f} jobs/s; drained {pg['done']} jobs in "
                f"{pg['secs']:.2f}s = {pg['processed']:,.0f} jobs/s (1 worker, batch_size {args.pgq_batch})"
            )
            b.say("  CPU µs per job: " + ", ".join(f"{k} {v:,.0f}" for k, v in pg["cpu_us_per_job"].items()))
            server = b.start_server(procs, store="postgres", database_url=url)
            run = 0
            for w in counts:
                targs = argparse.Namespace(
                    store="postgres", jobs=args.jobs, enqueue_batch=1000, workers=w, lanes=args.lanes,
                    batch=args.batch, worker_log_level=args.worker_log_level, profile_server=None, profile_worker=None, profile_gil=False,
                )  # fmt: skip
                for _ in range(args.runs):
                    run += 1
                    r = throughput.one_run(targs, procs, [server], run, url)
                    qf.setdefault(w, []).append(r)
                    b.say(
                        f"qftrio, {w} worker(s): enqueue {r['enqueue_jobs_per_s']:,.0f} jobs/s; processed "
                        f"{r['processed_jobs_per_s']:,.0f} jobs/s ({r['completed']} completed)"
                    )
                    b.say("  CPU µs per job: " + ", ".join(f"{k} {v:,.0f}" for k, v in r["cpu_us_per_job"].items()))
            procs.stop_all()
    for w, rs in qf.items():
        rate = b.median([r["processed_jobs_per_s"] for r in rs])
        b.say(
            f"RESULT pgqueuer_reference jobs={args.jobs}: pgqueuer {pg['processed']:,.0f} jobs/s (batch {args.pgq_batch}); "
            f"qftrio 1 server + {w} worker(s) lanes={args.lanes} batch={args.batch}: {rate:,.0f} jobs/s; "
            f"ratio {rate / pg['processed']:.2f} (target >= 1.00)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
