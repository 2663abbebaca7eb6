#!/usr/bin/env python3
"""Claim cost against the backlog: milliseconds per lease call of 1 job and of
25 jobs with 10k, 100k and 1M pending rows, on both stores.

Rows are bulk-loaded straight into the database (SQLite file / SQL), growing
the same queue from one size to the next; at each size a real ``qftrio serve``
answers sequential ``POST /api/v1/queues/{q}/lease`` calls (``wait_secs`` 0)
from one client, and the median and mean wall time per call are reported. On
PostgreSQL the claim statement's ``EXPLAIN (ANALYZE, BUFFERS)`` is printed at
each size too (inside a transaction that is rolled back), and the statement's
own execution time is reported.

``--drain-ab DIR`` measures what the database spends claiming jobs that
use no flow control on PostgreSQL instead, this code against the copy of
another version in DIR (``git archive REV qftrio | tar -x -C DIR``): each
side gets a database migrated by its own migrations and drains N pending
jobs (``--drain-jobs``, of ``--tenants`` tenants) by claims of ``--drain-limit``,
each followed by a complete of its jobs, from one connection; the sides take
turns, and the median over ``--rounds`` of the backend's CPU per job (from
``/proc``, which a busy machine disturbs far less than wall time) is printed.

``--flow`` measures flow control at scale on PostgreSQL instead: 1,000,000
pending jobs of 100 tenants over 10,000 concurrency keys (limit 2; a tenth
of each tenant's keys at their limit, with two running jobs each), and a lease of 100
jobs (one per tenant, in turn), its milliseconds per call and its plan.

Example::

    .venv/bin/python benchmarks/claim_cost.py --stores sqlite,postgres --sizes 10000,100000,1000000
    .venv/bin/python benchmarks/claim_cost.py --flow
    .venv/bin/python benchmarks/claim_cost.py --drain-ab /tmp/old-26d5e43 --tenants 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

import _bench as b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stores", default="sqlite,postgres", help="comma-separated: sqlite, postgres (default both)")
    p.add_argument("--sizes", default="10000,100000,1000000", help="pending rows, comma-separated, ascending (default 10000,100000,1000000)")
    p.add_argument("--calls", type=int, default=200, help="lease calls of 1 job per size (default 200)")
    p.add_argument("--calls25", type=int, default=100, help="lease calls of 25 jobs per size (default 100)")
    p.add_argument("--no-explain", action="store_true", help="skip EXPLAIN on PostgreSQL")
    p.add_argument("--flow", action="store_true", help="flow control at scale on PostgreSQL (see above); the largest of --sizes is the pending jobs")
    p.add_argument("--tenants", type=int, default=100, help="with --flow or --drain-ab: tenants (default 100)")
    p.add_argument("--drain-ab", metavar="DIR", help="the database's CPU per job of a drain by claims, this code against DIR's (see above)")
    p.add_argument("--drain-jobs", type=int, default=10_000, help="with --drain-ab: jobs per drain (default 10000)")
    p.add_argument("--drain-limit", type=int, default=50, help="with --drain-ab: jobs per claim (default 50)")
    p.add_argument("--rounds", type=int, default=9, help="with --drain-ab: drains of each side (default 9)")
    p.add_argument("--keys", type=int, default=10_000, help="with --flow: concurrency keys (default 10000)")
    b.add_common(p)
    return p.parse_args(argv)


QUEUE = "claim"


def pg_flow_load(url: str, n: int, tenants: int, keys: int) -> float:
    """*n* pending jobs of *tenants* tenants over *keys* concurrency keys of
    limit 2 (job i: tenant i % tenants, key i % keys, so each key is one
    tenant's), and two running jobs of every tenth key of each tenant, which
    holds it at its limit (the triggers count them). Returns seconds taken."""
    now = time.time()

    async def load(conn: Any) -> None:
        insert = """INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts,
                scheduled_at, created_at, updated_at, locked_until, lease_token, concurrency, concurrency_key,
                concurrency_limit)
            SELECT gen_random_uuid(), 't' || (i % $6), $1, 'noop', '{}'::jsonb, $5, 0, $7, 5,
                $2 - 3600 + (i * 1e-6), $2 - 3600 + (i * 1e-6), $2,
                CASE WHEN $5 = 'running' THEN $2 + 86400 END, CASE WHEN $5 = 'running' THEN gen_random_uuid() END,
                jsonb_build_object('key', 'k' || (i % $8), 'limit', 2), 'k' || (i % $8), 2
            FROM generate_series($3::bigint, $4::bigint) AS i
            WHERE $9 OR (i % $8 / $6) % 10 = 0"""
        for start in range(0, n, 200_000):
            await conn.execute(insert, QUEUE, now, start, min(n, start + 200_000) - 1, "pending", tenants, 0, keys, True)
        # two running jobs of every tenth key of each tenant
        for copy in range(2):
            await conn.execute(insert, QUEUE, now, copy * keys, copy * keys + keys - 1, "running", tenants, 1, keys, False)
        await conn.execute("VACUUM ANALYZE qftrio_jobs")
        await conn.execute("VACUUM ANALYZE qftrio_concurrency_running")

    t0 = time.perf_counter()
    b.pg_run(url, load)
    return time.perf_counter() - t0


def run_flow(args: argparse.Namespace, procs: b.Procs, db_url: str) -> None:
    size = max(int(s) for s in args.sizes.split(","))
    init = b.start_server(procs, store="postgres", database_url=db_url, name="init")
    procs.stop(init.proc)
    t_load = pg_flow_load(db_url, size, args.tenants, args.keys)
    b.say(f"[postgres] {size:,} pending jobs, {args.tenants} tenants, {args.keys:,} keys (loaded in {t_load:.1f}s)")
    server = b.start_server(procs, store="postgres", database_url=db_url, name="flow")
    lease100 = time_calls(server.url, 100, args.calls25)
    procs.stop(server.proc)
    b.say(f"[postgres] lease of 100 jobs: median {lease100['median_ms']:.2f} ms per call")
    plan, _ = pg_explain(db_url, 100, timing=False)
    b.say("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) claim of 100 jobs:\n" + plan)
    exec_ms = pg_claim_ms(db_url, 100, args.calls25)
    b.say(
        f"RESULT claim_cost flow: lease of 100 from {size:,} pending over {args.keys:,} keys and {args.tenants} tenants: "
        f"median {lease100['median_ms']:.2f} ms (mean {lease100['mean_ms']:.2f}, p90 {lease100['p90_ms']:.2f}) per call; "
        f"claim statement alone (median of {args.calls25}, rolled back) {exec_ms:.2f} ms (target <= 20 ms)"
    )


def statements(root: Path) -> dict[str, str]:
    """The PostgreSQL statements of the qftrio copy under *root*, by name."""
    text = (root / "qftrio/server/store/queries/postgres.sql").read_text()
    parts = re.split(r"^-- name: ", text, flags=re.M)[1:]
    return {name.strip(): body for name, _, body in (part.partition("\n") for part in parts)}


def cpu_ns(pid: int) -> int:
    """Nanoseconds *pid* has run on a CPU (the scheduler's count: finer than
    the clock ticks of /proc/PID/stat, for a drain of a second or two)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def run_drain_ab(args: argparse.Namespace, base: str) -> None:
    from qftrio.server.store.base import LEASE_EXPIRED

    here = Path(__file__).resolve().parent.parent
    sides = {"this": here, "other": Path(args.drain_ab).resolve()}
    complete = "UPDATE qftrio_jobs SET status = 'completed', updated_at = $2 WHERE id = ANY($1::uuid[]) AND status = 'running'"

    def migrate(url: str, root: Path) -> None:
        # each side by its own `qftrio migrate` (its numbered migrations and
        # whatever else its version applies, as functions.sql)
        env = {**os.environ, "PYTHONPATH": str(root)}
        subprocess.run([sys.executable, "-m", "qftrio", "migrate", "--database-url", url], env=env, check=True, timeout=300)

    async def drain(conn: Any, claim: str) -> float:
        await conn.execute("DELETE FROM qftrio_jobs")
        await conn.execute(
            """INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts,
                scheduled_at, created_at, updated_at)
            SELECT gen_random_uuid(), 't' || (i % $3), $4, 'noop', '{}'::jsonb, 'pending', 0, 0, 5,
                $1 - 3600 + i * 1e-6, $1 - 3600 + i * 1e-6, $1
            FROM generate_series(1, $2::int) AS i""",
            time.time(), args.drain_jobs, args.tenants, QUEUE,
        )  # fmt: skip
        await conn.execute("VACUUM ANALYZE qftrio_jobs")
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        claiming = await conn.prepare(claim)
        completing = await conn.prepare(complete)
        # the older claim has no turn ($7)
        extra = [0] if "$7" in claim else []
        done = 0
        before = cpu_ns(pid)
        while rows := await claiming.fetch(
            QUEUE, time.time(), args.drain_limit, 30.0, "bench", LEASE_EXPIRED, *extra
        ):  # fmt: skip
            done += len(rows)
            await completing.fetch([r["id"] for r in rows], time.time())
        return (cpu_ns(pid) - before) / 1000 / done

    per_job: dict[str, list[float]] = {side: [] for side in sides}
    with contextlib.ExitStack() as stack:
        urls = {side: stack.enter_context(b.fresh_database(base)) for side in sides}

        for side, root in sides.items():
            migrate(urls[side], root)
        for rnd in range(args.rounds):
            for side in sides if rnd % 2 == 0 else list(sides)[::-1]:
                claim = statements(sides[side])["claim"]

                async def one(conn: Any, claim: str = claim) -> float:
                    await conn.execute("SET jit = off")  # as the server's connections run
                    return await drain(conn, claim)

                per_job[side].append(b.pg_run(urls[side], one))
                b.say(f"round {rnd + 1} {side}: {per_job[side][-1]:.1f} µs of the backend's CPU per job")
    b.say(
        f"RESULT claim_cost drain: {args.drain_jobs:,} jobs of {args.tenants} tenant(s), claims of {args.drain_limit} "
        f"and their completes, the database's CPU per job (median of {args.rounds}): this code "
        f"{b.median(per_job['this']):.1f} µs, {args.drain_ab} {b.median(per_job['other']):.1f} µs"
    )


def time_calls(url: str, max_jobs: int, calls: int) -> dict[str, float]:
    out = []
    with httpx.Client(base_url=url, headers=b.worker_headers(), timeout=60) as c:
        body = {"max_jobs": max_jobs, "lease_secs": 3600, "wait_secs": 0}
        for i in range(calls + 5):
            t0 = time.perf_counter()
            r = c.post(f"/api/v1/queues/{QUEUE}/lease", json=body)
            dt = time.perf_counter() - t0
            if r.status_code != 200 or len(r.json()["jobs"]) != max_jobs:
                raise RuntimeError(f"lease answered {r.status_code} with {r.text[:200]}")
            if i >= 5:  # warm-up
                out.append(dt * 1000)
    return {"median_ms": statistics.median(out), "mean_ms": statistics.fmean(out), "p90_ms": b.percentile(out, 90)}


def pg_claim_ms(url: str, max_jobs: int, runs: int) -> float:
    """The claim statement's median time over *runs* runs, each in a
    transaction rolled back (so each claims from the same backlog)."""
    from qftrio.server.store.base import LEASE_EXPIRED
    from qftrio.server.store.postgres import Q

    async def q(conn: Any) -> float:
        await conn.execute("SET jit = off")  # as the server's connections run
        times = []
        statement = await conn.prepare(Q["claim"])
        for turn in range(runs):
            tr = conn.transaction()
            await tr.start()
            try:
                t0 = time.perf_counter()
                rows = await statement.fetch(QUEUE, time.time(), max_jobs, 3600.0, "bench", LEASE_EXPIRED, turn)
                times.append((time.perf_counter() - t0) * 1000)
                assert rows, "the claim found nothing"
            finally:
                await tr.rollback()
        return statistics.median(times)

    return b.pg_run(url, q)


def pg_explain(url: str, max_jobs: int, *, timing: bool = True) -> tuple[str, float]:
    from qftrio.server.store.base import LEASE_EXPIRED
    from qftrio.server.store.postgres import Q  # the statement the server runs

    async def q(conn: Any) -> tuple[str, float]:
        await conn.execute("SET jit = off")  # as the server's connections run
        tr = conn.transaction()
        await tr.start()
        try:
            rows = await conn.fetch(
                f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING {'ON' if timing else 'OFF'}) " + Q["claim"],
                QUEUE, time.time(), max_jobs, 3600.0, "explain", LEASE_EXPIRED, 0,
            )  # fmt: skip
        finally:
            await tr.rollback()
        text = "\n".join(r[0] for r in rows)
        exec_ms = float("nan")
        for r in rows:
            if r[0].startswith("Execution Time:"):
                exec_ms = float(r[0].split()[2])
        return text, exec_ms

    return b.pg_run(url, q)


def run_store(store: str, args: argparse.Namespace, procs: b.Procs, sizes: list[int], db_url: str | None) -> list[dict]:
    results = []
    loaded = 0
    path = procs.workdir / f"claim-{store}.db"
    if store == "sqlite":
        b.sqlite_init(path, procs)
    else:
        init = b.start_server(procs, store="postgres", database_url=db_url, name="init")
        procs.stop(init.proc)
    claimed = 0
    for size in sizes:
        # top up to `size` pending (what earlier sizes' calls claimed is running now)
        extra = size - (loaded - claimed)
        t_load = (
            b.sqlite_bulk_pending(path, QUEUE, extra) if store == "sqlite" else b.pg_bulk_pending(db_url, QUEUE, extra)
        )
        loaded += extra
        b.say(f"[{store}] {size:,} pending rows (loaded {extra:,} in {t_load:.1f}s)")
        server = b.start_server(procs, store=store, database_url=db_url, sqlite_path=path, name=f"{store}-{size}")
        one = time_calls(server.url, 1, args.calls)
        many = time_calls(server.url, 25, args.calls25)
        claimed += (args.calls + 5) + 25 * (args.calls25 + 5)
        procs.stop(server.proc)
        row = {"store": store, "pending": size, "lease1": one, "lease25": many}
        b.say(
            f"[{store}] {size:>9,} pending: lease 1 job median {one['median_ms']:.2f} ms (mean {one['mean_ms']:.2f}, p90 {one['p90_ms']:.2f}); "
            f"lease 25 jobs median {many['median_ms']:.2f} ms (mean {many['mean_ms']:.2f}, p90 {many['p90_ms']:.2f})"
        )
        if store == "postgres" and not args.no_explain:
            plan1, exec1 = pg_explain(db_url, 1)
            plan25, exec25 = pg_explain(db_url, 25)
            row["sql_exec_ms"] = (exec1, exec25)
            b.say(f"[postgres] {size:,} pending: claim statement execution {exec1:.3f} ms (1 job), {exec25:.3f} ms (25 jobs)")
            b.say(f"EXPLAIN (ANALYZE, BUFFERS) claim of 1 job at {size:,} pending:\n" + plan1)
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("claim cost vs backlog", args)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    results = []
    if args.drain_ab:
        with b.pg_cluster(args.database_url) as base:
            b.say("postgresql:", b.pg_version(base))
            run_drain_ab(args, base)
        return 0
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        if args.flow:
            with b.pg_cluster(args.database_url) as base, b.fresh_database(base) as url:
                b.say("postgresql:", b.pg_version(url))
                run_flow(args, procs, url)
            procs.stop_all()
            return 0
        if "sqlite" in stores:
            results += run_store("sqlite", args, procs, sizes, None)
        if "postgres" in stores:
            with b.pg_cluster(args.database_url) as base, b.fresh_database(base) as url:
                b.say("postgresql:", b.pg_version(url))
                results += run_store("postgres", args, procs, sizes, url)
        procs.stop_all()
    for store in stores:
        rows = [r for r in results if r["store"] == store]
        if len(rows) < 2:
            continue
        lo, hi = rows[0], rows[-1]
        for key, label in (("lease1", "1 job"), ("lease25", "25 jobs")):
            ratio = hi[key]["median_ms"] / lo[key]["median_ms"]
            b.say(
                f"RESULT claim_cost store={store} lease {label}: {lo[key]['median_ms']:.2f} ms at {lo['pending']:,} -> "
                f"{hi[key]['median_ms']:.2f} ms at {hi['pending']:,} pending = {ratio:.2f}x (target <= 1.5x)"
            )
        if "sql_exec_ms" in lo:
            b.say(
                f"RESULT claim_cost store={store} claim statement alone (EXPLAIN ANALYZE): 1 job {lo['sql_exec_ms'][0]:.3f} -> "
                f"{hi['sql_exec_ms'][0]:.3f} ms, 25 jobs {lo['sql_exec_ms'][1]:.3f} -> {hi['sql_exec_ms'][1]:.3f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
