#!/usr/bin/env python3
"""How many events per second one event stream (``GET /api/v1/events``)
sustains: one consumer reads one stream of a queue as fast as it can while
changes come as fast as the server makes them (batch enqueues of 1,000 one
call at a time, and a drain by ``qftrio worker`` processes at the same time,
so that enqueued, claimed and completed events all flow: three a job, or
two for a job handed straight to a waiting lease, which is inserted running).

Printed for each run: the events per second produced (the changes made, over
the time from the first enqueue to the last completion: the events delivered,
unless the stream overflowed, then three a job), the events per second
the stream delivered (from its first event to its last), whether ``overflow``
came and after how many events, and the server's CPU per job (all of it:
the enqueues, claims and completions as well as the stream).

Then the same with a slow consumer, one that reads at most ``--slow-rate``
events a second, with a small receive buffer (``--slow-rcvbuf``, so that the
kernel's buffers do not hide how slowly it reads): the stream must end in
``overflow``, and the server's resident memory before, at its highest during,
and after the run says whether the server held what the consumer did not take.

The consumer reads the raw socket in a thread of its own and counts the
``event: job`` lines; it parses nothing else, so that it is not what limits
the stream.

Example::

    .venv/bin/python benchmarks/events_rate.py --store sqlite --jobs 20000 --runs 3
    .venv/bin/python benchmarks/events_rate.py --store postgres --jobs 20000 --runs 3
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
import uuid

import _bench as b

JOB_EVENT = b"event: job\n"
OVERFLOW = b"event: overflow\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--jobs", "-n", type=int, default=20_000, help="jobs per run (default 20000): three events each")
    p.add_argument("--workers", "-w", type=int, default=1, help="qftrio worker processes draining (default 1)")
    p.add_argument("--runs", "-r", type=int, default=3, help="runs with a fast consumer; medians reported (default 3)")
    p.add_argument("--slow-rate", type=float, default=2_000, help="events a second the slow consumer reads (default 2000)")
    p.add_argument("--profile-server", metavar="TXT", help="record the server with py-spy during the first fast run (.svg, or .txt for raw collapsed stacks: profile_summary.py)")
    p.add_argument("--slow-rcvbuf", type=int, default=65_536, help="the slow consumer's SO_RCVBUF in bytes (default 65536)")
    b.add_common(p)
    return p.parse_args(argv)


class Reader:
    """One stream of *queue*'s events over a raw socket, read in a thread:
    as fast as it comes, or at most *rate* events a second."""

    def __init__(self, port: int, queue: str, *, rate: float | None = None, rcvbuf: int | None = None) -> None:
        self.events = 0
        self.overflowed_after: int | None = None
        self.first = self.last = 0.0
        self.ended = threading.Event()
        self._open = threading.Event()
        self._rate = rate
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window
        self._sock.connect(("127.0.0.1", port))
        self._sock.sendall(
            f"GET /api/v1/events?queue={queue} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {b.TENANT_TOKEN}\r\n\r\n".encode()
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if not self._open.wait(30):
            raise RuntimeError("the stream did not open")

    def _read(self) -> None:
        size = 4096 if self._rate else 1 << 16
        carry = b""
        try:
            while True:
                data = self._sock.recv(size)
                if not data:
                    return
                now = time.perf_counter()
                seen = carry + data
                if not self._open.is_set():
                    if not seen.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(f"the stream answered {seen[:200]!r}")
                    if b": keep-alive" in seen:  # registered, and listening
                        self._open.set()
                n = seen.count(JOB_EVENT) - carry.count(JOB_EVENT)
                if n:
                    if not self.events:
                        self.first = now
                    self.events += n
                    self.last = now
                if OVERFLOW in seen:
                    self.overflowed_after = self.events
                if seen.endswith(b"\r\n0\r\n\r\n"):
                    return  # the answer's last chunk
                # a line split across two reads is seen whole, and counted once
                carry = seen[-(len(OVERFLOW) - 1) :]
                if self._rate and n:
                    time.sleep(n / self._rate)
        except OSError:
            pass  # closed by close()
        finally:
            self.ended.set()

    @property
    def delivered_rate(self) -> float:
        return (self.events - 1) / (self.last - self.first) if self.last > self.first else float("nan")

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(10)


class RssPeak:
    """The highest resident memory of *pid* while it runs, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.peak = b.rss_mib(pid)
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, b.rss_mib(self._pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def one_run(
    args: argparse.Namespace, procs: b.Procs, server: b.Server, url: str | None, slow: bool, profile: str | None = None
) -> dict[str, float]:
    queue = f"rate-{uuid.uuid4().hex[:8]}"
    workers = [b.start_worker(procs, server.url, queue, lanes=None, batch=None) for _ in range(args.workers)]
    try:
        # one job first: the workers are up and polling before the clock starts
        before = b.reports_seen([server.url])
        b.enqueue_noop(server.url, queue, 1)
        deadline = time.monotonic() + 60
        while b.reports_seen([server.url]) == before:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start")
            time.sleep(0.05)
        reader = Reader(server.port, queue, rate=args.slow_rate if slow else None, rcvbuf=args.slow_rcvbuf if slow else None)
        try:
            rss_before = b.rss_mib(server.pid)
            peak = RssPeak(server.pid)
            spy = b.start_pyspy(procs, profile, server.pid, gil=True) if profile else None
            cpu = b.cpu_seconds(server.pid)
            before = b.reports_seen([server.url])
            started = time.time()
            b.enqueue_noop(server.url, queue, args.jobs)
            deadline = time.monotonic() + max(60.0, args.jobs / 100)
            while b.reports_seen([server.url]) - before < args.jobs:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not drained in time: {b.queue_counts(server.url, queue)}")
                time.sleep(0.05)
            cpu = b.cpu_seconds(server.pid) - cpu
            if spy is not None:
                b.stop_pyspy(procs, spy)
            # what is still on its way, bounded by the work: a slow consumer
            # reads until its overflow, a fast one until its events stop
            wait_until = time.monotonic() + (3 * args.jobs / args.slow_rate + 30 if slow else 30)
            while reader.events < 3 * args.jobs and reader.overflowed_after is None and time.monotonic() < wait_until:
                if not slow and time.perf_counter() - reader.last > 1:
                    break
                time.sleep(0.02)
            rss_peak = peak.stop()
            rss_after = b.rss_mib(server.pid)
        finally:
            reader.close()
    finally:
        procs.stop_many(workers)
    _, _, last = b.completed_span(args.store, queue, database_url=url, sqlite_path=procs.workdir / "qftrio.db")
    return {
        # every change, when none was cut off
        "produced": (3 * args.jobs if reader.overflowed_after is not None else reader.events) / (last - started),
        "delivered": reader.delivered_rate,
        "events": float(reader.events),
        "overflow": float(reader.overflowed_after if reader.overflowed_after is not None else -1),
        "cpu": cpu / args.jobs * 1e6,
        "rss_before": rss_before,
        "rss_peak": rss_peak,
        "rss_after": rss_after,
    }


def describe(r: dict[str, float]) -> str:
    overflow = f"overflow after {r['overflow']:,.0f} events" if r["overflow"] >= 0 else "no overflow"
    return (
        f"produced {r['produced']:,.0f} events/s, delivered {r['delivered']:,.0f} events/s "
        f"({r['events']:,.0f} events), {overflow}; server CPU {r['cpu']:.1f} µs/job; "
        f"server RSS {r['rss_before']:.1f} MiB before, {r['rss_peak']:.1f} at most, {r['rss_after']:.1f} after"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("events_rate", args)
    fast: list[dict[str, float]] = []
    with b.store_database(args.store, args.database_url) as url, b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        server = b.start_server(procs, store=args.store, database_url=url)
        for run in range(1, args.runs + 1):
            fast.append(one_run(args, procs, server, url, slow=False, profile=args.profile_server if run == 1 else None))
            b.say(f"run {run}: fast consumer: {describe(fast[-1])}")
        slow = one_run(args, procs, server, url, slow=True)
        b.say(f"slow consumer ({args.slow_rate:,.0f} events/s): {describe(slow)}")
    med = {k: b.median([r[k] for r in fast]) for k in ("produced", "delivered", "cpu")}
    overflows = sum(r["overflow"] >= 0 for r in fast)
    b.say(
        f"RESULT events_rate store={args.store} jobs={args.jobs} workers={args.workers} runs={args.runs}: "
        f"fast consumer delivered {med['delivered']:,.0f} events/s of {med['produced']:,.0f} produced (medians), "
        f"server CPU {med['cpu']:.1f} µs/job, overflow in {overflows} of {len(fast)} runs; "
        f"slow consumer ({args.slow_rate:,.0f} events/s) "
        + (f"overflowed after {slow['overflow']:,.0f} events" if slow["overflow"] >= 0 else "did NOT overflow")
        + f", server RSS {slow['rss_before']:.1f} / {slow['rss_peak']:.1f} / {slow['rss_after']:.1f} MiB (before / peak / after)"
    )
    return 0 if slow["overflow"] >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
