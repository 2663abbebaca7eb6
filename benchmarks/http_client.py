#!/usr/bin/env python3
"""CPU per call of the HTTP clients a worker could use, on 127.0.0.1.

A minimal Trio server in the same process answers every ``POST`` with a
fixed JSON body (``--answer-bytes``, default about one 100-job lease answer).
Each client sends ``--calls`` calls one after another over one kept-alive
connection; the figure is ``time.process_time()`` per call, which includes
the (small, equal for all) cost of the trivial server. The clients, in
alternating rounds:

* ``httpx``: an ``httpx.AsyncClient`` as qftrio used to send its calls;
* ``qftrio``: :class:`qftrio._http.HttpPool`, what :class:`qftrio.Client`
  sends them through under Trio (answers parsed by llhttp, through httptools);
* ``qftrio.Client``: the whole client call (``Client._json``: JSON encoding of
  the request, the call, ``orjson`` parsing of the answer);
* ``Client.enqueue``: a one-job enqueue as an application sends it (the
  body checked and built, the call, the answer read into a ``Job``), the
  server answering with a job;
* ``baseline``, with ``--baseline DIR``: the ``HttpPool`` of another checkout
  (``DIR/qftrio/_http.py``, loaded on its own), so that a change to the pool
  is measured against the code before it in the same process.

Example::

    .venv/bin/python benchmarks/http_client.py --calls 3000 --rounds 3
    git worktree add /tmp/before main
    .venv/bin/python benchmarks/http_client.py --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx
import trio

import _bench as b
from qftrio._http import HttpPool
from qftrio.client import Client


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=3000, help="calls per client and round (default 3000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the median is printed (default 3)")
    p.add_argument("--answer-bytes", type=int, default=51_000, help="size of the answer body (default 51000)")
    p.add_argument("--baseline", type=Path, help="a checkout whose qftrio/_http.py HttpPool is measured too")
    return p.parse_args(argv)


#: What the server answers ``POST /api/v1/jobs`` with: a new job.
JOB_ANSWER = json.dumps(
    {
        "id": "0b6f4c1e-61b5-4c53-9d1c-1f0e2b7d9a11", "tenant": "bench", "queue": "q", "kind": "noop", "payload": {},
        "status": "pending", "priority": 0, "attempt": 0, "max_attempts": 5,
        "scheduled_at": "2026-12-01T12:00:00.000000Z", "created_at": "2026-12-01T12:00:00.000000Z",
        "updated_at": "2026-12-01T12:00:00.000000Z", "locked_until": None, "worker_id": None, "result": None,
        "error": None, "errors": [], "workflow_id": None, "step": None, "context": None,
    }  # fmt: skip
).encode()


async def serve_fixed(answer: bytes, task_status: trio.TaskStatus[int]) -> None:
    def head(length: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % length

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            buffer += data
            while (end := buffer.find(b"\r\n\r\n")) >= 0:
                length = 0
                body = JOB_ANSWER if buffer.startswith(b"POST /api/v1/jobs ") else answer
                for line in buffer[:end].split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(buffer) < end + 4 + length:
                    buffer += await stream.receive_some(65536)
                buffer = buffer[end + 4 + length :]
                await stream.send_all(head(len(body)) + body)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    answer = b'{"jobs":[],"pad":"' + b"a" * max(0, args.answer_bytes - 20) + b'"}'
    path, body = "/api/v1/queues/q/lease", b'{"max_jobs":100,"lease_secs":60}'
    figures: dict[str, list[float]] = {"httpx": [], "qftrio": [], "qftrio.Client": [], "Client.enqueue": []}
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_fixed, answer)
        url = f"http://127.0.0.1:{port}"
        headers = {"User-Agent": "bench", "Authorization": "Bearer x"}
        hx = httpx.AsyncClient(base_url=url, headers=headers, timeout=httpx.Timeout(10))
        pool = HttpPool(url, headers)
        client = Client(url, "x")
        baseline = _baseline_pool(args.baseline)(url, headers) if args.baseline else None

        async def via_httpx() -> None:
            r = await hx.request("POST", path, content=body, headers={"Content-Type": "application/json"})
            r.content

        async def via_pool() -> None:
            await pool.request("POST", path, body, timeout=10)

        async def via_client() -> None:
            await client._json("POST", path, dict, json_body={"max_jobs": 100, "lease_secs": 60})

        async def via_enqueue() -> None:
            await client.enqueue("noop", {}, queue="q")

        async def via_baseline() -> None:
            await baseline.request("POST", path, body, timeout=10)

        calls = {"httpx": via_httpx, "qftrio": via_pool, "qftrio.Client": via_client, "Client.enqueue": via_enqueue}
        if baseline is not None:
            calls["baseline"] = via_baseline
            figures["baseline"] = []
        for _ in range(args.rounds):
            for name, call in calls.items():
                for _ in range(100):
                    await call()
                cpu = time.process_time()
                for _ in range(args.calls):
                    await call()
                figures[name].append((time.process_time() - cpu) / args.calls * 1e6)
        await hx.aclose()
        await pool.aclose()
        await client.aclose()
        if baseline is not None:
            await baseline.aclose()
        nursery.cancel_scope.cancel()
    return figures


def _baseline_pool(checkout: Path) -> type:
    spec = importlib.util.spec_from_file_location("baseline_http", checkout / "qftrio" / "_http.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HttpPool


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b.print_settings("http_client", args)
    figures = trio.run(measure, args)
    for name, values in figures.items():
        rounds = " / ".join(f"{v:.0f}" for v in values)
        print(f"{name:14s} {statistics.median(values):6.0f} µs CPU per call (rounds: {rounds})")
    print(
        f"RESULT http_client answer={args.answer_bytes}B: httpx {statistics.median(figures['httpx']):.0f} µs, "
        f"qftrio {statistics.median(figures['qftrio']):.0f} µs, Client.enqueue {statistics.median(figures['Client.enqueue']):.0f} µs per call"
        + (f", baseline {statistics.median(figures['baseline']):.0f} µs" if "baseline" in figures else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
