#!/usr/bin/env python3
"""CPU and wall time of one store call, in-process, without HTTP.

Opens the store directly and makes ``--calls`` sequential calls after
``--warmup`` calls not counted, of each of the ``--calls-of`` kinds, the
kinds alternating run after run:

* ``ping``: ``Store.ping`` (on SQLite a transaction of its own with one
  ``SELECT``; on PostgreSQL one pooled round trip);
* ``insert``: ``Store.jobs_insert`` of one job, what ``POST /api/v1/jobs``
  asks of the store.

On PostgreSQL two more kinds make the same round trips without asyncpg's
thread: libpq (psycopg 3's ``pq`` and its non-blocking generators) driven
from Trio, waiting on the socket with ``trio.lowlevel.wait_readable``:

* ``trio-ping``: ``SELECT 1``;
* ``trio-insert``: the store's own ``jobs_insert`` statement, prepared once,
  with the same one-job batch the store would send.

What is measured is the cost of getting a call to the database and its
answer back: on SQLite the hand-off to the store's thread, on PostgreSQL the
trip to asyncpg's thread and pool, or none. Prints µs of CPU (this
process's, all threads) and of wall time per call, for each of ``--runs``
runs, and their medians; the ``trio-*`` kinds need psycopg
(``.venv/bin/pip install 'psycopg[binary]'``; not a qftrio dependency).

Example::

    .venv/bin/python benchmarks/store_call.py --store sqlite
    .venv/bin/python benchmarks/store_call.py --store postgres --calls-of ping,insert,trio-ping,trio-insert
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio

import _bench as b
from qftrio.server.store.base import NewJob, Store

Call = Callable[[], Awaitable[Any]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--calls", type=int, default=5000, help="calls measured per run (default 5000)")
    p.add_argument("--warmup", type=int, default=200, help="calls made first, not counted (default 200)")
    p.add_argument("--runs", type=int, default=3, help="runs of each kind (default 3)")
    p.add_argument("--calls-of", default="ping", help="kinds of call, comma-separated: ping, insert, trio-ping, trio-insert (default ping)")
    b.add_common(p)
    return p.parse_args(argv)


def one_job() -> NewJob:
    return NewJob(tenant="bench", queue="store-call", kind="noop", payload={}, scheduled_at=time.time())


async def measure(calls: dict[str, Call], args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    for call in calls.values():
        for _ in range(args.warmup):
            await call()
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in calls}
    for run in range(1, args.runs + 1):
        for kind, call in calls.items() if run % 2 else reversed(calls.items()):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                await call()
            cpu_us = (time.process_time() - cpu) / args.calls * 1e6
            wall_us = (time.perf_counter() - wall) / args.calls * 1e6
            b.say(f"run {run} {kind}: {cpu_us:,.0f} µs CPU, {wall_us:,.0f} µs wall per call")
            results[kind].append((cpu_us, wall_us))
    return results


def store_calls(store: Store, kinds: list[str]) -> dict[str, Call]:
    async def insert() -> None:
        await store.jobs_insert([one_job()], now=time.time())

    known = {"ping": store.ping, "insert": insert}
    return {kind: known[kind] for kind in kinds if kind in known}


async def on_sqlite(args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    from qftrio.server.store.sqlite import open_sqlite_store

    with tempfile.TemporaryDirectory() as tmp:
        async with open_sqlite_store(Path(tmp) / "qftrio.db") as store:
            return await measure(store_calls(store, args.calls_of.split(",")), args)


# -- libpq driven from Trio ------------------------------------------------------------


async def _drive(gen: Generator[Any, Any, Any], fileno: int) -> Any:
    """Run one of psycopg's non-blocking generators, waiting on the socket
    through Trio's I/O manager: no thread, no other event loop."""
    from psycopg.waiting import Ready, Wait

    try:
        state = next(gen)
        while True:
            if state & Wait.W:
                await trio.lowlevel.wait_writable(fileno)
                state = gen.send(Ready.W)
            else:
                await trio.lowlevel.wait_readable(fileno)
                state = gen.send(Ready.R)
    except StopIteration as done:
        return done.value


async def trio_calls(url: str, kinds: list[str]) -> dict[str, Call]:
    from psycopg import generators, pq

    from qftrio.server.store import postgres

    conn = pq.PGconn.connect(url.encode())
    if conn.status != pq.ConnStatus.OK:
        raise SystemExit(f"store_call.py: libpq could not connect: {conn.get_error_message()}")
    conn.nonblocking = 1
    fileno = conn.socket

    async def execute(send: Callable[[], None]) -> list[Any]:
        send()
        results = await _drive(generators.execute(conn), fileno)
        for result in results:
            if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
                raise RuntimeError(result.get_error_message())
        return results

    statement = postgres.Q["jobs_insert"]
    await execute(lambda: conn.send_prepare(b"jobs_insert", statement.encode()))

    async def ping() -> None:
        await execute(lambda: conn.send_query_params(b"SELECT 1", None))

    async def insert() -> None:
        now = time.time()
        batch = postgres._insert_batch(postgres.new_ids(1, now), [one_job()])
        params = [batch.encode(), repr(now).encode(), postgres.CHANNEL.encode()]
        (result,) = await execute(lambda: conn.send_query_prepared(b"jobs_insert", params))
        assert result.ntuples == 1

    known = {"trio-ping": ping, "trio-insert": insert}
    return {kind: known[kind] for kind in kinds if kind in known}


async def on_postgres(args: argparse.Namespace, url: str) -> dict[str, list[tuple[float, float]]]:
    from qftrio.server.store.postgres import open_postgres_store

    kinds = args.calls_of.split(",")
    async with open_postgres_store(url, pool_size=2) as store:
        calls = store_calls(store, kinds) | await trio_calls(url, kinds)
        return await measure({kind: calls[kind] for kind in kinds}, args)


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
    for kind, figures in results.items():
        cpu = statistics.median(r[0] for r in figures)
        wall = statistics.median(r[1] for r in figures)
        b.say(
            f"RESULT store_call store={args.store} {kind} calls={args.calls}: "
            f"{cpu:,.0f} µs CPU, {wall:,.0f} µs wall per call (medians)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
