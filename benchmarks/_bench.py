"""Shared plumbing of the benchmarks: free ports, throwaway PostgreSQL clusters,
real ``qftrio serve`` / ``qftrio worker`` processes, RSS, cleanup.

Everything listens on 127.0.0.1 only. Every process started here is tracked
and stopped (SIGTERM, then SIGKILL after a grace) when the ``Procs`` context
exits, whatever happened; every PostgreSQL cluster started here is stopped and
its directory removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
QFTRIO = str(VENV_BIN / "qftrio") if (VENV_BIN / "qftrio").exists() else None
PG_CLUSTER = str(ROOT / "scripts" / "pg-cluster")

WORKER_TOKEN = "bench-worker-token"
TENANT = "bench"
TENANT_TOKEN = "bench-tenant-token"
HANDLERS = "noop_handlers:registry"


def qftrio_cmd() -> list[str]:
    return [QFTRIO] if QFTRIO else [sys.executable, "-m", "qftrio"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(*parts: Any) -> None:
    print(*parts, flush=True)


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def machine() -> dict[str, Any]:
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "mem_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def print_settings(title: str, args: argparse.Namespace, **extra: Any) -> None:
    say(f"== {title} ({stamp()})")
    say("machine:", json.dumps(machine()))
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    settings.update(extra)
    say("settings:", json.dumps(settings, default=str))


def rss_mib(pid: int) -> float:
    """Resident set size of *pid* in MiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of *pid* (and of its reaped children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def postgres_cpu_seconds() -> float:
    """CPU seconds of every running ``postgres`` process plus what postmasters
    reaped from exited backends: the database's share of a benchmark, as a
    difference of two readings (one cluster on the machine)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
            total += cpu_seconds(int(entry), children=True)
        except OSError:
            continue
    return total


def postmaster_of(url: str) -> int:
    """The process id of the postmaster of *url*'s cluster: the parent of a
    backend."""

    async def parent(conn: Any) -> int:
        # read while connected: the backend ends with its connection
        with open(f"/proc/{await conn.fetchval('SELECT pg_backend_pid()')}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    return pg_run(url, parent)


def cluster_cpu_seconds(postmaster: int) -> float:
    """CPU seconds of one PostgreSQL cluster: its postmaster, with what it
    reaped from exited processes, and its running processes. Unlike
    :func:`postgres_cpu_seconds`, other clusters on the machine (the
    test runs of others) count for nothing."""
    total = cpu_seconds(postmaster, children=True)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != postmaster:
                    continue
            total += cpu_seconds(int(entry))
        except OSError:
            continue
    return total


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# -- processes ------------------------------------------------------------------


class Procs:
    """Processes started by a benchmark, stopped on exit (reverse order)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{name}.log"
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(BENCH_DIR), full_env.get("PYTHONPATH", "")) if p
        )
        for name in ("QFTRIO_DEV", "QUEUEFLOW_DEV"):
            full_env.pop(name, None)
        if env:
            full_env.update(env)
        out = open(log, "wb")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=self.workdir)
        out.close()
        self.procs.append((name, proc, log))
        return proc

    def log_tail(self, proc: subprocess.Popen[bytes], lines: int = 20) -> str:
        for _, p, log in self.procs:
            if p is proc:
                with contextlib.suppress(OSError):
                    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 10.0) -> int | None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)
        self.procs = [t for t in self.procs if t[1] is not proc]
        return proc.returncode

    def stop_many(self, procs: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)
        ids = {id(p) for p in procs}
        self.procs = [t for t in self.procs if id(t[1]) not in ids]

    def stop_all(self) -> None:
        self.stop_many([p for _, p, _ in reversed(self.procs)])


@contextlib.contextmanager
def workdir(keep: bool = False) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="qftrio-bench-"))
    try:
        yield path
    finally:
        if keep:
            say(f"(kept {path})")
        else:
            shutil.rmtree(path, ignore_errors=True)


# -- the server and workers -----------------------------------------------------


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, port: int) -> None:
        self.proc = proc
        self.url = url
        self.port = port

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_server(
    procs: Procs,
    *,
    store: str,
    database_url: str | None = None,
    sqlite_path: Path | None = None,
    pool_size: int | None = None,
    name: str = "server",
    log_level: str = "WARNING",
    extra: Sequence[str] = (),
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> Server:
    port = free_port()
    argv = qftrio_cmd() + [
        "--log-level", log_level, "serve", "--bind", f"127.0.0.1:{port}",
        "--worker-token", WORKER_TOKEN, "--tenant", f"{TENANT}={TENANT_TOKEN}",
    ]  # fmt: skip
    if store == "postgres":
        assert database_url
        argv += ["--database-url", database_url]
        if pool_size:
            argv += ["--pool-size", str(pool_size)]
    else:
        argv += ["--db", str(sqlite_path or (procs.workdir / "qftrio.db"))]
    argv += list(extra)
    proc = procs.spawn(f"{name}-{port}", argv, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{procs.log_tail(proc)}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return Server(proc, url, port)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer /healthz within {timeout}s:\n{procs.log_tail(proc)}")
        time.sleep(0.05)


def start_worker(
    procs: Procs,
    url: str,
    queue: str,
    *,
    lanes: int | None,
    batch: int | None,
    wait_secs: float = 5,
    lease_secs: int = 60,
    log_level: str = "WARNING",
    handlers: str = HANDLERS,
    name: str = "worker",
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    argv = qftrio_cmd() + [
        "--log-level", log_level, "worker", queue, handlers, "--url", url, "--token", WORKER_TOKEN,
        "--wait-secs", str(wait_secs), "--lease-secs", str(lease_secs),
    ]  # fmt: skip
    # None leaves a flag out: the worker's own default
    argv += [f for flag, value in (("--lanes", lanes), ("--batch", batch)) if value is not None for f in (flag, str(value))]
    return procs.spawn(f"{name}-{uuid.uuid4().hex[:6]}", argv, env=env)


def tenant_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {TENANT_TOKEN}"}


def worker_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {WORKER_TOKEN}"}


def enqueue_noop(
    url: str, queue: str, n: int, *, batch: int = 1000, kind: str = "noop", payload: dict | None = None
) -> float:
    """Enqueue *n* jobs through ``POST /api/v1/jobs/batch``, *batch* per call,
    one call at a time; returns the seconds it took."""
    body_payload = payload or {}
    with httpx.Client(base_url=url, headers=tenant_headers(), timeout=120) as client:
        t0 = time.perf_counter()
        left = n
        while left:
            k = min(batch, left)
            r = client.post(
                "/api/v1/jobs/batch",
                json={"jobs": [{"kind": kind, "payload": body_payload, "config": {"queue": queue}}] * k},
            )
            if r.status_code != 201:
                raise RuntimeError(f"enqueue answered {r.status_code}: {r.text[:300]}")
            left -= k
        return time.perf_counter() - t0


def reports_seen(urls: Sequence[str]) -> int:
    """Completed plus failed attempts the servers at *urls* have recorded since
    they started, from their ``/metrics`` counters: a poll that costs the
    server microseconds and the database nothing. (``/stats`` counts a
    queue's rows in the database: tens of milliseconds of PostgreSQL's CPU
    per call with 50,000 jobs in the table, taken from the run it watches.)"""
    total = 0
    for url in urls:
        r = httpx.get(f"{url}/metrics", timeout=30)
        r.raise_for_status()
        for line in r.text.splitlines():
            sample, _, value = line.rpartition(" ")
            # summed over their labels (queue, kind)
            if sample.partition("{")[0] in ("qftrio_jobs_completed_total", "qftrio_jobs_failed_total"):
                total += int(float(value))
    return total


def queue_counts(url: str, queue: str) -> dict[str, int]:
    r = httpx.get(f"{url}/api/v1/queues/{queue}/stats", headers=tenant_headers(), timeout=30)
    r.raise_for_status()
    return r.json()["counts"]


# -- PostgreSQL -------------------------------------------------------------------


@contextlib.contextmanager
def pg_cluster(url: str | None = None) -> Iterator[str]:
    """*url* when given; else a throwaway cluster (scripts/pg-cluster) on a free
    port, stopped and removed on exit."""
    if url:
        yield url
        return
    port = free_port()
    directory = f"/tmp/qftrio-bench-pg-{os.getpid()}-{port}"
    try:
        out = subprocess.run(
            [PG_CLUSTER, "start", directory, str(port)], check=True, capture_output=True, text=True, timeout=120
        )
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([PG_CLUSTER, "stop", directory], capture_output=True, timeout=120)
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(directory + ".initdb.log")


@contextlib.contextmanager
def store_database(store: str, database_url: str | None = None) -> Iterator[str | None]:
    """For *store* ``postgres``, a fresh database (in *database_url*'s
    cluster, or in a throwaway one), dropped on exit; ``None`` for SQLite."""
    if store != "postgres":
        yield None
        return
    with pg_cluster(database_url) as cluster, fresh_database(cluster) as url:
        yield url


def pg_run(url: str, fn: Any) -> Any:
    """Run ``await fn(conn)`` on a fresh asyncpg connection (asyncio)."""
    import asyncpg

    async def main() -> Any:
        conn = await asyncpg.connect(url)
        try:
            return await fn(conn)
        finally:
            await conn.close()

    return asyncio.run(main())


@contextlib.contextmanager
def fresh_database(url: str, prefix: str = "qftrio_bench") -> Iterator[str]:
    """A new, empty database on *url*'s cluster; dropped on exit."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"

    async def create(conn: Any) -> None:
        await conn.execute(f'CREATE DATABASE "{name}"')

    async def drop(conn: Any) -> None:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    pg_run(url, create)
    base, _, _ = url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with contextlib.suppress(Exception):
            pg_run(url, drop)


def pg_version(url: str) -> str:
    async def q(conn: Any) -> str:
        return await conn.fetchval("SHOW server_version")

    return pg_run(url, q)


# -- what the jobs' rows say ----------------------------------------------------


def completed_span(store: str, queue: str, *, database_url: str | None = None, sqlite_path: Path | None = None) -> tuple[int, float, float]:
    """``(completed, first completion, last completion)`` of *queue*, from the
    rows themselves (``updated_at`` of completed jobs, server wall clock)."""
    if store == "postgres":
        async def q(conn: Any) -> tuple[int, float, float]:
            row = await conn.fetchrow(
                "SELECT count(*), min(updated_at), max(updated_at) FROM qftrio_jobs WHERE queue = $1 AND status = 'completed'",
                queue,
            )
            return int(row[0]), float(row[1] or 0), float(row[2] or 0)

        return pg_run(database_url, q)
    import sqlite3

    conn = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True, timeout=30)
    try:
        n, lo, hi = conn.execute(
            "SELECT count(*), min(updated_at), max(updated_at) FROM jobs WHERE queue = ? AND status = 'completed'",
            (queue,),
        ).fetchone()
        return int(n), float(lo or 0), float(hi or 0)
    finally:
        conn.close()


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="an existing PostgreSQL (a fresh database is created in it and dropped); default: a throwaway cluster via scripts/pg-cluster")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (server and worker logs)")
    parser.add_argument("--timeout", type=float, default=600, help="give up after this many seconds (default 600)")


def arm_timeout(seconds: float) -> None:
    """Turn a hung benchmark into an exception (so that cleanup runs)."""

    def fire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"benchmark exceeded --timeout {seconds:g}s")

    signal.signal(signal.SIGALRM, fire)
    signal.alarm(max(1, int(seconds)))


def sigterm_as_exit() -> None:
    def fire(signum: int, frame: Any) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, fire)


# -- bulk loading pending jobs (directly, not through the API) -------------------


def sqlite_init(path: Path, procs: Procs) -> None:
    """Create and migrate the embedded store at *path* by starting and stopping
    a real server on it."""
    server = start_server(procs, store="sqlite", sqlite_path=path, name="init")
    procs.stop(server.proc)


_SQLITE_COLUMNS = (
    "id, tenant, queue, kind, payload, status, priority, attempt, max_attempts, scheduled_at, created_at, "
    "updated_at, worker_id"
)


def sqlite_bulk_rows(path: Path, n: int, rows: Callable[[int, int], list[tuple]], *, chunk: int = 50_000) -> float:
    """Insert *n* job rows into the embedded store's file (migrated, the server
    not running), ``rows(start, count)`` making each chunk's tuples in
    ``_SQLITE_COLUMNS`` order; returns seconds taken."""
    import sqlite3

    t0 = time.perf_counter()
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    done = 0
    while done < n:
        k = min(chunk, n - done)
        conn.execute("BEGIN")
        conn.executemany(f"INSERT INTO jobs ({_SQLITE_COLUMNS}) VALUES ({', '.join('?' * 13)})", rows(done, k))
        conn.execute("COMMIT")
        done += k
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - t0


def sqlite_bulk_pending(path: Path, queue: str, n: int, *, tenant: str = TENANT, chunk: int = 50_000) -> float:
    """Insert *n* pending no-op jobs into the embedded store's file (the server
    must not be running); returns seconds taken."""
    now = time.time()

    def rows(start: int, count: int) -> list[tuple]:
        return [
            (str(uuid.uuid4()), tenant, queue, "noop", "{}", "pending", 0, 0, 5, now - 3600 + (start + i) * 1e-6,
             now - 3600 + (start + i) * 1e-6, now, None)
            for i in range(count)
        ]  # fmt: skip

    return sqlite_bulk_rows(path, n, rows, chunk=chunk)


def pg_bulk_pending(url: str, queue: str, n: int, *, tenant: str = TENANT, chunk: int = 200_000) -> float:
    """Insert *n* pending no-op jobs with SQL (the schema must exist: a server
    started on *url* migrates it); returns seconds taken."""
    now = time.time()

    async def load(conn: Any) -> None:
        done = 0
        while done < n:
            k = min(chunk, n - done)
            await conn.execute(
                """INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, status, priority, attempt,
                    max_attempts, scheduled_at, created_at, updated_at)
                SELECT gen_random_uuid(), $1, $2, 'noop', '{}'::jsonb, 'pending', 0, 0, 5,
                    $3 - 3600 + (i * 1e-6), $3 - 3600 + (i * 1e-6), $3
                FROM generate_series($4::bigint, $5::bigint) AS i""",
                tenant, queue, now, done, done + k - 1,
            )  # fmt: skip
            done += k
        await conn.execute("VACUUM ANALYZE qftrio_jobs")

    t0 = time.perf_counter()
    pg_run(url, load)
    return time.perf_counter() - t0


def start_pyspy(procs: Procs, path: str, pid: int, rate: int = 200, gil: bool = False) -> subprocess.Popen[bytes]:
    """``py-spy record`` of *pid* into *path* until stopped (SIGTERM makes it
    write the file): an SVG flame graph, or raw collapsed stacks for a
    ``.txt`` path (see ``profile_summary.py``). With *gil*, only the thread
    holding the GIL is sampled: where the CPU goes, not where threads wait."""
    argv = [str(VENV_BIN / "py-spy"), "record", "-o", path, "--pid", str(pid), "--rate", str(rate), "--nonblocking"]
    if path.endswith(".txt"):
        argv += ["--format", "raw"]
    if gil:
        argv += ["--gil"]
    return procs.spawn(f"py-spy-{pid}", argv)


def stop_pyspy(procs: Procs, spy: subprocess.Popen[bytes], grace: float = 60.0) -> None:
    """Stop a ``py-spy record`` the way that makes it write its file (SIGINT)."""
    if spy.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            spy.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(grace)
    procs.stop(spy)
