#!/usr/bin/env python3
"""The seed protocol used strictly, against the server's plain-request ceiling.

A minimal worker written with httpx (not qftrio's runtime): each lane loops
``POST /api/v1/queues/{q}/lease {"max_jobs": 1, "wait_secs": 0}`` then
``POST /api/v1/jobs/{id}/complete``: one lease and one complete request per
job, no batch routes, no heartbeats (the jobs are no-ops). The ceiling is the
fastest plain request the server answers, from the same load generator:
``GET /healthz`` (which pings the store), a ``GET`` of an unknown route, or a
``POST`` lease without a credential (401 from the protocol front), with the
same lanes and processes, in the same run (/healthz before and after the seed
phase). Each lane has its own HTTP connection.

The load generator is, by default, a minimal HTTP/1.1 client on Trio sockets
(``--client raw``: keep-alive, one request at a time per connection, answers
read by ``Content-Length``), cheap enough that the server, not the load
generator, is what runs out of CPU. ``--client httpx`` uses one
``httpx.AsyncClient`` per lane instead (so httpx's pool is not what is
measured); httpx costs several times the server's CPU per request, and then
the load generator's ceiling is measured, not the server's.

Besides the rates, the server's CPU time per request and per job is printed
(from ``/proc``), and the ratio those give: the ratio the rates would have if
the server were busy throughout every phase.

Reported: seed jobs/s, seed requests/s (2 per job), each plain rate, the
ratio jobs/s ÷ the fastest plain rate (the target's), and, since a job costs
two requests, requests/s ÷ that rate as well.

Example::

    .venv/bin/python benchmarks/seed_strict.py --store sqlite --lanes 8 --duration 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid

import trio

import _bench as b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--lanes", type=int, default=8, help="concurrent lanes per load process (default 8)")
    p.add_argument("--procs", type=int, default=1, help="load-generator processes (default 1)")
    p.add_argument("--client", choices=["raw", "httpx"], default="raw", help="the load generator's HTTP client (default raw)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per phase (default 10)")
    p.add_argument("--jobs", type=int, default=30_000, help="jobs enqueued for the seed phase (default 30000); the phase ends early if they run out")
    p.add_argument("--profile-server", metavar="FILE", help="py-spy record the server during the seed phase (.svg, or .txt for raw stacks)")
    p.add_argument("--profile-gil", action="store_true", help="profile only the thread holding the GIL (py-spy --gil)")
    b.add_common(p)
    # internal: a load-generator child
    p.add_argument("--child", choices=["healthz", "notfound", "unauth", "seed"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--queue", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- the load generator (child process) ---------------------------------------------


class RawHttp:
    """A minimal HTTP/1.1 client on one Trio connection at a time: one
    request at a time, answers framed by ``Content-Length`` (which qftrio
    always sends). Like httpx, it opens a new connection after the server
    closes one (``Connection: close``, or a closed idle connection, on which
    the request is sent again once)."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self.stream: trio.SocketStream | None = None
        self.buffer = bytearray()
        self.fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{host}:{port}", **headers}.items()).encode()

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        head = b"%s %s HTTP/1.1\r\n%s" % (method.encode(), path.encode(), self.fixed)
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        data = head + b"\r\n" + (body or b"")
        while True:
            fresh = self.stream is None
            if self.stream is None:
                self.stream = await trio.open_tcp_stream(self.host, self.port)
                self.buffer.clear()
            try:
                await self.stream.send_all(data)
                status, answer, close = await self._answer()
            except (ConnectionError, trio.BrokenResourceError):
                await self.aclose()
                if fresh:
                    raise
                continue  # the server had closed the idle connection
            if close:
                await self.aclose()
            return status, answer

    async def _answer(self) -> tuple[int, bytes, bool]:
        buffer = self.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            await self._fill()
        lines = bytes(buffer[:end]).split(b"\r\n")
        del buffer[: end + 4]
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = b"close" in value.lower()
        while len(buffer) < length:
            await self._fill()
        answer = bytes(buffer[:length])
        del buffer[:length]
        return int(lines[0][9:12]), answer, close

    async def _fill(self) -> None:
        assert self.stream is not None
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data


def child(args: argparse.Namespace) -> int:
    import httpx
    import orjson

    done = 0
    errors = 0
    last = 0.0
    host, port = args.url.removeprefix("http://").rsplit(":", 1)

    @contextlib.asynccontextmanager
    async def connection(headers: dict[str, str]):
        """(method, path, json body) -> (status, body bytes), on one connection."""
        if args.client == "raw":
            raw = RawHttp(host, int(port), headers)
            try:

                async def call(method: str, path: str, body: object = None) -> tuple[int, bytes]:
                    return await raw.request(method, path, None if body is None else orjson.dumps(body))

                yield call
            finally:
                await raw.aclose()
        else:
            limits = httpx.Limits(max_connections=1)
            async with httpx.AsyncClient(base_url=args.url, headers=headers, limits=limits, timeout=30) as c:

                async def call(method: str, path: str, body: object = None) -> tuple[int, bytes]:
                    r = await c.request(method, path, content=None if body is None else orjson.dumps(body))
                    return r.status_code, r.content

                yield call

    async def lane_plain(path: str, stop_at: float) -> None:
        nonlocal done, errors, last
        method, _, path = path.rpartition(" ")
        async with connection({}) as call:
            while trio.current_time() < stop_at:
                status, _ = await call(method or "GET", path, {} if method == "POST" else None)
                if status in (200, 401, 404):
                    done += 1
                else:
                    errors += 1
                last = time.perf_counter()

    async def lane_seed(stop_at: float) -> None:
        nonlocal done, errors, last
        async with connection(b.worker_headers()) as call:
            while trio.current_time() < stop_at:
                status, answer = await call(
                    "POST", f"/api/v1/queues/{args.queue}/lease", {"max_jobs": 1, "lease_secs": 60, "wait_secs": 0}
                )
                if status != 200:
                    errors += 1
                    continue
                jobs = orjson.loads(answer)["jobs"]
                if not jobs:
                    return  # ran out of work
                lease = jobs[0]
                status, _ = await call(
                    "POST",
                    f"/api/v1/jobs/{lease['job']['id']}/complete",
                    {"lease_token": lease["lease_token"], "result": {}},
                )
                if status == 204:
                    done += 1
                    last = time.perf_counter()
                else:
                    errors += 1

    async def main() -> float:
        stop_at = trio.current_time() + args.duration
        t0 = time.perf_counter()
        async with trio.open_nursery() as n:
            for _ in range(args.lanes):
                if args.child == "seed":
                    n.start_soon(lane_seed, stop_at)
                else:
                    path = {
                        "healthz": "/healthz",
                        "notfound": "/bench-not-a-route",
                        "unauth": f"POST /api/v1/queues/{args.queue}/lease",
                    }[args.child]
                    n.start_soon(lane_plain, path, stop_at)
        return t0

    t0 = trio.run(main)
    print(json.dumps({"done": done, "errors": errors, "elapsed": max(1e-9, last - t0), "cpu": time.process_time()}), flush=True)
    return 0


def load(args: argparse.Namespace, kind: str, url: str, queue: str = "", server_pid: int | None = None) -> dict:
    """Run *kind* load from ``--procs`` child processes at once; sum them.
    With *server_pid*, also the server's CPU use over the phase (1.0 = one
    core busy throughout)."""
    server_cpu = b.cpu_seconds(server_pid) if server_pid else 0.0
    started = time.perf_counter()
    argv = [sys.executable, __file__, "--child", kind, "--url", url, "--queue", queue or "-",
            "--lanes", str(args.lanes), "--duration", str(args.duration), "--client", args.client]  # fmt: skip
    environ = __import__("os").environ
    env = {**environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(b.BENCH_DIR), environ.get("PYTHONPATH")]))}
    kids = [subprocess.Popen(argv, stdout=subprocess.PIPE, env=env) for _ in range(args.procs)]
    outs = []
    try:
        for k in kids:
            out, _ = k.communicate(timeout=args.duration + 120)
            outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for k in kids:
            if k.poll() is None:
                k.kill()
                k.wait()
    wall = time.perf_counter() - started
    done = sum(o["done"] for o in outs)
    errors = sum(o["errors"] for o in outs)
    elapsed = max(o["elapsed"] for o in outs)
    return {
        "done": done,
        "errors": errors,
        "elapsed": elapsed,
        "rate": done / elapsed,
        "server_busy": (b.cpu_seconds(server_pid) - server_cpu) / wall if server_pid else float("nan"),
        "server_us": (b.cpu_seconds(server_pid) - server_cpu) / max(done, 1) * 1e6 if server_pid else float("nan"),
        "load_busy": sum(o["cpu"] for o in outs) / wall,
    }


def busy(r: dict) -> str:
    return (
        f"server CPU {r['server_busy']:.0%} of a core ({r['server_us']:,.0f} µs each), "
        f"load generator {r['load_busy']:.0%}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("seed protocol, strictly", args)
    with b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        with b.pg_cluster(args.database_url if args.store == "postgres" else "unused") as base:
            db_ctx = b.fresh_database(base) if args.store == "postgres" else None
            url_db = db_ctx.__enter__() if db_ctx else None
            try:
                if url_db:
                    b.say("postgresql:", b.pg_version(url_db))
                server = b.start_server(procs, store=args.store, database_url=url_db)
                queue = f"seed-{uuid.uuid4().hex[:8]}"
                b.enqueue_noop(server.url, queue, args.jobs)
                before = load(args, "healthz", server.url, server_pid=server.pid)
                b.say(f"GET /healthz (before): {before['rate']:,.0f} req/s ({before['done']} in {before['elapsed']:.1f}s, {before['errors']} errors); {busy(before)}")
                nf = load(args, "notfound", server.url, server_pid=server.pid)
                b.say(f"GET unknown route, 404 (no store): {nf['rate']:,.0f} req/s; {busy(nf)}")
                unauth = load(args, "unauth", server.url, queue, server_pid=server.pid)
                b.say(f"POST lease without a credential, 401 (protocol front, no store): {unauth['rate']:,.0f} req/s; {busy(unauth)}")
                spy = (
                    b.start_pyspy(procs, args.profile_server, server.pid, gil=args.profile_gil)
                    if args.profile_server
                    else None
                )
                seed = load(args, "seed", server.url, queue, server_pid=server.pid)
                if spy is not None:
                    b.stop_pyspy(procs, spy)
                b.say(
                    f"seed strict: {seed['rate']:,.0f} jobs/s = {2 * seed['rate']:,.0f} req/s "
                    f"({seed['done']} jobs in {seed['elapsed']:.1f}s, {seed['errors']} errors); {busy(seed)}"
                )
                after = load(args, "healthz", server.url, server_pid=server.pid)
                b.say(f"GET /healthz (after): {after['rate']:,.0f} req/s; {busy(after)}")
                procs.stop_all()
            finally:
                if db_ctx:
                    db_ctx.__exit__(None, None, None)
    healthz = (before["rate"] + after["rate"]) / 2
    # The strictest ceiling: the fastest plain request the server answered.
    ceiling = max(healthz, nf["rate"], unauth["rate"])
    plain_us = min(before["server_us"], after["server_us"], nf["server_us"], unauth["server_us"])
    b.say(
        f"server CPU per job {seed['server_us']:,.0f} µs; per plain request: healthz "
        f"{min(before['server_us'], after['server_us']):,.0f}, 404 {nf['server_us']:,.0f}, 401 {unauth['server_us']:,.0f} µs; "
        f"ratio by server CPU = {plain_us / seed['server_us']:.0%} of the cheapest "
        f"({min(before['server_us'], after['server_us']) / seed['server_us']:.0%} of healthz)"
    )
    b.say(
        f"RESULT seed_strict store={args.store} client={args.client} lanes={args.lanes} procs={args.procs}: seed {seed['rate']:,.0f} jobs/s, "
        f"plain-request ceiling {ceiling:,.0f} req/s (healthz {healthz:,.0f}, 404 {nf['rate']:,.0f}, "
        f"401 {unauth['rate']:,.0f}), ratio jobs/s / ceiling = {seed['rate'] / ceiling:.0%} "
        f"(requests/s / ceiling = {2 * seed['rate'] / ceiling:.0%}); target >= 40%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
