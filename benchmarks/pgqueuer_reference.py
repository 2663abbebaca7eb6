#!/usr/bin/env python3
"""qftrio against pgqueuer on one PostgreSQL, same process counts, alternating.

pgqueuer (``.venv/bin/pip install pgqueuer uvloop``; not a qftrio dependency)
runs with its documented settings: its schema in the same fresh database,
``--jobs`` no-op jobs enqueued in batches of 1,000 (``Queries.enqueue`` with
lists), then W worker processes draining with ``batch_size=25`` in drain mode
(``PgQueuer(AsyncpgDriver(conn)).run(batch_size=..., mode=drain)``) on uvloop,
as its own benchmark does.

qftrio: one real ``qftrio serve`` on the same database, the same number of jobs
enqueued through ``POST /api/v1/jobs/batch`` in batches of 1,000, drained by W
``qftrio worker`` processes over HTTP, with their defaults (no tuning flags) or
with the ``--lanes``/``--batch`` a configuration names.

Both rates are processed jobs per second from the first completion to the
last (pgqueuer's workers report their first and last job's wall-clock time;
qftrio's from the rows' ``updated_at``), so process start-up counts for
neither. Each round runs every configuration once, in order; ``--runs``
rounds; the table shows medians. One-job-per-call enqueue is measured too,
``--runs`` rounds of the three in turn: pgqueuer's ``Queries.enqueue`` with
one job, and ``POST /api/v1/jobs`` from one keep-alive ``qftrio.Client`` and
from one ``httpx.Client``.

The ``qf-inproc`` configurations run the handlers in the server instead:
W ``qftrio serve --handlers`` processes on the same database (docs/worker.md: the
worker runtime against the engine, no HTTP), the same process count as
pgqueuer's W workers. They start on a paused queue, which is resumed once
every one of them answers; their CPU per job (handlers, engine and store
together) is counted from then and printed with each round.

``--single-from DIR`` also measures one job per call with a server and a
client that both import qftrio from DIR (a copy of an earlier version, e.g.
``git archive REV qftrio | tar -x -C DIR``), alternating with today's, each
in a process of its own on a database of its own: the one-job-per-call
target is a ratio to an earlier rate, which only a run on the same machine
at the same time can give.

Example::

    .venv/bin/python benchmarks/pgqueuer_reference.py --jobs 20000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx

import _bench as b
import throughput

#: (label, system, workers, lanes, batch); None lanes/batch: the worker's defaults.
CONFIGS: list[tuple[str, str, int, int | None, int | None]] = [
    ("pgq-1", "pgqueuer", 1, None, None),
    ("pgq-2", "pgqueuer", 2, None, None),
    ("qf-default-1", "qftrio", 1, None, None),
    ("qf-default-2", "qftrio", 2, None, None),
    ("qf-tuned-1", "qftrio", 1, 32, 32),
    ("qf-tuned-2", "qftrio", 2, 100, 100),
    ("qf-inproc-1", "qftrio-inprocess", 1, None, None),
    ("qf-inproc-2", "qftrio-inprocess", 2, None, None),
]

#: (target ratio, numerator, denominator): the issue's targets.
TARGETS = [
    (1.0, "qf-default-1", "pgq-1"),
    (1.25, "qf-default-2", "pgq-2"),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", "-n", type=int, default=20_000, help="jobs per run (default 20000)")
    p.add_argument("--runs", "-r", type=int, default=3, help="rounds of every configuration (default 3)")
    p.add_argument("--configs", default=",".join(c[0] for c in CONFIGS), help="labels to run, comma-separated")
    p.add_argument("--pgq-batch", type=int, default=25, help="pgqueuer's batch_size (default 25)")
    p.add_argument("--single", type=int, default=2000, help="jobs enqueued one per call, per system (default 2000; 0 skips)")
    p.add_argument("--single-from", metavar="DIR", help="also measure one job per call with qftrio (server and client) imported from DIR, alternating with today's")
    p.add_argument("--no-uvloop", action="store_true", help="run pgqueuer on the plain asyncio loop")
    p.add_argument("--worker-log-level", default="WARNING")
    p.add_argument("--pgq-child", metavar="URL", help=argparse.SUPPRESS)
    b.add_common(p)
    return p.parse_args(argv)


def _asyncio_run(main: Any, no_uvloop: bool) -> Any:
    if not no_uvloop:
        try:
            import uvloop

            return uvloop.run(main())
        except ImportError:
            pass
    return asyncio.run(main())


def pgq_enqueue(url: str, n: int, *, batch: int) -> tuple[float, float, float]:
    """Enqueue *n* pgqueuer no-op jobs, *batch* per call; the seconds it
    took, the CPU seconds its database server process spent, and this
    process's (the client's)."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> tuple[float, float, float]:
        conn = await asyncpg.connect(url)
        queries = Queries(AsyncpgDriver(conn))
        backend = conn.get_server_pid()
        cpu0, own0, t0 = b.cpu_seconds(backend), time.process_time(), time.perf_counter()
        left = n
        while left:
            k = min(batch, left)
            if k == 1:
                await queries.enqueue("noop", None, 0)
            else:
                await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
            left -= k
        secs, cpu, own = time.perf_counter() - t0, b.cpu_seconds(backend) - cpu0, time.process_time() - own0
        await conn.close()
        return secs, cpu, own

    return asyncio.run(main())


def pgq_install(url: str) -> None:
    """pgqueuer's schema, installed afresh: no run inherits the rows, dead
    tuples and log of the one before (which made its database's CPU per job
    grow from round to round, three- to sixfold)."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> None:
        conn = await asyncpg.connect(url)
        queries = Queries(AsyncpgDriver(conn))
        await queries.uninstall()
        await queries.install()
        await conn.close()

    asyncio.run(main())


def pgq_child(url: str, batch: int, no_uvloop: bool) -> int:
    """One pgqueuer worker process: drain the queue, print what it did."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.types import QueueExecutionMode

    times: list[float] = []

    async def main() -> None:
        conn = await asyncpg.connect(url)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            times.append(time.time())

        await pgq.run(batch_size=batch, mode=QueueExecutionMode.drain)
        await conn.close()

    _asyncio_run(main, no_uvloop)
    print(json.dumps({"done": len(times), "first": min(times, default=0.0), "last": max(times, default=0.0)}))
    return 0


def run_pgqueuer(url: str, workers: int, args: argparse.Namespace, wd: Any) -> dict[str, float]:
    pgq_install(url)
    enqueue_secs, enqueue_cpu, _ = pgq_enqueue(url, args.jobs, batch=1000)
    argv = [sys.executable, os.path.abspath(__file__), "--pgq-child", url, "--pgq-batch", str(args.pgq_batch)]
    if args.no_uvloop:
        argv.append("--no-uvloop")
    pg0 = b.postgres_cpu_seconds()
    children = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=wd) for _ in range(workers)]
    reports = []
    for child in children:
        out, _ = child.communicate(timeout=max(120.0, args.jobs / 50))
        if child.returncode != 0:
            raise RuntimeError(f"a pgqueuer worker exited with {child.returncode}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    done = sum(r["done"] for r in reports)
    if done != args.jobs:
        raise RuntimeError(f"pgqueuer drained {done} of {args.jobs} jobs")
    first = min(r["first"] for r in reports if r["done"])
    last = max(r["last"] for r in reports)
    return {
        "enqueue_jobs_per_s": args.jobs / enqueue_secs,
        "processed_jobs_per_s": (done - 1) / (last - first),
        "postgres_cpu_us_per_job": (b.postgres_cpu_seconds() - pg0) / done * 1e6,
        "enqueue_database_cpu_us_per_job": enqueue_cpu / args.jobs * 1e6,
    }


def run_qftrio(workers: int, lanes: int | None, batch: int | None, args: argparse.Namespace, procs: b.Procs,
               server: b.Server, run: int, url: str) -> dict[str, float]:  # fmt: skip
    targs = argparse.Namespace(
        store="postgres", jobs=args.jobs, enqueue_batch=1000, workers=workers, lanes=lanes, batch=batch,
        worker_log_level=args.worker_log_level, profile_server=None, profile_worker=None, profile_gil=False,
    )  # fmt: skip
    r = throughput.one_run(targs, procs, [server], run, url)
    if r["completed"] != args.jobs:
        raise RuntimeError(f"qftrio completed {r['completed']} of {args.jobs} jobs")
    return {
        "enqueue_jobs_per_s": r["enqueue_jobs_per_s"],
        "processed_jobs_per_s": r["processed_jobs_per_s"],
        "postgres_cpu_us_per_job": r["cpu_us_per_job"]["postgres"],
    }


def run_qftrio_inprocess(servers: int, args: argparse.Namespace, procs: b.Procs, api: b.Server, url: str) -> dict[str, float]:
    """*servers* ``qftrio serve --handlers`` processes drain a queue that
    *api* filled while it was paused."""
    queue = f"ip-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=api.url, headers=b.tenant_headers(), timeout=30) as client:
        client.post(f"/api/v1/queues/{queue}/pause").raise_for_status()
        enqueue_secs = b.enqueue_noop(api.url, queue, args.jobs, batch=1000)
        handlers = [
            b.start_server(procs, store="postgres", database_url=url, name=f"inproc{i}",
                           extra=["--handlers", b.HANDLERS, "--queue", queue])
            for i in range(servers)
        ]  # fmt: skip
        pg0 = b.postgres_cpu_seconds()
        cpu0 = [b.cpu_seconds(h.pid) for h in handlers]
        client.post(f"/api/v1/queues/{queue}/resume").raise_for_status()
        deadline = time.monotonic() + max(60.0, args.jobs / 100)
        while b.queue_counts(api.url, queue)["completed"] < args.jobs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not drained in time: {b.queue_counts(api.url, queue)}")
            time.sleep(0.1)
        pg_cpu = b.postgres_cpu_seconds() - pg0
        servers_cpu = sum(b.cpu_seconds(h.pid) - c for h, c in zip(handlers, cpu0))
    procs.stop_many([h.proc for h in handlers])
    n, first, last = b.completed_span("postgres", queue, database_url=url)
    return {
        "enqueue_jobs_per_s": args.jobs / enqueue_secs,
        "processed_jobs_per_s": (n - 1) / (last - first),
        "postgres_cpu_us_per_job": pg_cpu / n * 1e6,
        "servers_cpu_us_per_job": servers_cpu / n * 1e6,
    }


#: One job per call from one keep-alive client, in a process of its own (so
#: that it imports the qftrio its PYTHONPATH names): argv is the URL, the
#: token, the number of jobs and the client, ``qftrio`` (``qftrio.Client``)
#: or ``httpx`` (``httpx.Client`` posting to ``/api/v1/jobs``, as a web
#: application would); it prints jobs/s and its own CPU µs per job.
_SINGLE_CLIENT = """
import json, sys, time, uuid
url, token, n, which = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
queue = "single-" + uuid.uuid4().hex[:8]
if which == "httpx":
    import httpx
    body = json.dumps({"kind": "noop", "payload": {}, "config": {"queue": queue}}).encode()
    headers = {"authorization": "Bearer " + token, "content-type": "application/json"}
    with httpx.Client(base_url=url, headers=headers) as client:
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            client.post("/api/v1/jobs", content=body).raise_for_status()
        print(n / (time.perf_counter() - t0), (time.process_time() - cpu0) / n * 1e6)
else:
    import trio, qftrio
    async def main():
        async with qftrio.Client(url, token) as client:
            t0, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                await client.enqueue("noop", {}, queue=queue)
            print(n / (time.perf_counter() - t0), (time.process_time() - cpu0) / n * 1e6)
    trio.run(main)
"""


def qftrio_single(url: str, n: int, cwd: Any, env: dict[str, str] | None = None, *, client: str = "qftrio") -> tuple[float, float]:
    """jobs/s of *n* jobs through ``POST /api/v1/jobs`` to *url*, one per
    call, from :data:`_SINGLE_CLIENT` with *client* (``qftrio`` or
    ``httpx``) run with *env* (``None``: this process's), and the client's
    CPU µs per job."""
    out = subprocess.run(
        [sys.executable, "-c", _SINGLE_CLIENT, url, b.TENANT_TOKEN, str(n), client],
        env=env, capture_output=True, text=True, cwd=cwd, timeout=600,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"the one-job-per-call client exited with {out.returncode}: {out.stderr[-2000:]}")
    rate, cpu = out.stdout.split()
    return float(rate), float(cpu)


#: The one-job-per-call clients, measured in this order every round.
SINGLES = ("pgqueuer", "qftrio.Client", "httpx.Client")


@dataclasses.dataclass
class Single:
    """One job per call, one client's run: jobs/s, and CPU µs per job of
    the client, of ``qftrio serve`` (0 for pgqueuer) and of the database
    server processes serving them."""

    rate: float
    client: float
    server: float
    database: float

    def __str__(self) -> str:
        server = f" + server {self.server:,.0f}" if self.server else ""
        return (
            f"{self.rate:,.0f} jobs/s, CPU µs/job: client {self.client:,.0f}{server} + database {self.database:,.0f}"
            f" = {self.client + self.server + self.database:,.0f}"
        )


def qftrio_backends(url: str) -> dict[int, float]:
    """The database server processes of the ``qftrio serve`` connections,
    and the CPU seconds of each so far."""

    async def pids(conn: Any) -> list[int]:
        return [r[0] for r in await conn.fetch("SELECT pid FROM pg_stat_activity WHERE application_name = 'qftrio'")]

    cpu = {}
    for pid in b.pg_run(url, pids):
        with contextlib.suppress(OSError):
            cpu[pid] = b.cpu_seconds(pid)
    return cpu


def single_round(url: str, server: b.Server, n: int, cwd: Any) -> dict[str, Single]:
    """One round of one job per call: pgqueuer's ``Queries.enqueue`` with one
    job, then ``qftrio.Client``, then ``httpx.Client``."""
    pgq_install(url)
    secs, database, client = pgq_enqueue(url, n, batch=1)
    out = {"pgqueuer": Single(n / secs, client / n * 1e6, 0.0, database / n * 1e6)}
    for name, which in (("qftrio.Client", "qftrio"), ("httpx.Client", "httpx")):
        before, serving = qftrio_backends(url), b.cpu_seconds(server.pid)
        rate, client_us = qftrio_single(server.url, n, cwd, client=which)
        serving = b.cpu_seconds(server.pid) - serving
        # a connection the pool opened meanwhile counts whole
        database = sum(cpu - before.get(pid, 0.0) for pid, cpu in qftrio_backends(url).items())
        out[name] = Single(rate, client_us, serving / n * 1e6, database / n * 1e6)
    return out


def single_from(base: str, copy: str, args: argparse.Namespace, procs: b.Procs) -> dict[str, float]:
    """One job per call, today's qftrio and the one in *copy* (server and
    client each), alternating for ``--runs`` rounds: medians of jobs/s."""
    rates: dict[str, list[float]] = {"today": [], "copy": []}
    with b.fresh_database(base) as url_today, b.fresh_database(base) as url_copy:
        envs = {"today": None, "copy": dict(os.environ, PYTHONPATH=os.path.abspath(copy))}
        urls = {"today": url_today, "copy": url_copy}
        servers = {
            side: b.start_server(procs, store="postgres", database_url=urls[side], name=f"single-{side}", env=envs[side])
            for side in rates
        }
        for _ in range(args.runs):
            for side in rates:
                rates[side].append(qftrio_single(servers[side].url, args.single, procs.workdir, envs[side])[0])
                b.say(f"one job per call, {side}: {rates[side][-1]:,.0f} jobs/s")
        procs.stop_many([s.proc for s in servers.values()])
    return {side: b.median(r) for side, r in rates.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pgq_child:
        return pgq_child(args.pgq_child, args.pgq_batch, args.no_uvloop)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    import pgqueuer

    b.print_settings("qftrio vs pgqueuer, same PostgreSQL, alternating", args, pgqueuer_version=pgqueuer.__version__)
    wanted = set(args.configs.split(","))
    configs = [c for c in CONFIGS if c[0] in wanted]
    results: dict[str, list[dict[str, float]]] = {c[0]: [] for c in configs}
    single: dict[str, Single] = {}
    before: dict[str, float] = {}
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        with b.pg_cluster(args.database_url) as base, b.fresh_database(base) as url:
            b.say("postgresql:", b.pg_version(url))
            server = b.start_server(procs, store="postgres", database_url=url)
            run = 0
            for rnd in range(1, args.runs + 1):
                for label, system, workers, lanes, batch in configs:
                    run += 1
                    if system == "pgqueuer":
                        r = run_pgqueuer(url, workers, args, wd)
                    elif system == "qftrio-inprocess":
                        r = run_qftrio_inprocess(workers, args, procs, server, url)
                    else:
                        r = run_qftrio(workers, lanes, batch, args, procs, server, run, url)
                    results[label].append(r)
                    b.say(
                        f"round {rnd} {label}: processed {r['processed_jobs_per_s']:,.0f} jobs/s, enqueue "
                        f"{r['enqueue_jobs_per_s']:,.0f} jobs/s, PostgreSQL CPU {r['postgres_cpu_us_per_job']:,.0f} µs/job"
                        + (f", servers' CPU {r['servers_cpu_us_per_job']:,.0f} µs/job" if "servers_cpu_us_per_job" in r else "")
                        + (
                            f"; its batch enqueue's database process {r['enqueue_database_cpu_us_per_job']:,.1f} µs/job"
                            if "enqueue_database_cpu_us_per_job" in r
                            else ""
                        )
                    )
            if args.single:
                singles: dict[str, list[Single]] = {name: [] for name in SINGLES}
                for rnd in range(1, args.runs + 1):
                    for name, figures in single_round(url, server, args.single, wd).items():
                        singles[name].append(figures)
                        b.say(f"round {rnd} one job per call, {name}: {figures}")
                single = {
                    name: Single(*(b.median([getattr(r, f.name) for r in runs]) for f in dataclasses.fields(Single)))
                    for name, runs in singles.items()
                }
            if args.single and args.single_from:
                before = single_from(base, args.single_from, args, procs)
            procs.stop_all()

    medians = {
        label: {k: b.median([r[k] for r in rs]) for k in rs[0]} for label, rs in results.items() if rs
    }
    print()
    print("| configuration | processed jobs/s | enqueue jobs/s (batches of 1,000) |")
    print("|---|---:|---:|")
    for label, system, workers, lanes, batch in configs:
        m = medians[label]
        how = "defaults" if lanes is None else f"--lanes {lanes} --batch {batch}"
        if system == "pgqueuer":
            how = f"batch_size {args.pgq_batch}"
        elif system == "qftrio-inprocess":
            how = "serve --handlers (the worker in the server), defaults"
        print(f"| {system}, {workers} worker(s), {how} | {m['processed_jobs_per_s']:,.0f} | {m['enqueue_jobs_per_s']:,.0f} |")
    print()
    for target, num, den in TARGETS:
        if num in medians and den in medians:
            ratio = medians[num]["processed_jobs_per_s"] / medians[den]["processed_jobs_per_s"]
            b.say(f"RESULT ratio {num} / {den}: {ratio:.2f} (target >= {target:.2f})")
    if "qf-default-1" in medians and "pgq-1" in medians:
        ratio = medians["qf-default-1"]["enqueue_jobs_per_s"] / medians["pgq-1"]["enqueue_jobs_per_s"]
        b.say(f"RESULT ratio batch enqueue qftrio / pgqueuer: {ratio:.2f} (target >= 1.00)")
    for num, den in (("qf-inproc-1", "pgq-1"), ("qf-inproc-2", "pgq-2")):
        if num in medians and den in medians:
            ratio = medians[num]["processed_jobs_per_s"] / medians[den]["processed_jobs_per_s"]
            b.say(f"RESULT ratio {num} / {den}: {ratio:.2f} (same process count; no target)")
    for name, figures in single.items():
        b.say(f"RESULT one job per call, {name}: {figures} (medians)")
    for name in SINGLES[1:] if single else ():
        ratio = single[name].rate / single["pgqueuer"].rate
        b.say(f"RESULT ratio one job per call, {name} / pgqueuer: {ratio:.2f} (target >= 1.00)")
    if before:
        b.say(
            f"RESULT one job per call, alternating: today {before['today']:,.0f} jobs/s, {args.single_from} "
            f"{before['copy']:,.0f} jobs/s: {before['today'] / before['copy']:.2f}x (target >= 2.00)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
