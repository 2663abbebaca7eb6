#!/usr/bin/env python3
"""Enqueue -> handler start latency on an idle long-poll.

One ``qftrio worker`` process (lanes 1, batch 1) sits in a long poll on an
empty queue. The benchmark enqueues one job at a time (``POST /api/v1/jobs``)
carrying ``time.time()`` taken just before the request is sent; the ``stamp``
handler (``noop_handlers.py``) appends that and its own ``time.time()`` at
start to a file. Same host, same clock. After each job it waits until the
stamp is written, then ``--gap`` seconds more so that the worker has reported
and is parked in its next long poll before the next enqueue.

``--ab DIR`` runs a second server and worker importing qftrio from DIR (a copy
of another version: ``git archive REV qftrio | tar -x -C DIR``), each on a
store of its own, both idle on their long polls, and alternates the two every
``--round`` samples: both sides see the same moments of a shared machine. It
prints each side's percentiles over all its samples and the median of its
rounds' p50s.

``--servers 2`` (PostgreSQL) sends the enqueues to a second server on the
same database: the parked poll is woken by NOTIFY, through the first
server's LISTEN connection, and claims the job itself.

The CPU the servers and the worker spent per job (the whole job: enqueue,
lease, report, the next long poll) is printed with each side.

Examples::

    .venv/bin/python benchmarks/latency.py --store sqlite --samples 200
    .venv/bin/python benchmarks/latency.py --store postgres --ab /tmp/old-main
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid

import httpx

import _bench as b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--samples", type=int, default=200, help="jobs measured, per side (default 200)")
    p.add_argument("--warmup", type=int, default=10, help="jobs run first and not counted, per side (default 10)")
    p.add_argument("--gap", type=float, default=0.05, help="idle seconds between a job's start and the next enqueue (default 0.05)")
    p.add_argument("--wait-secs", type=float, default=20, help="the worker's --wait-secs (default 20)")
    p.add_argument("--servers", type=int, choices=[1, 2], default=1, help="2: enqueue on a second server sharing the database, so that the wake goes through NOTIFY and LISTEN (PostgreSQL only)")
    p.add_argument("--ab", metavar="DIR", help="alternate with a server and worker importing qftrio from DIR (a copy of another version); both sides are printed")
    p.add_argument("--round", type=int, default=5, help="with --ab, samples of one side before the other's turn (default 5)")
    b.add_common(p)
    args = p.parse_args(argv)
    if args.servers == 2 and args.store != "postgres":
        p.error("--servers 2 needs --store postgres (one process owns a SQLite file)")
    return args


class Side:
    """A server and its worker, idle on a long poll, and the jobs sent them."""

    def __init__(self, name: str, args: argparse.Namespace, procs: b.Procs, database_url: str | None, env: dict[str, str] | None) -> None:
        self.name = name
        tag = name.strip() or "A"
        store = procs.workdir / f"{tag}.db"
        self.server = b.start_server(procs, store=args.store, database_url=database_url, sqlite_path=store, name=f"server{tag}", env=env)
        self.queue = f"lat-{uuid.uuid4().hex[:8]}"
        self.stamps = procs.workdir / f"stamps-{tag}.txt"
        self.stamps.touch()
        self.worker = b.start_worker(
            procs, self.server.url, self.queue, lanes=1, batch=1, wait_secs=args.wait_secs, name=f"worker{tag}",
            env={**(env or {}), "QFTRIO_BENCH_STAMPS": str(self.stamps)},
        )  # fmt: skip
        self.servers = [self.server]
        if args.servers == 2:
            self.servers.append(b.start_server(procs, store=args.store, database_url=database_url, name=f"enqueue{tag}", env=env))
        self.client = httpx.Client(base_url=self.servers[-1].url, headers=b.tenant_headers(), timeout=30)
        self.sent = 0
        self.latencies: list[float] = []
        self.rounds: list[list[float]] = []
        self.cpu = {"servers": 0.0, "worker": 0.0}  # seconds, over the counted samples

    def cpu_now(self) -> dict[str, float]:
        return {"servers": sum(b.cpu_seconds(s.pid) for s in self.servers), "worker": b.cpu_seconds(self.worker.pid)}

    def round(self, args: argparse.Namespace, procs: b.Procs, n: int) -> None:
        """*n* counted samples, and the CPU the server and worker spent on them."""
        before = self.cpu_now()
        self.rounds.append([self.one(args, procs, count=True) for _ in range(n)])
        for name, secs in self.cpu_now().items():
            self.cpu[name] += secs - before[name]

    def one(self, args: argparse.Namespace, procs: b.Procs, count: bool) -> float:
        """Enqueue one job and wait for its handler to start: the latency."""
        i = self.sent
        t = time.time()
        r = self.client.post("/api/v1/jobs", json={"kind": "stamp", "payload": {"t": t}, "config": {"queue": self.queue}})
        if r.status_code != 201:
            raise RuntimeError(f"enqueue answered {r.status_code}: {r.text[:200]}")
        self.sent += 1
        deadline = time.monotonic() + (60 if i == 0 else 10)  # the first waits for the worker to start
        while True:
            lines = self.stamps.read_text().splitlines()
            if len(lines) > i:
                break
            if self.worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.worker.returncode}:\n{procs.log_tail(self.worker)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {i} did not start in time")
            time.sleep(0.0005)
        sent, started, _ = lines[i].split()
        latency = float(started) - float(sent)
        if count:
            self.latencies.append(latency)
        time.sleep(args.gap if i else 1.0)
        return latency

    def close(self) -> None:
        self.client.close()


def measure(args: argparse.Namespace, procs: b.Procs, urls: list[str | None]) -> list[Side]:
    sides = [Side("", args, procs, urls[0], None)]
    if args.ab:
        env = {"PYTHONPATH": os.pathsep.join([os.path.abspath(args.ab), str(b.BENCH_DIR)])}
        sides.append(Side("B ", args, procs, urls[1], env))
    try:
        for side in sides:
            for _ in range(args.warmup):
                side.one(args, procs, count=False)
        size = args.round if args.ab else args.samples
        while any(len(side.latencies) < args.samples for side in sides):
            for side in sides:
                n = min(size, args.samples - len(side.latencies))
                if n > 0:
                    side.round(args, procs, n)
    finally:
        for side in sides:
            side.close()
    return sides


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("enqueue -> handler start latency, idle long-poll", args)
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs, contextlib.ExitStack() as stack:
        urls: list[str | None] = [None, None]
        if args.store == "postgres":
            base = stack.enter_context(b.pg_cluster(args.database_url))
            urls = [stack.enter_context(b.fresh_database(base)) for _ in range(2 if args.ab else 1)]
            b.say("postgresql:", b.pg_version(base))
        sides = measure(args, procs, urls)
        procs.stop_all()
    for side in sides:
        ms = [x * 1000 for x in side.latencies]
        rounds = f", median of {len(side.rounds)} rounds' p50 {b.median([b.percentile([x * 1000 for x in r], 50) for r in side.rounds]):.2f} ms" if args.ab else ""
        b.say(
            f"{side.name}RESULT latency store={args.store} servers={args.servers} samples={len(ms)}: p50 {b.percentile(ms, 50):.2f} ms, "
            f"p90 {b.percentile(ms, 90):.2f} ms, p99 {b.percentile(ms, 99):.2f} ms, max {max(ms):.2f} ms, "
            f"min {min(ms):.2f} ms{rounds} (targets p50 <= 2 ms, p99 <= 5 ms); CPU µs per job: "
            + ", ".join(f"{name} {secs / len(ms) * 1e6:,.0f}" for name, secs in side.cpu.items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
