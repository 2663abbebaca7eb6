"""How soon a job's wait (``GET /api/v1/jobs/{id}/wait``) answers once the job
ends: from the moment the completing call is answered to the moment the wait's
answer arrives, p50 and p99, with the wait parked on the server that completed
the job and (PostgreSQL) on another server of the same database.

    .venv/bin/python benchmarks/wait_latency.py --store sqlite --samples 200
    .venv/bin/python benchmarks/wait_latency.py --store postgres --samples 200

Each sample: enqueue a job, lease it, park a wait on it (the server's count of
parked waits is not visible, so the wait is given 20 ms to park, which the
figure does not include), complete it, and time the wait's answer.
"""

from __future__ import annotations

import argparse
import threading
import time

import httpx

import _bench as b


def sample(enqueue_url: str, wait_url: str, queue: str) -> float:
    with httpx.Client(timeout=30) as client:
        r = client.post(f"{enqueue_url}/api/v1/jobs", json={"kind": "noop", "config": {"queue": queue}}, headers=b.tenant_headers())
        job_id = r.json()["id"]
        (leased,) = client.post(
            f"{enqueue_url}/api/v1/queues/{queue}/lease", json={"lease_secs": 60}, headers=b.worker_headers()
        ).json()["jobs"]
        answered: list[float] = []

        def wait() -> None:
            with httpx.Client(timeout=90) as waiter:
                got = waiter.get(f"{wait_url}/api/v1/jobs/{job_id}/wait", params={"timeout_secs": 60}, headers=b.tenant_headers())
                answered.append(time.perf_counter())
                assert got.json()["status"] == "completed", got.text

        waiting = threading.Thread(target=wait)
        waiting.start()
        time.sleep(0.02)  # parked by then
        done = client.post(
            f"{enqueue_url}/api/v1/jobs/{job_id}/complete", json={"lease_token": leased["lease_token"]}, headers=b.worker_headers()
        )
        completed = time.perf_counter()
        assert done.status_code == 204, done.text
        waiting.join()
        return (answered[0] - completed) * 1000


def report(label: str, values: list[float]) -> None:
    b.say(f"{label:<28} p50 {b.percentile(values, 50):7.2f} ms   p99 {b.percentile(values, 99):7.2f} ms   (n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--samples", type=int, default=100)
    b.add_common(parser)
    args = parser.parse_args()
    b.arm_timeout(args.timeout)
    b.print_settings("wait wake-up latency", args)
    with b.workdir(args.keep) as work, b.Procs(work) as procs:
        if args.store == "sqlite":
            one = b.start_server(procs, store="sqlite")
            report("same server", [sample(one.url, one.url, "wait-same") for _ in range(args.samples)])
            return
        with b.pg_cluster(args.database_url) as cluster, b.fresh_database(cluster) as url:
            one = b.start_server(procs, store="postgres", database_url=url, name="a")
            two = b.start_server(procs, store="postgres", database_url=url, name="b")
            same, other = [], []
            for _ in range(args.samples):  # alternating, as the machine is noisy
                same.append(sample(one.url, one.url, "wait-same"))
                other.append(sample(one.url, two.url, "wait-other"))
            report("same server", same)
            report("other server", other)


if __name__ == "__main__":
    main()
