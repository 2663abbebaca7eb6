"""The Python runtime's conformance adapter (tests/sdk_conformance/ADAPTER.md).

It runs what ``qftrio worker`` runs (:func:`qftrio.worker.process.run_worker_process`:
the runtime's own signal handling, exit codes and one-line errors) on this
module's registry, and prints the contract's events on standard output.
"""

from __future__ import annotations

import io
import json
import os
import sys
from typing import Any

import trio

import qftrio
from qftrio.worker.process import run_worker_process

registry = qftrio.Registry()


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def started(job: qftrio.Job) -> None:
    say("started", job=job.id, kind=job.kind, attempt=job.attempt, headers=job.headers or {})


async def wait_or_abort(job: qftrio.Job, secs: float) -> None:
    """Sleep *secs*; when the runtime cancels the handler first, say so."""
    try:
        await trio.sleep(secs)
    except trio.Cancelled:
        say("aborted", job=job.id)
        raise


def returning(job: qftrio.Job, value: Any) -> Any:
    say("returned", job=job.id)
    return value


@registry.handler("echo")
async def echo(job: qftrio.Job) -> dict[str, Any]:
    started(job)
    return returning(job, {"echo": job.payload})


@registry.handler("sleep")
async def sleep(job: qftrio.Job) -> dict[str, Any]:
    started(job)
    await wait_or_abort(job, job.payload["secs"])
    return returning(job, {"slept": job.payload["secs"]})


@registry.handler("fail")
async def fail(job: qftrio.Job) -> None:
    started(job)
    say("returned", job=job.id)
    raise RuntimeError(job.payload["message"])


@registry.handler("permanent")
async def permanent(job: qftrio.Job) -> None:
    started(job)
    say("returned", job=job.id)
    raise qftrio.PermanentError(job.payload["message"])


@registry.handler("snooze")
async def snooze(job: qftrio.Job) -> None:
    started(job)
    say("returned", job=job.id)
    raise qftrio.Snooze(job.payload["secs"])


@registry.handler("retry_in")
async def retry_in(job: qftrio.Job) -> None:
    started(job)
    say("returned", job=job.id)
    raise qftrio.RetryIn(job.payload["secs"], job.payload["message"])


@registry.handler("progress")
async def progress(job: qftrio.Job) -> dict[str, Any]:
    started(job)
    job.progress(job.payload["progress"])
    await wait_or_abort(job, job.payload["then_secs"])
    return returning(job, {})


@registry.handler("headers")
async def headers(job: qftrio.Job) -> dict[str, Any]:
    started(job)
    return returning(job, {"headers": job.headers or {}})


class _Tee(io.TextIOBase):
    """Standard error, with a copy of what was written: the runtime says why
    it stopped there, in one line."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        self.lines += [line for line in text.splitlines() if line.strip()]
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def main() -> int:
    env = os.environ
    tee = _Tee(sys.stderr)
    sys.stderr = tee
    say("ready")
    code = run_worker_process(
        url=env["QFTRIO_URL"],
        token=env["QFTRIO_TOKEN"],
        queues=[env["ADAPTER_QUEUE"]],
        registry_ref="__main__:registry",
        lanes=int(env["ADAPTER_LANES"]),
        lease_secs=int(env["ADAPTER_LEASE_SECS"]),
        wait_secs=int(env["ADAPTER_WAIT_SECS"]),
        worker_id=env["ADAPTER_WORKER_ID"],
    )
    if code == 0:
        say("stopped", error=None)
        return 0
    if code == 2:
        said = [line for line in tee.lines if line.startswith("qftrio worker:")]
        say("stopped", error=said[-1] if said else "the worker stopped with exit status 2")
        return 2
    return code  # a second signal: quit without a word, as the contract allows


if __name__ == "__main__":
    sys.exit(main())
