#!/usr/bin/env python3
"""What a janitor round's schedules cost with many schedules stored.

A fresh PostgreSQL database gets ``--schedules`` schedules (every minute,
their next runs spread over the coming hour), then an engine's
``fire_schedules`` (the janitor's step) is timed: median of ``--rounds``
rounds with no schedule due, and with ``--due`` schedules due each round
(each enqueueing one job). Then the plan of the statement that finds the due
schedules is printed (``EXPLAIN ANALYZE``): an index range on
``qftrio_schedules_due_idx``, not a scan of the table.

The goal: 10,000 schedules cost a round at most 50 ms (docs/schedules.md).

Examples::

    .venv/bin/python benchmarks/schedules.py
    .venv/bin/python benchmarks/schedules.py --schedules 100000 --due 100
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import _bench as b
import trio

from qftrio.server.engine import Engine
from qftrio.server.store import sql
from qftrio.server.store.postgres import open_postgres_store

JOB = json.dumps({"kind": "tick", "payload": {}, "config": {"queue": "cron"}})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedules", type=int, default=10_000, help="schedules stored (default 10,000)")
    p.add_argument("--due", type=int, default=100, help="schedules due in each round of the second series (default 100)")
    p.add_argument("--rounds", type=int, default=20, help="rounds per series; the median is reported (default 20)")
    b.add_common(p)
    return p.parse_args(argv)


async def load(url: str, n: int, now: float) -> None:
    async def insert(conn: Any) -> None:
        await conn.execute(
            """INSERT INTO qftrio_schedules (tenant, name, cron, timezone, job, paused, catch_up, next_run_at,
                   created_at, updated_at)
               SELECT 'acme', 's' || i, '* * * * *', 'UTC', $1::jsonb, false, 'latest', $2 + 60 + i % 3600, $2, $2
               FROM generate_series(1, $3) AS i""",
            JOB, now, n,
        )  # fmt: skip
        await conn.execute("ANALYZE qftrio_schedules")

    await trio.to_thread.run_sync(b.pg_run, url, insert)


async def make_due(url: str, n: int, now: float) -> None:
    async def due(conn: Any) -> None:
        await conn.execute(
            """UPDATE qftrio_schedules SET next_run_at = $1
               WHERE name IN (SELECT name FROM qftrio_schedules ORDER BY next_run_at DESC LIMIT $2)""",
            now // 60 * 60, n,  # the latest tick of their every-minute cron
        )  # fmt: skip

    await trio.to_thread.run_sync(b.pg_run, url, due)


async def rounds(engine: Engine, url: str, *, count: int, due: int) -> list[float]:
    times = []
    for _ in range(count):
        if due:
            await make_due(url, due, time.time())
        start = time.perf_counter()
        fired = await engine.fire_schedules()
        times.append((time.perf_counter() - start) * 1000)
        assert fired == due, (fired, due)
    return times


async def plan(url: str) -> str:
    async def explain(conn: Any) -> str:
        async with conn.transaction():
            rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql.load("postgres")["schedules_due"], time.time(), 100)
        return "\n".join(r[0] for r in rows)

    return await trio.to_thread.run_sync(b.pg_run, url, explain)


async def main(args: argparse.Namespace, url: str) -> None:
    async with open_postgres_store(url) as store:
        now = time.time()
        await load(url, args.schedules, now)
        engine = Engine(store)
        await engine.fire_schedules()  # warm-up: connections, statements
        idle = await rounds(engine, url, count=args.rounds, due=0)
        busy = await rounds(engine, url, count=args.rounds, due=args.due)
        b.say(f"{args.schedules} schedules, none due: a round takes {b.median(idle):.2f} ms (median of {args.rounds})")
        b.say(f"{args.schedules} schedules, {args.due} due: a round takes {b.median(busy):.2f} ms (median of {args.rounds})")
        b.say("the plan of schedules_due:\n" + await plan(url))


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.print_settings("schedules: a janitor round's cost", args, postgres=None)
    with b.pg_cluster(args.database_url) as cluster, b.fresh_database(cluster) as url:
        trio.run(main, args, url)
    return 0


if __name__ == "__main__":
    sys.exit(run())
