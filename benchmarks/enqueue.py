#!/usr/bin/env python3
"""Server CPU per job on the three hot paths, with no worker process:

* ``batch``: N no-op jobs through ``POST /api/v1/jobs/batch``, B per call,
  one call at a time;
* ``single``: M jobs through ``POST /api/v1/jobs``, one per call, over one
  kept-alive connection (httpx);
* ``client``: the same through one ``qftrio.Client`` (``Client.enqueue``), as
  an application sends them and as ``pgqueuer_reference.py`` measures them
  (``--clients N``: N clients at once, each with its share of the calls, as
  the requests of a busy web application come);
* ``drain``: the batch phase's jobs leased 100 at a time and completed 100 at
  a time (``POST /api/v1/leases/complete``): what the server spends per
  processed job, without a worker's own costs in the way.

For each phase it prints jobs/s as this one client sees them and the
server's CPU (user + system, from ``/proc/PID/stat``) per job, of which its
main thread's (Trio's: HTTP, routes, engine), and on PostgreSQL the
database's too (its cluster's processes only), and this process's own (the client's: httpx in the batch,
single and drain phases, ``qftrio.Client`` in the client phase); those figures
are what matters on a machine whose cores are shared. The rest of the server's CPU is its store's thread (asyncpg's loop,
SQLite's connection).

``--ab DIR`` runs a second server whose ``qftrio`` comes from DIR (a copy of
another version, e.g. ``git archive main qftrio | tar -x -C DIR``), on the
same store, and alternates the rounds between the two: an A/B of the server
on a noisy machine. Medians of each side are printed.

Examples::

    .venv/bin/python benchmarks/enqueue.py --store sqlite
    .venv/bin/python benchmarks/enqueue.py --store postgres --ab /tmp/main-copy --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import uuid

import httpx

import _bench as b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--jobs", "-n", type=int, default=10_000, help="jobs per round of the batch phase (default 10000)")
    p.add_argument("--batch", type=int, default=1000, help="jobs per batch call (default 1000)")
    p.add_argument("--single", type=int, default=1000, help="calls per round of the single and client phases (default 1000)")
    p.add_argument("--clients", type=int, default=1, help="concurrent qftrio.Clients of the client phase, sharing its calls (default 1)")
    p.add_argument("--lease", type=int, default=100, help="max_jobs of each lease of the drain phase (default 100)")
    p.add_argument("--rounds", "-r", type=int, default=3, help="rounds per side; medians are printed (default 3)")
    p.add_argument("--phases", default="batch,single,drain", help="comma-separated phases to run: batch, single, client, drain (default batch,single,drain)")
    p.add_argument("--profile", metavar="PREFIX", help="record server A with py-spy (--gil) during each phase of round 1, into PREFIX-PHASE.txt (see profile_summary.py)")
    p.add_argument("--ab", metavar="DIR", help="also run a server importing qftrio from DIR, rounds alternating")
    b.add_common(p)
    return p.parse_args(argv)


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of *pid*'s main thread."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _post(client: httpx.Client, path: str, body: bytes, want: int) -> httpx.Response:
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    if r.status_code != want:
        raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:300]}")
    return r


def phase_batch(server: b.Server, queue: str, args: argparse.Namespace) -> int:
    body = json.dumps({"jobs": [{"kind": "noop", "payload": {}, "config": {"queue": queue}}] * args.batch}).encode()
    with httpx.Client(base_url=server.url, headers=b.tenant_headers(), timeout=120) as client:
        for _ in range(args.jobs // args.batch):
            _post(client, "/api/v1/jobs/batch", body, 201)
    return args.jobs // args.batch * args.batch


def phase_single(server: b.Server, queue: str, args: argparse.Namespace) -> int:
    body = json.dumps({"kind": "noop", "payload": {}, "config": {"queue": queue + "-single"}}).encode()
    with httpx.Client(base_url=server.url, headers=b.tenant_headers(), timeout=120) as client:
        for _ in range(args.single):
            _post(client, "/api/v1/jobs", body, 201)
    return args.single


def phase_client(server: b.Server, queue: str, args: argparse.Namespace) -> int:
    import trio

    import qftrio

    async def one_client(calls: int) -> None:
        async with qftrio.Client(server.url, b.TENANT_TOKEN) as client:
            for _ in range(calls):
                await client.enqueue("noop", {}, queue=queue + "-client")

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(args.clients):
                nursery.start_soon(one_client, args.single // args.clients)

    trio.run(run)
    return args.single // args.clients * args.clients


def phase_drain(server: b.Server, queue: str, args: argparse.Namespace) -> int:
    lease_body = json.dumps({"max_jobs": args.lease, "lease_secs": 60, "worker_id": "bench"}).encode()
    done = 0
    with httpx.Client(base_url=server.url, headers=b.worker_headers(), timeout=120) as client:
        while True:
            jobs = _post(client, f"/api/v1/queues/{queue}/lease", lease_body, 200).json()["jobs"]
            if not jobs:
                return done
            items = [{"id": j["job"]["id"], "lease_token": j["lease_token"], "result": {}} for j in jobs]
            results = _post(client, "/api/v1/leases/complete", json.dumps({"items": items}).encode(), 200).json()
            if any(r["code"] != 204 for r in results["results"]):
                raise RuntimeError(f"a completion was refused: {results}")
            done += len(jobs)


PHASES = {"batch": phase_batch, "single": phase_single, "client": phase_client, "drain": phase_drain}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    if "drain" in phases and "batch" not in phases:
        raise SystemExit("enqueue.py: the drain phase drains what the batch phase enqueued")
    b.arm_timeout(args.timeout)
    b.sigterm_as_exit()
    b.print_settings("enqueue", args)
    results: dict[tuple[str, str], list[tuple[float, float, float, float, float]]] = {}
    # The database goes last, once the servers on it have stopped.
    with contextlib.ExitStack() as stack, b.workdir(args.keep) as wd, b.Procs(wd) as procs:
        url = None
        postmaster = 0
        if args.store == "postgres":
            url = stack.enter_context(b.fresh_database(stack.enter_context(b.pg_cluster(args.database_url))))
            b.say("postgresql:", b.pg_version(url))
            postmaster = b.postmaster_of(url)
        sides: list[tuple[str, b.Server]] = []
        envs = {"A": None}
        if args.ab:
            envs["B"] = {"PYTHONPATH": os.pathsep.join([os.path.abspath(args.ab), str(b.BENCH_DIR)])}
        for side, env in envs.items():
            server = b.start_server(
                procs, store=args.store, database_url=url, sqlite_path=wd / f"{side}.db", name=f"server{side}", env=env
            )
            sides.append((side, server))
        for rnd in range(1, args.rounds + 1):
            for side, server in sides if rnd % 2 else sides[::-1]:
                queue = f"e{rnd}{side}-{uuid.uuid4().hex[:6]}"
                line = []
                for phase in phases:
                    spy = None
                    if args.profile and rnd == 1 and side == "A":
                        spy = b.start_pyspy(procs, f"{args.profile}-{phase}.txt", server.pid, gil=True)
                        time.sleep(0.5)  # py-spy attaching
                    pg0 = b.cluster_cpu_seconds(postmaster) if url else 0.0
                    main0 = main_thread_cpu_seconds(server.pid)
                    cpu0, t0, own0 = b.cpu_seconds(server.pid), time.perf_counter(), time.process_time()
                    n = PHASES[phase](server, queue, args)
                    wall, cpu = time.perf_counter() - t0, b.cpu_seconds(server.pid) - cpu0
                    own = time.process_time() - own0
                    main = main_thread_cpu_seconds(server.pid) - main0
                    pg = b.cluster_cpu_seconds(postmaster) - pg0 if url else 0.0
                    if spy is not None:
                        b.stop_pyspy(procs, spy)
                    results.setdefault((side, phase), []).append(
                        (n / wall, cpu / n * 1e6, pg / n * 1e6, main / n * 1e6, own / n * 1e6)
                    )
                    line.append(
                        f"{phase} {n / wall:,.0f} jobs/s, server {cpu / n * 1e6:,.1f} µs/job"
                        f" (main thread {main / n * 1e6:,.1f})"
                        + (f", postgres {pg / n * 1e6:,.1f} µs/job" if url else "")
                        + f", client {own / n * 1e6:,.1f} µs/job"
                    )
                b.say(f"{side} round {rnd}: " + "; ".join(line))
        procs.stop_all()
    for (side, phase), figures in results.items():
        rate = b.median([f[0] for f in figures])
        cpu = b.median([f[1] for f in figures])
        main = b.median([f[3] for f in figures])
        pg = f", postgres CPU {b.median([f[2] for f in figures]):,.1f} µs/job" if args.store == "postgres" else ""
        own = b.median([f[4] for f in figures])
        b.say(
            f"RESULT {side} {phase} store={args.store} rounds={args.rounds}: {rate:,.0f} jobs/s, "
            f"server CPU {cpu:,.1f} µs/job (main thread {main:,.1f}){pg}, client CPU {own:,.1f} µs/job (medians)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
