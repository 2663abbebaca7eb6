#!/usr/bin/env python3
"""Server CPU per one-job call, rung by rung from a bare socket to the store.

Each rung is a server process of its own, called over one kept-alive
connection by a plain blocking socket in this process (its cost is not the
server's); the figure is the server process's CPU (user + system, from
``/proc/PID/stat``) over ``--calls`` calls, per call. The rungs:

* ``echo``: a Trio socket server answering every read with a fixed HTTP
  answer (the floor: Trio's scheduling and two system calls);
* ``constant``: qftrio's HTTP server (``serve_asgi``) with an ASGI
  application answering a constant;
* ``envelope``: the whole server (``run_server``: edge, router, envelope,
  body parsed) with the engine's calls answered from a canned result;
* ``engine``: the same with the engine's own code (the batcher, the wire
  forms) and the store's calls answered from a canned result;
* ``sqlite``: the same on the embedded store (a real file);
* ``postgres``: the same on PostgreSQL, with ``--database-url``.

Two operations are measured on each rung but ``echo`` and ``constant``:
``enqueue`` (``POST /api/v1/jobs``, one job) and ``lease+complete`` (a
lease of one job and its completion, two calls, per pair). ``--clients N``
adds the enqueue with N connections at once (N threads), server CPU per job.
``--pause SECS`` has each client wait SECS after every answer, so that the
server goes idle between calls as it does while a store call is under way
(what its waking up costs: compare ``engine`` with and without).

``--ab DIR`` alternates every measurement with a server whose ``qftrio``
comes from DIR (a checkout of the code before, e.g. ``git worktree add
/tmp/edge-base main``); medians over ``--rounds`` are printed side by side.

Example::

    .venv/bin/python benchmarks/edge_rungs.py --calls 3000 --rounds 5 --ab /tmp/edge-base
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

RUNGS = ("echo", "constant", "envelope", "engine", "sqlite", "postgres")
TENANT_TOKEN = "bench-tenant-token"
WORKER_TOKEN = "bench-worker-token"
ENQUEUE_BODY = b'{"kind":"noop","payload":{"n":1},"config":{"queue":"q"}}'
CONSTANT = b'{"id":"00000000-0000-0000-0000-000000000000","status":"pending"}'


# -- the server side (a child process) -------------------------------------------------


def serve(rung: str, port: int, sqlite_path: str, database_url: str | None) -> None:
    import trio

    if rung == "echo":
        answer = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
            len(CONSTANT),
            CONSTANT,
        )

        async def echo(stream: trio.SocketStream) -> None:
            while await stream.receive_some(65536):
                await stream.send_all(answer)

        async def run_echo() -> None:
            await trio.serve_tcp(echo, port, host="127.0.0.1")

        trio.run(run_echo)
        return
    if rung == "constant":
        from qftrio.server.http11 import serve_asgi

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            await receive()
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(CONSTANT))]
            await send({"type": "http.response.start", "status": 201, "headers": headers})
            await send({"type": "http.response.body", "body": CONSTANT})

        trio.run(lambda: serve_asgi(app, "127.0.0.1", port, shutdown_trigger=trio.sleep_forever, graceful_timeout_secs=1))
        return
    trio.run(_serve_stack, rung, port, sqlite_path, database_url)


async def _serve_stack(rung: str, port: int, sqlite_path: str, database_url: str | None) -> None:
    import contextlib

    from qftrio.server.config import Config
    from qftrio.server.engine import Engine
    from qftrio.server.serve import run_server

    async with contextlib.AsyncExitStack() as stack:
        if rung == "postgres":
            from qftrio.server.store.postgres import open_postgres_store

            store = await stack.enter_async_context(open_postgres_store(database_url, pool_size=4))
        else:
            from qftrio.server.store.sqlite import open_sqlite_store

            store = await stack.enter_async_context(open_sqlite_store(sqlite_path))
        engine = Engine(store)
        if rung in ("envelope", "engine"):
            await _can(rung, engine)
        config = Config(
            bind=f"127.0.0.1:{port}",
            worker_token=WORKER_TOKEN,
            tenants={"bench": TENANT_TOKEN},
            retention_secs=None,
            janitor_interval_secs=3600,
            safety_poll_secs=3600,
        )
        await run_server(engine, config)


async def _can(rung: str, engine: Any) -> None:
    """Answer the engine's (``envelope``) or the store's (``engine``) calls
    with what one real call answered."""
    from qftrio.models import CompleteItem, EnqueueRequest

    job = EnqueueRequest.model_validate_json(ENQUEUE_BODY)
    store = engine.store
    if rung == "engine":
        real_insert, real_claim, real_complete = store.jobs_insert, store.jobs_claim, store.jobs_complete
        inserted = claimed = completed = None

        async def jobs_insert(jobs: Any, *, now: float) -> Any:
            nonlocal inserted
            if inserted is None:
                inserted = await real_insert(jobs, now=now)
            return [dataclass_copy(i) for i in inserted] * len(jobs)

        async def jobs_claim(*args: Any, **kwargs: Any) -> Any:
            nonlocal claimed
            if claimed is None:
                claimed = await real_claim(*args, **kwargs)
            return claimed

        async def jobs_complete(items: Any, *, now: float) -> Any:
            nonlocal completed
            if completed is None:
                completed = await real_complete(items, now=now)
            return completed * len(items)

        store.jobs_insert, store.jobs_claim, store.jobs_complete = jobs_insert, jobs_claim, jobs_complete
        return
    (inserted,) = await engine.enqueue("bench", [job])
    leases = await engine.lease("q", max_jobs=1, lease_secs=60, wait_secs=0, worker_id=None)
    (lease,) = leases
    completed = await engine.complete([CompleteItem(lease.job.id, lease.lease_token, {})])

    async def enqueue(tenant: str, jobs: Any) -> Any:
        return [inserted] * len(jobs)

    async def lease_(queue: str, **kwargs: Any) -> Any:
        return leases

    async def complete(items: Any) -> Any:
        return completed * len(items)

    engine.enqueue, engine.lease, engine.complete = enqueue, lease_, complete


def dataclass_copy(value: Any) -> Any:
    import copy

    return copy.copy(value)


# -- the client side ---------------------------------------------------------------------


class Connection:
    """One kept-alive connection, a blocking socket."""

    def __init__(self, port: int, pause: float = 0.0) -> None:
        self.pause = pause
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def call(self, method: str, path: str, token: str, body: bytes, want: int) -> bytes:
        self.sock.sendall(
            b"%s %s HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (method.encode(), path.encode(), token.encode(), len(body), body)
        )
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            self.buffer = rest
            self._more()
            rest = self.buffer
        body_out, self.buffer = rest[:length], rest[length:]
        if status != want:
            raise RuntimeError(f"{method} {path}: {status} {body_out[:300]!r}")
        if self.pause:
            time.sleep(self.pause)
        return body_out

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise RuntimeError("the server closed the connection")
        self.buffer += data

    def close(self) -> None:
        self.sock.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def enqueue_calls(connection: Connection, calls: int) -> None:
    for _ in range(calls):
        connection.call("POST", "/api/v1/jobs", TENANT_TOKEN, ENQUEUE_BODY, 201)


def lease_complete_pairs(connection: Connection, pairs: int) -> None:
    lease = b'{"max_jobs":1,"lease_secs":60,"wait_secs":0}'
    for _ in range(pairs):
        (job,) = json.loads(connection.call("POST", "/api/v1/queues/q/lease", WORKER_TOKEN, lease, 200))["jobs"]
        done = b'{"lease_token":"%s"}' % job["lease_token"].encode()
        connection.call("POST", f"/api/v1/jobs/{job['job']['id']}/complete", WORKER_TOKEN, done, 204)


class Server:
    def __init__(self, rung: str, root: Path, args: argparse.Namespace, workdir: Path) -> None:
        self.port = free_port()
        self.pause = args.pause
        self.sqlite = workdir / f"{rung}-{self.port}.db"
        env = {**os.environ, "PYTHONPATH": str(root)}
        argv = [sys.executable, str(HERE / "edge_rungs.py"), "--serve", rung, "--port", str(self.port)]
        argv += ["--sqlite", str(self.sqlite)]
        if args.database_url:
            argv += ["--database-url", args.database_url]
        self.process = subprocess.Popen(argv, env=env, cwd=workdir)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port)).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {rung} server did not start") from None
                time.sleep(0.05)

    def measure(self, work: Any, count: int, *, clients: int = 1) -> float:
        """Server CPU in µs per unit of *work* (count units per client)."""
        connections = [Connection(self.port, self.pause) for _ in range(clients)]
        try:
            for connection in connections:
                work(connection, min(50, count))  # warm up
            before = cpu_seconds(self.process.pid)
            threads = [threading.Thread(target=work, args=(c, count)) for c in connections]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return (cpu_seconds(self.process.pid) - before) / (count * clients) * 1e6
        finally:
            for connection in connections:
                connection.close()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def print_table(rungs: list[str], sides: list[tuple[str, Path]], results: dict[tuple[str, str, str], list[float]], clients: int) -> None:
    """The medians so far (and their ranges), side by side, and their ratio."""
    header = f"{'rung':<10} {'operation':<16}" + "".join(f"{side + ' µs':>22}" for side, _ in sides)
    print(header)
    for rung in rungs:
        for op in ("enqueue", "lease+complete", f"enqueue x{clients}"):
            row = [results.get((rung, op, side)) for side, _ in sides]
            if row[0] is None:
                continue
            cells = "".join(
                f"{sorted(v)[len(v) // 2]:>8.0f} ({min(v):.0f}-{max(v):.0f})".rjust(22) for v in row if v
            )
            ratio = ""
            if len(row) == 2 and row[1]:
                a, b_ = (sorted(v)[len(v) // 2] for v in row)  # type: ignore[arg-type]
                ratio = f"   {a / b_:.2f}x"
            print(f"{rung:<10} {op:<16}{cells}{ratio}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="calls per measurement (default 2000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians are printed (default 3)")
    p.add_argument("--rungs", default="echo,constant,envelope,engine,sqlite", help="comma-separated, of: " + ",".join(RUNGS))
    p.add_argument("--clients", type=int, default=32, help="connections at once for the concurrent enqueue (0: none)")
    p.add_argument("--ab", type=Path, help="a checkout of the code before, measured alternately")
    p.add_argument(
        "--pause", type=float, default=0.0, help="seconds the client waits after each answer (default 0): the server idles"
    )
    p.add_argument("--database-url", help="PostgreSQL for the postgres rung (a database of its own: its jobs are left)")
    p.add_argument("--serve", choices=RUNGS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--sqlite", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.sqlite, args.database_url)
        return 0
    rungs = args.rungs.split(",")
    sides = [("now", ROOT)] + ([("before", args.ab.resolve())] if args.ab else [])
    results: dict[tuple[str, str, str], list[float]] = {}
    print(f"edge_rungs: {args.calls} calls, {args.rounds} rounds, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for rung in rungs:
                for side, root in sides if round_ % 2 == 0 else sides[::-1]:
                    server = Server(rung, root, args, Path(tmp))
                    try:
                        ops: list[tuple[str, Any, int, int]] = [("enqueue", enqueue_calls, args.calls, 1)]
                        if rung not in ("echo", "constant"):
                            ops.append(("lease+complete", lease_complete_pairs, args.calls // 2, 1))
                            if args.clients:
                                ops.append((f"enqueue x{args.clients}", enqueue_calls, max(1, args.calls // args.clients), args.clients))
                        if rung in ("sqlite", "postgres"):
                            seed = Connection(server.port)  # the jobs the pairs lease
                            for _ in range(0, args.calls // 2 + 50, 1000):
                                batch = b'{"jobs":[%s]}' % b",".join([ENQUEUE_BODY] * 1000)
                                seed.call("POST", "/api/v1/jobs/batch", TENANT_TOKEN, batch, 201)
                            seed.close()
                        for op, work, count, clients in ops:
                            figure = server.measure(work, count, clients=clients)
                            results.setdefault((rung, op, side), []).append(figure)
                    finally:
                        server.stop()
            print(f"after round {round_ + 1}:")
            print_table(rungs, sides, results, args.clients)
    return 0


if __name__ == "__main__":
    sys.exit(main())
