#!/usr/bin/env python3
"""Operations at scale: what a stats call or a filtered page costs as the
table grows.

For each size, a fresh store is bulk-loaded with a table that looks like
months of traffic (mostly completed jobs, a backlog, dead letters, a few
cancelled; ten queues, twenty kinds and one rare kind), a server is started
on it, and each query is timed over HTTP (median of ``--repeat`` calls
after one warm-up). Then ``--queue-names`` queues with a job each are added
and a page of the queues list is timed (the first, and one from the middle),
which must not grow with the number of names. Then the plans of the
statements behind them are printed (``EXPLAIN ANALYZE`` on PostgreSQL,
``EXPLAIN QUERY PLAN`` on SQLite).

The goal (issue 16): within 2x from 20k to 200k jobs, and at most 25 ms at
10 million on PostgreSQL.

Examples::

    .venv/bin/python benchmarks/ops_scale.py                               # both stores, 20k and 200k
    .venv/bin/python benchmarks/ops_scale.py --store postgres --sizes 10000000
"""

from __future__ import annotations

import argparse
import base64
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import _bench as b
import httpx

from qftrio.server.store import sql

QUEUES = 10
KINDS = 20
#: (status, share of the table); the rest of the rows are completed.
MIX = (("pending", 0.05), ("failed", 0.03), ("cancelled", 0.02))

QUERIES = [
    ("stats of one queue", "/api/v1/queues/q3/stats"),
    ("queues, first page", "/api/v1/queues"),
    ("dead letters of a queue", "/api/v1/jobs?queue=q3&status=failed"),
    ("dead letters, all queues", "/api/v1/jobs?status=failed"),
    ("running jobs of a queue", "/api/v1/jobs?queue=q3&status=running"),
    ("jobs of a rare kind", "/api/v1/jobs?kind=rare"),
    ("jobs of a queue", "/api/v1/jobs?queue=q3"),
    ("queue + status + kind", "/api/v1/jobs?queue=q3&status=pending&kind=k13"),
    ("every job, newest first", "/api/v1/jobs"),
    ("metrics (gauges of every queue)", "/metrics"),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--sizes", default="20000,200000", help="table sizes, comma-separated (default 20000,200000)")
    p.add_argument("--repeat", type=int, default=15, help="calls per query; the median is reported (default 15)")
    p.add_argument("--no-plans", action="store_true", help="do not print the plans")
    p.add_argument("--queue-names", type=int, default=20_000, help="queues with a job each for the queue pages (default 20000)")
    p.add_argument("--running", type=int, default=1000, help="PostgreSQL: jobs leased after loading (default 1000)")
    b.add_common(p)
    return p.parse_args(argv)


def status_of(i: int, n: int) -> str:
    """The status of row *i* of *n*: the MIX shares, spread over the table
    and over every queue (row *i* is on queue ``i % QUEUES``)."""
    slot = (i // QUEUES) % 100
    edge = 0
    for status, share in MIX:
        edge += int(share * 100)
        if slot < edge:
            return status
    return "completed"


def kind_of(i: int) -> str:
    return "rare" if i % 10_000 == 77 else f"k{i % KINDS}"


# -- loading -----------------------------------------------------------------------


def load_sqlite(path: Path, n: int, chunk: int = 50_000) -> float:
    """Rows straight into the embedded store's file (migrated, server stopped)."""
    now = time.time()

    def rows(start: int, count: int) -> list[tuple]:
        out = []
        for i in range(start, start + count):
            status = status_of(i, n)
            at = now - 86_400 + i * (80_000 / n)
            out.append((
                str(uuid.uuid4()), b.TENANT, f"q{i % QUEUES}", kind_of(i), "{}", status, 0,
                0 if status == "pending" else 1, 5, at, at, at, "bench-worker" if status != "pending" else None,
            ))  # fmt: skip
        return out

    return b.sqlite_bulk_rows(path, n, rows, chunk=chunk)


def load_postgres(url: str, n: int, running: int, chunk: int = 500_000) -> float:
    """Rows with SQL, one statement per chunk (the counts' trigger runs once
    per statement), then *running* of the pending ones leased."""
    now = time.time()
    edges = []
    edge = 0
    for status, share in MIX:
        edge += int(share * 100)
        edges.append((edge, status))
    case = " ".join(f"WHEN ((i / {QUEUES}) % 100) < {e} THEN '{s}'" for e, s in edges)

    async def load(conn: Any) -> None:
        done = 0
        while done < n:
            k = min(chunk, n - done)
            await conn.execute(
                f"""INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, status, priority, attempt,
                    max_attempts, scheduled_at, created_at, updated_at, worker_id)
                SELECT gen_random_uuid(), $1, 'q' || (i % {QUEUES}),
                    CASE WHEN i % 10000 = 77 THEN 'rare' ELSE 'k' || (i % {KINDS}) END, '{{}}'::jsonb, s, 0,
                    CASE WHEN s = 'pending' THEN 0 ELSE 1 END, 5, t, t, t,
                    CASE WHEN s = 'pending' THEN NULL ELSE 'bench-worker' END
                FROM (SELECT i, CASE {case} ELSE 'completed' END AS s, $2 - 86400 + i * (80000.0 / $4) AS t
                      FROM generate_series($3::bigint, $3::bigint + $5 - 1) AS i) AS g""",
                b.TENANT, now, done, n, k,
            )  # fmt: skip
            done += k
        await conn.execute(
            """UPDATE qftrio_jobs SET status = 'running', attempt = 1, locked_until = $1::float8 + 3600,
                lease_token = gen_random_uuid(), worker_id = 'bench-worker'
            WHERE id IN (SELECT id FROM qftrio_jobs WHERE status = 'pending' ORDER BY created_at LIMIT $2)""",
            now, running,
        )  # fmt: skip
        await conn.execute("VACUUM ANALYZE qftrio_jobs")

    t0 = time.perf_counter()
    b.pg_run(url, load)
    return time.perf_counter() - t0


# -- timing -------------------------------------------------------------------------


def timed(client: httpx.Client, repeat: int, path: str, **params: Any) -> float:
    """The median milliseconds of *repeat* calls of ``GET path``, after one."""
    client.get(path, params=params).raise_for_status()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        client.get(path, params=params).raise_for_status()
        samples.append((time.perf_counter() - t0) * 1000)
    return b.median(samples)


def time_queries(url: str, repeat: int, queue_names: int) -> dict[str, float]:
    out = {}
    with httpx.Client(base_url=url, headers=b.tenant_headers(), timeout=60) as client:
        for name, path in QUERIES:
            out[name] = timed(client, repeat, path)
        # a second page of dead letters, through its cursor
        cursor = client.get("/api/v1/jobs?status=failed&limit=50").json().get("next_cursor")
        if cursor:
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                client.get("/api/v1/jobs", params={"status": "failed", "limit": 50, "cursor": cursor}).raise_for_status()
                samples.append((time.perf_counter() - t0) * 1000)
            out["dead letters, second page"] = b.median(samples)
        counts = client.get("/api/v1/queues/q3/stats").json()["counts"]
        b.say(f"  q3 counts: {counts}")
        if queue_names:
            for first in range(0, queue_names, 1000):
                names = [f"many-{i:06d}" for i in range(first, min(first + 1000, queue_names))]
                jobs = [{"kind": "k0", "config": {"queue": name}} for name in names]
                client.post("/api/v1/jobs/batch", json={"jobs": jobs}).raise_for_status()
            label = f"{queue_names:,} more queues"
            out[f"{label}: first page (100)"] = timed(client, repeat, "/api/v1/queues")
            middle = base64.urlsafe_b64encode(f"many-{queue_names // 2:06d}".encode()).decode().rstrip("=")
            out[f"{label}: a middle page (100)"] = timed(client, repeat, "/api/v1/queues", cursor=middle)
            out[f"{label}: a middle page (1000)"] = timed(client, repeat, "/api/v1/queues", cursor=middle, limit=1000)
    return out


# -- plans -------------------------------------------------------------------------


def pg_plans(url: str) -> None:
    Q = sql.load("postgres")
    page = Q["page_keys"]
    now = time.time()
    queue_status = "AND queue = $2 AND status = ANY($3::text[])"
    statements = [
        ("stats of one queue", Q["queues_stats"].format(where="AND tenant = $2 AND queue = $3"), [now, b.TENANT, "q3"]),
        ("a page of queues", Q["queues_page"], [now, b.TENANT, "many-010000", 101]),
        (
            "dead letters of a queue",
            page.format(combos=queue_status, running="AND j.queue = $2", keys="", limit="$4"),
            [b.TENANT, "q3", ["failed"], 51],
        ),
        (
            "running jobs of a queue",
            page.format(combos=queue_status, running="AND j.queue = $2", keys="", limit="$4"),
            [b.TENANT, "q3", ["running"], 51],
        ),
        (
            "jobs of a rare kind",
            page.format(combos="AND kind = $2", running="AND j.kind = $2", keys="", limit="$3"),
            [b.TENANT, "rare", 51],
        ),
        ("every job", page.format(combos="", running="", keys="", limit="$2"), [b.TENANT, 51]),
        ("claim", Q["claim"], ["q3", now, 10, 30.0, "w", "lease expired", 0]),
    ]

    async def explain(conn: Any) -> None:
        for name, statement, args in statements:
            prefix = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "
            if name == "claim":  # it would claim: plan only
                prefix = "EXPLAIN (COSTS OFF) "
            rows = await conn.fetch(prefix + statement, *args)
            b.say(f"  -- plan: {name}")
            for row in rows:
                b.say("    " + row[0])

    b.pg_run(url, explain)


def sqlite_plans(path: Path) -> None:
    Q = sql.load("sqlite")
    conn = sqlite3.connect(str(path))
    now = time.time()
    statements = [
        ("counts", Q["counts"].format(where="AND tenant = ?"), [b.TENANT]),
        ("oldest ready", Q["queue_oldest_ready"], [b.TENANT, "q3", now]),
        ("next lease", Q["queue_next_lease"], ["q3", b.TENANT]),
        ("page combos", Q["page_combos"].format(where="AND status IN (?)"), [b.TENANT, "failed"]),
        ("a page of queue names", Q["queues_page"], [b.TENANT, "many-010000", 101]),
        ("one combination's page", Q["combo_page"].format(where="AND (created_at, id) < (?, ?)"),
         [b.TENANT, "q3", "failed", "k13", now, "z", 51]),  # fmt: skip
    ]
    for name, statement, args in statements:
        b.say(f"  -- plan: {name}")
        for row in conn.execute("EXPLAIN QUERY PLAN " + statement, args):
            b.say("    " + str(row[-1]))
    conn.close()


# -- the runs -------------------------------------------------------------------------


def run_size(args: argparse.Namespace, procs: b.Procs, store: str, n: int, base_url: str | None) -> dict[str, float]:
    b.say(f"{store}, {n:,} jobs:")
    if store == "sqlite":
        path = procs.workdir / f"ops-{n}.db"
        b.sqlite_init(path, procs)
        b.say(f"  loaded in {load_sqlite(path, n):.1f}s")
        server = b.start_server(procs, store="sqlite", sqlite_path=path, name=f"sqlite-{n}")
        try:
            timed = time_queries(server.url, args.repeat, args.queue_names)
        finally:
            procs.stop(server.proc)
        if not args.no_plans:
            sqlite_plans(path)
        return timed
    assert base_url is not None
    with b.fresh_database(base_url) as url:
        server = b.start_server(procs, store="postgres", database_url=url, name=f"pg-{n}")  # migrates
        procs.stop(server.proc)
        b.say(f"  loaded in {load_postgres(url, n, args.running):.1f}s")
        server = b.start_server(procs, store="postgres", database_url=url, name=f"pg-{n}")
        try:
            timed = time_queries(server.url, args.repeat, args.queue_names)
            if not args.no_plans:
                pg_plans(url)
        finally:
            procs.stop(server.proc)
        return timed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("ops_scale", args)
    sizes = [int(s) for s in args.sizes.split(",")]
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    table: dict[str, dict[int, dict[str, float]]] = {}
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        for store in stores:
            if store == "postgres":
                with b.pg_cluster(args.database_url) as base:
                    b.say("postgresql:", b.pg_version(base))
                    table[store] = {n: run_size(args, procs, store, n, base) for n in sizes}
            else:
                table[store] = {n: run_size(args, procs, store, n, None) for n in sizes}
    for store, by_size in table.items():
        b.say(f"RESULT ops_scale store={store} (ms, median of {args.repeat} over HTTP)")
        names = list(next(iter(by_size.values())))
        b.say("  " + "query".ljust(44) + "".join(f"{n:>14,}" for n in by_size))
        for name in names:
            b.say("  " + name.ljust(44) + "".join(f"{by_size[n].get(name, float('nan')):>14.2f}" for n in by_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
