#!/usr/bin/env python3
"""CPU and wall time of one store call, in-process, without HTTP.

Opens the store directly and makes ``--calls`` sequential calls after
``--warmup`` calls not counted, of each of the ``--calls-of`` kinds, the
kinds alternating run after run:

* ``ping``: ``Store.ping`` (on SQLite a transaction of its own with one
  ``SELECT``; on PostgreSQL one pooled round trip);
* ``insert``: ``Store.jobs_insert`` of ``--jobs`` jobs (default one, what
  ``POST /api/v1/jobs`` asks of the store).

On PostgreSQL more kinds make the same round trips with bare libpq
(psycopg 3's ``pq`` and its non-blocking generators) driven from Trio,
waiting on the socket with ``trio.lowlevel.wait_readable``: the floor the
store's own adapter (``qftrio.server.store.pgtrio``, the same calls with a
pool, adapters and bounds around them) is measured against:

* ``trio-ping``: ``SELECT 1``;
* ``trio-insert``: the store's own ``jobs_insert`` statement, prepared once,
  with the batch of ``--jobs`` jobs the store would send;
* ``trio-insert-uncounted``: the same with the triggers that keep the
  per-queue counts disabled during its runs: what they cost the database.

What is measured is the cost of getting a call to the database and its
answer back: on SQLite the hand-off to the store's thread, on PostgreSQL the
adapter and its pool, or nothing but libpq. Prints µs of CPU (this
process's, all threads; on PostgreSQL also its server processes') and of
wall time per call, for each of ``--runs`` runs, and their medians.
``--without-listing-indexes`` drops the two indexes
that only listings and queue statistics read
(``qftrio_jobs_filter_idx``, ``qftrio_jobs_pending_tenant_idx``) from the
throwaway database first: what they cost an insert.

Examples::

    .venv/bin/python benchmarks/store_call.py --store sqlite
    .venv/bin/python benchmarks/store_call.py --store postgres --calls-of ping,insert,trio-ping,trio-insert
    .venv/bin/python benchmarks/store_call.py --store postgres --calls-of insert,trio-insert,trio-insert-uncounted --jobs 1000 --calls 20 --warmup 5
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, Generator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio

import _bench as b
from qftrio.server.store.base import NewJob, Store


@dataclasses.dataclass
class Kind:
    """A kind of call: ``call()`` once per call, ``enter()`` and ``leave()``
    around each run of it."""

    call: Callable[[], Awaitable[Any]]
    enter: Callable[[], Awaitable[None]] | None = None
    leave: Callable[[], Awaitable[None]] | None = None


#: (CPU µs of this process, CPU µs of the database's server processes, wall µs) per call
Figures = tuple[float, float, float]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--calls", type=int, default=5000, help="calls measured per run (default 5000)")
    p.add_argument("--warmup", type=int, default=200, help="calls made first, not counted (default 200)")
    p.add_argument("--runs", type=int, default=3, help="runs of each kind (default 3)")
    p.add_argument("--calls-of", default="ping", help="kinds of call, comma-separated: ping, insert, trio-ping, trio-insert, trio-insert-uncounted (default ping)")
    p.add_argument("--jobs", type=int, default=1, help="jobs per insert call (default 1)")
    p.add_argument("--without-listing-indexes", action="store_true", help="drop the indexes only listings read, first (PostgreSQL)")
    b.add_common(p)
    return p.parse_args(argv)


def jobs(n: int) -> list[NewJob]:
    return [NewJob(tenant="bench", queue="store-call", kind="noop", payload={}, scheduled_at=time.time())] * n


async def measure(
    kinds: dict[str, Kind], args: argparse.Namespace, backends: Callable[[], Collection[int]] = tuple
) -> dict[str, list[Figures]]:
    """Runs of each kind, alternating; *backends*: the database's server
    processes serving them, whose CPU is counted too."""

    def server_cpu() -> float:
        return sum(b.cpu_seconds(pid) for pid in backends())

    for kind in kinds.values():
        if kind.enter:
            await kind.enter()
        for _ in range(args.warmup):
            await kind.call()
        if kind.leave:
            await kind.leave()
    results: dict[str, list[Figures]] = {name: [] for name in kinds}
    for run in range(1, args.runs + 1):
        for name, kind in kinds.items() if run % 2 else reversed(kinds.items()):
            if kind.enter:
                await kind.enter()
            cpu, server, wall = time.process_time(), server_cpu(), time.perf_counter()
            for _ in range(args.calls):
                await kind.call()
            figures = (
                (time.process_time() - cpu) / args.calls * 1e6,
                (server_cpu() - server) / args.calls * 1e6,
                (time.perf_counter() - wall) / args.calls * 1e6,
            )
            if kind.leave:
                await kind.leave()
            b.say(f"run {run} {name}: " + described(figures, backends()))
            results[name].append(figures)
    return results


def described(figures: Figures, backends: Collection[int]) -> str:
    cpu, server, wall = figures
    database = f", database {server:,.0f} µs CPU" if backends else ""
    return f"{cpu:,.0f} µs CPU{database}, {wall:,.0f} µs wall per call"


def store_kinds(store: Store, names: list[str], n: int) -> dict[str, Kind]:
    async def insert() -> None:
        await store.jobs_insert(jobs(n), now=time.time())

    known = {"ping": Kind(store.ping), "insert": Kind(insert)}
    return {name: known[name] for name in names if name in known}


async def on_sqlite(args: argparse.Namespace) -> tuple[dict[str, list[Figures]], Collection[int]]:
    from qftrio.server.store.sqlite import open_sqlite_store

    with tempfile.TemporaryDirectory() as tmp:
        async with open_sqlite_store(Path(tmp) / "qftrio.db") as store:
            return await measure(store_kinds(store, args.calls_of.split(","), args.jobs), args), ()


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


async def trio_kinds(url: str, names: list[str], n: int) -> tuple[dict[str, Kind], int]:
    """The ``trio-*`` kinds, and the backend pid of their connection."""
    from psycopg import generators, pq

    from qftrio.server.store import postgres

    conn = pq.PGconn.connect(url.encode())
    if conn.status != pq.ConnStatus.OK:
        raise SystemExit(f"store_call.py: libpq could not connect: {conn.get_error_message()!r}")
    conn.nonblocking = 1
    fileno = conn.socket

    async def execute(send: Callable[[], None]) -> list[Any]:
        send()
        results = await _drive(generators.execute(conn), fileno)
        for result in results:
            if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
                raise RuntimeError(result.get_error_message())
        return results

    await execute(lambda: conn.send_prepare(b"jobs_insert", postgres.Q["jobs_insert"].encode()))

    async def ping() -> None:
        await execute(lambda: conn.send_query_params(b"SELECT 1", None))

    async def insert() -> None:
        now = time.time()
        batch = postgres._insert_batch(postgres.new_ids(n, now), jobs(n))
        params = [batch.encode(), repr(now).encode(), postgres.CHANNEL.encode()]
        (result,) = await execute(lambda: conn.send_query_prepared(b"jobs_insert", params))
        assert result.ntuples == n

    def counts(state: str) -> Callable[[], Awaitable[None]]:
        async def alter() -> None:
            for trigger in ("qftrio_jobs_counted_insert", "qftrio_jobs_counted_update", "qftrio_jobs_counted_delete"):
                statement = f"ALTER TABLE qftrio_jobs {state} TRIGGER {trigger}"
                await execute(lambda: conn.send_query_params(statement.encode(), None))

        return alter

    known = {
        "trio-ping": Kind(ping),
        "trio-insert": Kind(insert),
        "trio-insert-uncounted": Kind(insert, enter=counts("DISABLE"), leave=counts("ENABLE")),
    }
    return {name: known[name] for name in names if name in known}, conn.backend_pid


async def on_postgres(args: argparse.Namespace, url: str) -> tuple[dict[str, list[Figures]], Collection[int]]:
    from qftrio.server.store.postgres import open_postgres_store

    names = args.calls_of.split(",")
    async with open_postgres_store(url, pool_size=1) as store:
        if args.without_listing_indexes:
            await store._db.fetch("DROP INDEX qftrio_jobs_filter_idx, qftrio_jobs_pending_tenant_idx")
        kinds, pids = {}, set()
        if any(name.startswith("trio-") for name in names):
            # their own connection, alive as long as the kinds holding it
            kinds, pid = await trio_kinds(url, names, args.jobs)
            pids.add(pid)
        kinds |= store_kinds(store, names, args.jobs)
        backends = lambda: {*store._db.backends, *pids}  # noqa: E731
        return await measure({name: kinds[name] for name in names}, args, backends), backends()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("one store call", args)
    if args.store == "sqlite":
        results, backends = trio.run(on_sqlite, args)
    else:
        with b.pg_cluster(args.database_url) as base, b.fresh_database(base) as url:
            b.say("postgresql:", b.pg_version(url))
            results, backends = trio.run(on_postgres, args, url)
    for name, runs in results.items():
        medians = (
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
            statistics.median(r[2] for r in runs),
        )
        b.say(f"RESULT store_call store={args.store} {name} jobs={args.jobs} calls={args.calls}: {described(medians, backends)} (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
