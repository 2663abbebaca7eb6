#!/usr/bin/env python3
"""What the event stream costs a drain: N no-op jobs of one queue drained by
W remote ``qftrio worker`` processes over HTTP, with no stream open and with
one stream (``GET /api/v1/events?queue=Q``) open on the queue, alternating.

Each run uses a fresh queue, and the two sides take turns to go first. The
jobs are enqueued through ``POST /api/v1/jobs/batch`` (with the stream side's
stream already open, so that it sees them), then the workers start and drain
them. Printed for each side: the drain's rate (completions per second
between the first and the last completion), the server's CPU per job and,
on PostgreSQL, the cluster's CPU per job (from ``/proc``, which a busy
machine disturbs less than the rates); and, on the stream side, the events
the stream delivered (three a job: enqueued, claimed, completed, unless it
overflowed). The medians of both sides and their ratios end it.

Example::

    .venv/bin/python benchmarks/events_drain.py --store postgres --jobs 5000 --runs 3
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid

import httpx

import _bench as b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--jobs", "-n", type=int, default=5_000, help="jobs per run (default 5000)")
    p.add_argument("--workers", "-w", type=int, default=1, help="qftrio worker processes (default 1)")
    p.add_argument("--runs", "-r", type=int, default=3, help="runs of each side; the medians are reported (default 3)")
    b.add_common(p)
    return p.parse_args(argv)


class Stream:
    """A stream of *queue*'s events read in a thread of its own, counting
    ``event: job`` and ``event: overflow``."""

    def __init__(self, url: str, queue: str) -> None:
        self.jobs = 0
        self.overflows = 0
        self.open = threading.Event()
        self._client = httpx.Client(base_url=url, headers=b.tenant_headers(), timeout=httpx.Timeout(30, read=60))
        self._answer: httpx.Response | None = None
        self._thread = threading.Thread(target=self._read, args=(queue,), daemon=True)
        self._thread.start()
        if not self.open.wait(30):
            raise RuntimeError("the stream did not open")

    def _read(self, queue: str) -> None:
        try:
            with self._client.stream("GET", "/api/v1/events", params={"queue": queue}) as answer:
                self._answer = answer
                for line in answer.iter_lines():
                    if line.startswith(":"):
                        self.open.set()  # its first comment: registered, and listening
                    elif line == "event: job":
                        self.jobs += 1
                    elif line == "event: overflow":
                        self.overflows += 1
        except httpx.HTTPError:
            pass  # closed by close()

    def close(self) -> None:
        self._client.close()
        self._thread.join(10)


def one_run(args: argparse.Namespace, procs: b.Procs, server: b.Server, url: str | None, postmaster: int | None, streamed: bool) -> dict[str, float]:
    queue = f"events-{uuid.uuid4().hex[:8]}"
    stream = Stream(server.url, queue) if streamed else None
    try:
        b.enqueue_noop(server.url, queue, args.jobs)
        before = b.reports_seen([server.url])
        cpu = b.cpu_seconds(server.pid)
        db_cpu = b.cluster_cpu_seconds(postmaster) if postmaster else 0.0
        workers = [b.start_worker(procs, server.url, queue, lanes=None, batch=None) for _ in range(args.workers)]
        deadline = time.monotonic() + max(60.0, args.jobs / 100)
        while b.reports_seen([server.url]) - before < args.jobs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not drained in time: {b.queue_counts(server.url, queue)}")
            time.sleep(0.2)
        cpu = b.cpu_seconds(server.pid) - cpu
        db_cpu = (b.cluster_cpu_seconds(postmaster) - db_cpu) if postmaster else float("nan")
        procs.stop_many(workers)
        if stream is not None:
            # the last completions' events, bounded by the work
            wait_until = time.monotonic() + 10
            while stream.jobs < 3 * args.jobs and not stream.overflows and time.monotonic() < wait_until:
                time.sleep(0.05)
    finally:
        if stream is not None:
            stream.close()
    n, first, last = b.completed_span(args.store, queue, database_url=url, sqlite_path=procs.workdir / "qftrio.db")
    return {
        "rate": (n - 1) / (last - first) if last > first else float("nan"),
        "cpu": cpu / args.jobs * 1e6,
        "db_cpu": db_cpu / args.jobs * 1e6,
        "events": float(stream.jobs) if stream else 0.0,
        "overflows": float(stream.overflows) if stream else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("events_drain", args)
    sides = {"no stream": False, "one stream": True}
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with b.store_database(args.store, args.database_url) as url, b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        postmaster = b.postmaster_of(url) if url else None
        server = b.start_server(procs, store=args.store, database_url=url)
        for run in range(1, args.runs + 1):
            # ABBA: whichever side runs second finds the table bigger
            for side in list(sides) if run % 2 else list(sides)[::-1]:
                r = one_run(args, procs, server, url, postmaster, sides[side])
                results[side].append(r)
                b.say(
                    f"run {run}: {side}: {r['rate']:,.0f} jobs/s, server CPU {r['cpu']:.1f} µs/job, "
                    f"database CPU {r['db_cpu']:.1f} µs/job, events {r['events']:,.0f}, overflows {r['overflows']:.0f}"
                )
    med = {side: {k: b.median([r[k] for r in rs]) for k in ("rate", "cpu", "db_cpu", "events")} for side, rs in results.items()}
    off, on = med["no stream"], med["one stream"]
    b.say(
        f"RESULT events_drain store={args.store} jobs={args.jobs} workers={args.workers} runs={args.runs}: "
        f"no stream {off['rate']:,.0f} jobs/s, server {off['cpu']:.1f} µs/job, database {off['db_cpu']:.1f} µs/job; "
        f"one stream {on['rate']:,.0f} jobs/s, server {on['cpu']:.1f} µs/job, database {on['db_cpu']:.1f} µs/job, "
        f"{on['events']:,.0f} events (median); rate ratio {on['rate'] / off['rate']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
