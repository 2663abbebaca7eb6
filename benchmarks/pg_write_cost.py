#!/usr/bin/env python3
"""PostgreSQL's own CPU per job: what the database spends to insert, claim
and complete a job with the store's statements, without a server or worker.

Each measurement is a fresh database migrated with a checkout's migrations;
one connection then runs that checkout's statements as the store runs them:
``jobs_insert`` in batches (``--batch``), ``claim`` of ``--claim`` jobs at a
time, and ``complete`` of each claimed batch ``--lag`` claims later (so about
``lag x claim`` jobs are running while it reports, as under a worker pool).
The backend's on-CPU time (``/proc/PID/schedstat``: the cluster must run on
this machine) is read around each statement, counting its triggers too, and
the WAL it wrote (the cluster's WAL position: exact on a cluster of its own,
the default, not on one other databases write to).
``--single`` jobs are then inserted one per statement (``POST /api/v1/jobs``).

Variants alternate within each round (``--rounds``), medians reported:

* ``shipped``: this checkout (the default, always run);
* ``--baseline DIR``: another checkout's migrations and statements (e.g.
  ``git worktree add --detach /tmp/qf-base main``), imported from DIR in a
  subprocess of its own;
* ``--variant NAME='SQL; SQL'``: this checkout with SQL run after the
  migrations (dropping an index or a trigger, to see what it costs).

``--explain`` prints the plans of ``complete`` (custom and generic) with
``--running`` jobs running and the statistics of a table of pending jobs
only: stale estimates, which must not change how many rows it reads.

Examples::

    .venv/bin/python benchmarks/pg_write_cost.py --database-url postgresql://postgres@127.0.0.1:55432/postgres
    .venv/bin/python benchmarks/pg_write_cost.py --baseline /tmp/qf-base --rounds 3
    .venv/bin/python benchmarks/pg_write_cost.py --variant "no-filter=DROP INDEX qftrio_jobs_filter_idx"
    .venv/bin/python benchmarks/pg_write_cost.py --explain --running 5000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import _bench as b

PHASES = ("insert", "claim", "complete", "single")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000, help="jobs inserted, claimed and completed (default 20000)")
    p.add_argument("--batch", type=int, default=1000, help="jobs per insert statement (default 1000)")
    p.add_argument("--claim", type=int, default=100, help="jobs per claim and per complete (default 100)")
    p.add_argument("--lag", type=int, default=3, help="claims a batch's completion lags behind (default 3)")
    p.add_argument("--single", type=int, default=2000, help="jobs then inserted one per statement (default 2000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every variant (default 3)")
    p.add_argument("--baseline", help="another checkout whose migrations and statements to measure too")
    p.add_argument(
        "--variant", action="append", default=[], metavar="NAME=SQL",
        help="this checkout plus SQL run after the migrations (repeatable)",
    )  # fmt: skip
    p.add_argument("--explain", action="store_true", help="print the plans of complete instead of measuring")
    p.add_argument("--running", type=int, default=5000, help="jobs running while --explain plans (default 5000)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a subprocess's single measurement: DATABASE_URL
    p.add_argument("--extra", default="", help=argparse.SUPPRESS)
    b.add_common(p)
    return p.parse_args(argv)


def backend_cpu(pid: int) -> float:
    """On-CPU seconds of process *pid* (schedstat: nanoseconds, not ticks)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def batch_json(ids: list[str], now: float) -> str:
    """The ``jobs_insert`` parameter of no-op jobs of tenant ``t``, queue ``q``."""
    return json.dumps([[i, "t", "q", "noop", {}, 0, 5, now, None, None, None, None] for i in ids])


async def fill(conn: Any, Q: dict[str, str], n: int, batch: int, now: float) -> None:
    for s in range(0, n, batch):
        ids = [str(uuid.uuid4()) for _ in range(min(batch, n - s))]
        await conn.fetch(Q["jobs_insert"], batch_json(ids, now), now, "qftrio_jobs")


def measure(args: argparse.Namespace, url: str) -> dict[str, float]:
    """µs of the backend's CPU and bytes of WAL per job for each phase, on a
    fresh database at *url*."""
    from qftrio.server.store import sql

    Q = sql.load("postgres")

    async def run(conn: Any) -> dict[str, float]:
        wal = {phase: 0 for phase in PHASES}

        async def lsn() -> int:
            return int(await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"))

        for _, _, script in sql.migrations("postgres"):
            await conn.execute(script)
        if args.extra:
            await conn.execute(args.extra)
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        now = time.time()
        n = args.jobs
        w0 = await lsn()
        t0 = backend_cpu(pid)
        await fill(conn, Q, n, args.batch, now)
        spent = {"insert": backend_cpu(pid) - t0, "claim": 0.0, "complete": 0.0}
        wal["insert"] = await lsn() - w0
        await conn.execute("ANALYZE qftrio_jobs")
        held: list[list[tuple[Any, Any]]] = []
        while True:
            w0 = await lsn()
            t0 = backend_cpu(pid)
            rows = await conn.fetch(Q["claim"], "q", now + 1, args.claim, 60.0, "w", "lease expired", 0)
            spent["claim"] += backend_cpu(pid) - t0
            wal["claim"] += await lsn() - w0
            if rows:
                held.append([(r["id"], r["lease_token"]) for r in rows])
            if held and (len(held) > args.lag or not rows):
                done = held.pop(0)
                w0 = await lsn()
                t0 = backend_cpu(pid)
                await conn.fetch(
                    Q["complete"], [d[0] for d in done], [d[1] for d in done], ["{}"] * len(done), now + 2
                )
                spent["complete"] += backend_cpu(pid) - t0
                wal["complete"] += await lsn() - w0
            elif not rows:
                break
        completed = await conn.fetchval("SELECT count(*) FROM qftrio_jobs WHERE status = 'completed'")
        if completed != n:
            raise RuntimeError(f"{completed} of {n} jobs completed")
        w0 = await lsn()
        t0 = backend_cpu(pid)
        for _ in range(args.single):
            await conn.fetch(Q["jobs_insert"], batch_json([str(uuid.uuid4())], now), now, "qftrio_jobs")
        spent["single"] = backend_cpu(pid) - t0
        wal["single"] = await lsn() - w0
        per = {phase: n for phase in PHASES} | {"single": max(1, args.single)}
        out = {k: spent[k] / per[k] * 1e6 for k in PHASES}
        out |= {f"wal_{k}": wal[k] / per[k] for k in PHASES}
        return out

    return b.pg_run(url, run)


def explain(args: argparse.Namespace, url: str) -> None:
    """The plans of ``complete`` with ``--running`` jobs running and the
    statistics of a table of pending jobs only."""
    from qftrio.server.store import sql

    Q = sql.load("postgres")

    async def run(conn: Any) -> None:
        for _, _, script in sql.migrations("postgres"):
            await conn.execute(script)
        now = time.time()
        await fill(conn, Q, args.jobs, args.batch, now)
        await conn.execute("ANALYZE qftrio_jobs")
        leased = []
        while len(leased) < args.running:
            rows = await conn.fetch(Q["claim"], "q", now + 1, 100, 60.0, "w", "lease expired", 0)
            if not rows:
                break
            leased += [(r["id"], r["lease_token"]) for r in rows]
        b.say(f"{len(leased)} jobs running, the statistics taken before the first claim")
        await conn.execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;"
            " SET auto_explain.log_buffers = on; SET auto_explain.log_nested_statements = on;"
            " SET auto_explain.log_level = notice; SET client_min_messages = notice"
        )
        plans: list[str] = []
        conn.add_log_listener(lambda _conn, msg: plans.append(msg.message))
        for mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            done, leased = leased[: args.claim], leased[args.claim :]
            plans.clear()
            await conn.fetch(Q["complete"], [d[0] for d in done], [d[1] for d in done], ["{}"] * len(done), now + 2)
            await conn.execute("SELECT 1")  # the notices of the statement before have arrived
            b.say(f"-- complete of {len(done)} jobs, {mode}")
            for plan in plans:
                if "qftrio_jobs" in plan:
                    b.say(plan.split("\n", 1)[1] if plan.startswith("duration") else plan)

    b.pg_run(url, run)


def one(args: argparse.Namespace, checkout: str | None, extra: str, base: str) -> dict[str, float]:
    """One measurement in a subprocess that imports qftrio from *checkout*
    (None: this one)."""
    env = dict(os.environ)
    if checkout:
        env["PYTHONPATH"] = os.path.abspath(checkout) + os.pathsep + env.get("PYTHONPATH", "")
    with b.fresh_database(base, prefix="qftrio_cost") as url:
        argv = [sys.executable, __file__, "--one", url, "--extra", extra]
        argv += [f"--{k}={getattr(args, k)}" for k in ("jobs", "batch", "claim", "lag", "single")]
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, cwd=checkout or b.ROOT)
        return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(json.dumps(measure(args, args.one)))
        return 0
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("pg_write_cost", args)
    variants: dict[str, tuple[str | None, str]] = {"shipped": (None, "")}
    if args.baseline:
        variants["baseline"] = (args.baseline, "")
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        variants[name] = (None, extra)
    with b.pg_cluster(args.database_url) as base:
        b.say("postgresql:", b.pg_version(base))
        if args.explain:
            with b.fresh_database(base, prefix="qftrio_cost") as url:
                explain(args, url)
            return 0
        figures: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for rnd in range(args.rounds):
            for name, (checkout, extra) in variants.items():
                got = one(args, checkout, extra, base)
                figures[name].append(got)
                b.say(f"round {rnd + 1} {name:24s} " + "  ".join(f"{k} {got[k]:6.1f}" for k in PHASES))
    b.say(f"RESULT pg_write_cost (per job, median of {args.rounds}; single: one job a statement)")
    b.say("  " + "µs of PostgreSQL's CPU".ljust(24) + "".join(f"{k:>10}" for k in PHASES) + f"{'batch total':>14}")
    for name, runs in figures.items():
        med = {k: b.median([r[k] for r in runs]) for k in PHASES}
        total = b.median([r["insert"] + r["claim"] + r["complete"] for r in runs])
        b.say("  " + name.ljust(24) + "".join(f"{med[k]:>10.1f}" for k in PHASES) + f"{total:>14.1f}")
    b.say("  " + "bytes of WAL".ljust(24) + "".join(f"{k:>10}" for k in PHASES) + f"{'batch total':>14}")
    for name, runs in figures.items():
        med = {k: b.median([r[f"wal_{k}"] for r in runs]) for k in PHASES}
        total = b.median([r["wal_insert"] + r["wal_claim"] + r["wal_complete"] for r in runs])
        b.say("  " + name.ljust(24) + "".join(f"{med[k]:>10.0f}" for k in PHASES) + f"{total:>14.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
