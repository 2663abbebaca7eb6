#!/usr/bin/env python3
"""CPU and wall time of one store call, in-process, without HTTP.

Opens the store directly and makes ``--calls`` sequential calls of
``Store.ping`` (on SQLite a transaction of its own with one ``SELECT``; on
PostgreSQL one pooled round trip), after ``--warmup`` calls not counted. What
is measured is the cost of getting a call to the database and its answer
back: on SQLite the hand-off to the store's thread, on PostgreSQL the trip
to asyncpg's thread and pool. Prints µs of CPU (this process's,
all threads) and of wall time per call, for each of ``--runs`` runs, and
their medians.

Example::

    .venv/bin/python benchmarks/store_call.py --store sqlite
    .venv/bin/python benchmarks/store_call.py --store postgres
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio

import _bench as b
from qftrio.server.store.base import Store


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--calls", type=int, default=5000, help="calls measured per run (default 5000)")
    p.add_argument("--warmup", type=int, default=200, help="calls made first, not counted (default 200)")
    p.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    b.add_common(p)
    return p.parse_args(argv)


async def measure(store: Store, args: argparse.Namespace) -> list[tuple[float, float]]:
    for _ in range(args.warmup):
        await store.ping()
    results = []
    for run in range(1, args.runs + 1):
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(args.calls):
            await store.ping()
        cpu_us = (time.process_time() - cpu) / args.calls * 1e6
        wall_us = (time.perf_counter() - wall) / args.calls * 1e6
        b.say(f"run {run}: {cpu_us:,.0f} µs CPU, {wall_us:,.0f} µs wall per call")
        results.append((cpu_us, wall_us))
    return results


async def on_sqlite(args: argparse.Namespace) -> list[tuple[float, float]]:
    from qftrio.server.store.sqlite import open_sqlite_store

    with tempfile.TemporaryDirectory() as tmp:
        async with open_sqlite_store(Path(tmp) / "qftrio.db") as store:
            return await measure(store, args)


async def on_postgres(args: argparse.Namespace, url: str) -> list[tuple[float, float]]:
    from qftrio.server.store.postgres import open_postgres_store

    async with open_postgres_store(url, pool_size=2) as store:
        return await measure(store, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("one store call", args)
    if args.store == "sqlite":
        results = trio.run(on_sqlite, args)
    else:
        with b.pg_cluster(args.database_url) as base, b.fresh_database(base) as url:
            b.say("postgresql:", b.pg_version(url))
            results = trio.run(on_postgres, args, url)
    cpu = statistics.median(r[0] for r in results)
    wall = statistics.median(r[1] for r in results)
    b.say(f"RESULT store_call store={args.store} calls={args.calls}: {cpu:,.0f} µs CPU, {wall:,.0f} µs wall per call (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
