#!/usr/bin/env python3
"""PostgreSQL's CPU per job enqueued through ``qftrio_enqueue`` (and
``qftrio_enqueue_batch``), next to the server's own insert.

``server``: the PostgreSQL store's insert (``jobs_insert``, as
``POST /api/v1/jobs`` runs it once pydantic has checked the job); ``sql``:
the functions of migrations/postgres/functions.sql, which check each job in PL/pgSQL and
insert it as the store does. One job per call (``--single`` calls) and
``--batch`` jobs per call (``--jobs`` in all), each call its own
transaction, on one connection; the sides alternate within each round
(``--rounds``), medians printed: µs of the backend's on-CPU time
(``/proc/PID/schedstat``: the cluster must run on this machine) and of wall
clock per job.

Examples::

    .venv/bin/python benchmarks/sql_enqueue.py
    .venv/bin/python benchmarks/sql_enqueue.py --database-url postgresql://postgres@127.0.0.1:55432/postgres --rounds 5
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import Any

import trio

import _bench as b
from pg_write_cost import backend_cpu

CONFIG = {"queue": "q", "max_attempts": 3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--single", type=int, default=2000, help="one-job calls per round and side (default 2000)")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per round and side in batches (default 20000)")
    p.add_argument("--batch", type=int, default=1000, help="jobs per batch call (default 1000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    b.add_common(p)
    return p.parse_args(argv)


def payload(n: int) -> dict[str, Any]:
    return {"n": n, "email": f"user{n}@example.com"}


async def server_side(conn: Any, calls: int, per_call: int) -> None:
    from qftrio.models import EnqueueRequest, JobConfig
    from qftrio.server.engine import new_job
    from qftrio.server.store.postgres import _inserter

    config = JobConfig(**CONFIG)
    for c in range(calls):
        now = time.time()
        jobs = [new_job("t", EnqueueRequest(kind="k", payload=payload(c * per_call + i), config=config), now)
                for i in range(per_call)]  # fmt: skip
        async with conn.transaction():
            await _inserter(jobs, now)(conn)


async def sql_side(conn: Any, calls: int, per_call: int) -> None:
    config = json.dumps(CONFIG)
    for c in range(calls):
        if per_call == 1:
            await conn.fetch("SELECT id FROM qftrio_enqueue('t', 'k', $1, $2)", json.dumps(payload(c)), config)
        else:
            jobs = [{"kind": "k", "payload": payload(c * per_call + i), "config": CONFIG} for i in range(per_call)]
            await conn.fetch("SELECT id FROM qftrio_enqueue_batch('t', $1)", json.dumps(jobs))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    from qftrio.server.store.postgres import migrate

    sides = {"server": server_side, "sql": sql_side}
    phases = {"single": (args.single, 1), "batch": (args.jobs // args.batch, args.batch)}
    cpu: dict[tuple[str, str], list[float]] = {}
    wall: dict[tuple[str, str], list[float]] = {}
    with b.pg_cluster(args.database_url) as cluster, b.fresh_database(cluster) as url:
        b.print_settings("enqueue through SQL", args, postgres=b.pg_version(url))
        trio.run(functools.partial(migrate, url, timeout=None))

        async def run(conn: Any) -> None:
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            for r in range(args.rounds):
                for phase, (calls, per_call) in phases.items():
                    for side, fn in list(sides.items())[:: 1 if r % 2 == 0 else -1]:
                        await conn.execute("TRUNCATE qftrio_jobs, qftrio_job_counts")
                        t0, c0 = time.perf_counter(), backend_cpu(pid)
                        await fn(conn, calls, per_call)
                        jobs = calls * per_call
                        cpu.setdefault((phase, side), []).append((backend_cpu(pid) - c0) / jobs * 1e6)
                        wall.setdefault((phase, side), []).append((time.perf_counter() - t0) / jobs * 1e6)

        b.pg_run(url, run)
    b.say(f"{'phase':8} {'side':8} {'PostgreSQL CPU µs/job':>22} {'wall µs/job':>12}")
    for (phase, side), values in cpu.items():
        b.say(f"{phase:8} {side:8} {b.median(values):22.1f} {b.median(wall[phase, side]):12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
