"""Soak: jobs flow for minutes while workers and servers are killed with
``kill -9`` at random and restarted; at the end nothing may be lost.

    .venv/bin/python benchmarks/soak.py --store sqlite --duration 180
    .venv/bin/python benchmarks/soak.py --store postgres --duration 180

An enqueuer adds ``--jobs`` jobs at an even pace over most of the run (with
idempotency keys, so that a retried enqueue whose answer was lost adds
nothing); ``--workers`` ``qftrio worker`` processes run them (each handler
sleeps a little and notes that it started). A chaos loop picks a worker or
a server at random every ``--kill-every`` seconds on average, kills it with
SIGKILL and restarts it (servers on the same port) a moment later. SQLite
runs one server (one process per file); PostgreSQL runs ``--servers``.

Printed at the end: jobs, kills, redelivered jobs (``attempt > 1``),
duplicate runs (handler starts beyond one per job: work redone after a kill),
lost (acknowledged jobs that did not complete: must be 0), and the time to
recover from a server kill (kill to the next completion, with the restart in
between). Exit status 1 if anything was lost. Not run in CI; figures go to
docs/reliability.md.
"""

from __future__ import annotations

import argparse
import collections
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import trio

from _bench import (
    BENCH_DIR,
    TENANT_TOKEN,
    WORKER_TOKEN,
    Procs,
    add_common,
    fresh_database,
    free_port,
    median,
    pg_cluster,
    print_settings,
    qftrio_cmd,
    say,
    sigterm_as_exit,
    workdir,
)
from qftrio import Client, errors

QUEUE = "soak"

HANDLERS = textwrap.dedent(
    '''
    """The soak's handler: notes each start in $SOAK_RUNS, then sleeps."""

    import os
    import random

    import trio

    from qftrio.worker import Registry

    registry = Registry()
    RUNS = os.environ["SOAK_RUNS"]


    @registry.handler("soak")
    async def soak(job):
        with open(RUNS, "a") as f:  # one short append per start
            f.write(f"{job.id} {job.attempt}\\n")
        await trio.sleep(random.uniform(0.01, 0.2))
        return {"attempt": job.attempt}
    '''
)


class Soak:
    """The processes of one run, by slot, and what happened to them."""

    def __init__(self, args: argparse.Namespace, procs: Procs, store: list[str], work: Path) -> None:
        self.args = args
        self.procs = procs
        self.store = store
        self.runs = work / "runs.txt"
        self.runs.touch()
        (work / "soak_handlers.py").write_text(HANDLERS)
        self.env = {"PYTHONPATH": f"{BENCH_DIR}:{work}", "SOAK_RUNS": str(self.runs)}
        servers = 1 if args.store == "sqlite" else args.servers
        self.ports = [free_port() for _ in range(servers)]
        self.servers: list[subprocess.Popen[bytes] | None] = [None] * servers
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * args.workers
        self.kills: collections.Counter[str] = collections.Counter()
        self._spawned = 0
        self.recoveries: list[float] = []
        self.restarts: list[float] = []
        self.acknowledged: set[str] = set()

    def url(self, slot: int) -> str:
        return f"http://127.0.0.1:{self.ports[slot]}"

    async def start_server(self, slot: int) -> None:
        argv = qftrio_cmd() + [
            "--log-level", "WARNING", "serve", "--bind", f"127.0.0.1:{self.ports[slot]}", *self.store,
            "--worker-token", WORKER_TOKEN, "--tenant", f"bench={TENANT_TOKEN}",
        ]  # fmt: skip
        self._spawned += 1
        self.servers[slot] = self.procs.spawn(f"server-{slot}-{self._spawned}", argv)
        with trio.fail_after(60):
            async with Client(self.url(slot), TENANT_TOKEN, timeout=2) as client:
                while True:
                    try:
                        await client.queue_stats(QUEUE)
                        return
                    except (errors.TransportError, errors.Unavailable):
                        await trio.sleep(0.05)

    def start_worker(self, slot: int) -> None:
        argv = qftrio_cmd() + [
            "--log-level", "WARNING", "worker", QUEUE, "soak_handlers:registry",
            "--url", self.url(slot % len(self.ports)), "--token", WORKER_TOKEN, "--lanes", "4",
            "--lease-secs", str(self.args.lease_secs), "--wait-secs", "2", "--worker-id", f"w{slot}",
        ]  # fmt: skip
        self._spawned += 1
        self.workers[slot] = self.procs.spawn(f"worker-{slot}-{self._spawned}", argv, env=self.env)

    async def completed(self, slot: int) -> int | None:
        try:
            async with Client(self.url(slot), TENANT_TOKEN, timeout=2) as client:
                return (await client.queue_stats(QUEUE)).counts["completed"]
        except (errors.TransportError, errors.Unavailable):
            return None

    async def enqueue(self, deadline: float) -> None:
        """Enqueue ``--jobs`` jobs, ten at a time, evenly until *deadline*."""
        n, started = self.args.jobs, trio.current_time()
        step = (deadline - started) / max(1, n // 10)
        for first in range(0, n, 10):
            await trio.sleep_until(started + step * first / 10)
            batch = [
                {"kind": "soak", "queue": QUEUE, "idempotency_key": f"soak-{i}", "payload": {"i": i}}
                for i in range(first, min(n, first + 10))
            ]
            while True:
                slot = random.randrange(len(self.ports))
                try:
                    async with Client(self.url(slot), TENANT_TOKEN, timeout=5) as client:
                        self.acknowledged.update(job.id for job in await client.enqueue_many(batch))
                    break
                except (errors.TransportError, errors.Unavailable):
                    await trio.sleep(0.2)

    async def chaos(self, until: float) -> None:
        """Kill a random process every ``--kill-every`` s on average, and
        restart it after a random pause."""
        while trio.current_time() < until:
            await trio.sleep(random.expovariate(1 / self.args.kill_every))
            if random.random() < self.args.server_share:
                slot = random.randrange(len(self.servers))
                before = await self.completed_anywhere()
                victim = self.servers[slot]
                assert victim is not None
                killed_at = time.monotonic()
                victim.send_signal(signal.SIGKILL)
                await trio.to_thread.run_sync(victim.wait)
                self.kills["server"] += 1
                async with trio.open_nursery() as nursery:
                    if before is not None and before < self.args.jobs:
                        nursery.start_soon(self.wait_progress, before, killed_at)
                    await trio.sleep(random.uniform(0.2, 2.0))
                    await self.start_server(slot)
                    self.restarts.append(time.monotonic() - killed_at)
            else:
                slot = random.randrange(len(self.workers))
                victim = self.workers[slot]
                assert victim is not None
                victim.send_signal(signal.SIGKILL)
                await trio.to_thread.run_sync(victim.wait)
                self.kills["worker"] += 1
                await trio.sleep(random.uniform(0.2, 2.0))
                self.start_worker(slot)

    async def completed_anywhere(self) -> int | None:
        """The queue's completed count, from the first server that answers."""
        for slot in range(len(self.ports)):
            count = await self.completed(slot)
            if count is not None:
                return count
        return None

    async def wait_progress(self, before: int, killed_at: float) -> None:
        """Record the time from *killed_at* until a job completes (through
        any server), if one does within a minute."""
        with trio.move_on_after(60):
            while True:
                now = await self.completed_anywhere()
                if now is not None and now > before:
                    self.recoveries.append(time.monotonic() - killed_at)
                    return
                await trio.sleep(0.05)

    async def drain(self) -> list[dict]:
        """Wait until every job has ended; the jobs, as the API shows them."""
        async with Client(self.url(0), TENANT_TOKEN, timeout=10) as client:
            with trio.fail_after(self.args.drain_secs):
                while True:
                    counts = (await client.queue_stats(QUEUE)).counts
                    if counts["pending"] == counts["running"] == 0 and sum(counts.values()) >= self.args.jobs:
                        break
                    await trio.sleep(0.2)
            jobs, cursor = [], None
            while True:
                page, cursor = await client.jobs_list(queue=QUEUE, limit=500, cursor=cursor)
                jobs += [{"id": j.id, "status": j.status.value, "attempt": j.attempt} for j in page]
                if cursor is None:
                    return jobs


async def run(args: argparse.Namespace, procs: Procs, store: list[str], work: Path) -> int:
    soak = Soak(args, procs, store, work)
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for slot in range(len(soak.servers)):
            nursery.start_soon(soak.start_server, slot)
    for slot in range(len(soak.workers)):
        soak.start_worker(slot)
    say(f"started {len(soak.servers)} server(s) and {len(soak.workers)} workers")
    started = trio.current_time()
    end = started + args.duration
    async with trio.open_nursery() as nursery:
        nursery.start_soon(soak.enqueue, started + args.duration * 0.8)
        nursery.start_soon(soak.chaos, end)
    drain_from = trio.current_time()
    jobs = await soak.drain()
    drained = trio.current_time() - drain_from

    starts = collections.Counter(line.split()[0] for line in soak.runs.read_text().splitlines() if line)
    by_id = {j["id"]: j for j in jobs}
    lost = [i for i in soak.acknowledged if by_id.get(i, {}).get("status") != "completed"]
    say(f"jobs: {len(soak.acknowledged)} acknowledged, {sum(1 for j in jobs if j['status'] == 'completed')} completed")
    say(f"run: {trio.current_time() - started:.0f} s ({args.duration:.0f} s of chaos, then {drained:.1f} s to drain)")
    say(f"kills: {soak.kills['server']} server, {soak.kills['worker']} worker (kill -9)")
    say(f"redelivered jobs (attempt > 1): {sum(1 for j in jobs if j['attempt'] > 1)}")
    say(f"duplicate runs (handler starts beyond one per job): {sum(c - 1 for c in starts.values() if c > 1)}")
    say(f"lost: {len(lost)}")
    for what, times in (
        ("time to recover from a server kill (kill to the next completion)", soak.recoveries),
        ("killed server back (kill to answering again, pause included)", soak.restarts),
    ):
        if times:
            say(f"{what}: median {median(times):.1f} s, max {max(times):.1f} s over {len(times)} kills")
    say(f"total wall time {trio.current_time() - t0:.0f} s")
    return 1 if lost else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--servers", type=int, default=2, help="PostgreSQL only (SQLite runs one)")
    parser.add_argument("--duration", type=float, default=180, help="seconds of chaos")
    parser.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between kills")
    parser.add_argument("--server-share", type=float, default=0.4, help="share of kills that hit a server")
    parser.add_argument("--lease-secs", type=int, default=3)
    parser.add_argument("--drain-secs", type=float, default=180, help="allowed to finish after the chaos")
    parser.add_argument("--seed", type=int, help="random seed (default: random)")
    add_common(parser)
    args = parser.parse_args()
    random.seed(args.seed)
    sigterm_as_exit()
    print_settings("soak", args)
    with workdir(args.keep) as work, Procs(work) as procs:
        if args.store == "sqlite":
            return trio.run(run, args, procs, ["--db", str(work / "soak.db")], work)
        with pg_cluster(args.database_url) as url, fresh_database(url, prefix="qftrio_soak") as db:
            return trio.run(run, args, procs, ["--database-url", db], work)


if __name__ == "__main__":
    sys.exit(main())
