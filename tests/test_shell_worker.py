"""The README's shell worker, the protocol's reference loop of curl and jq,
runs jobs against a real ``qftrio serve --dev`` process, and the example
handlers run as their docstring says."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from .processes import ROOT, free_port, spawn, stop, wait_healthy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (shutil.which("jq") and shutil.which("curl")), reason="needs curl and jq"),
]

def readme_loop() -> str:
    """The README's shell worker, as printed."""
    readme = (ROOT / "README.md").read_text()
    (loop,) = [b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "while true; do" in b]
    return loop


def bounded(loop: str, base: str, rounds: int) -> str:
    """*loop* against *base*, its ``while true`` true *rounds* times (bash
    looks up a function before the builtin), each ``sleep`` of the main loop
    recorded in ./slept instead of slept. The heartbeat's subshell sleeps,
    with its output elsewhere: when the loop kills the subshell, the orphaned
    ``sleep`` must not hold the output open."""
    assert loop.count("http://127.0.0.1:8000") == 1
    return (
        f"true() {{ (( rounds++ < {rounds} )); }}\n"
        'sleep() { if [ "$BASHPID" = "$$" ]; then echo "$@" >> slept; else command sleep "$@" >/dev/null 2>&1; fi; }\n'
        + loop.replace("http://127.0.0.1:8000", base)
    )


async def test_the_readme_shell_worker_runs_jobs(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = spawn(["serve", "--dev", "--db", str(tmp_path / "q.db"), "--bind", f"127.0.0.1:{port}"], log=tmp_path / "server.log")
    try:
        await wait_healthy(base)
        auth = {"Authorization": "Bearer dev"}
        async with httpx.AsyncClient(base_url=base, timeout=10, headers=auth) as client:
            ids = []
            for payload, attempts in [({"url": "a.png"}, 5), ({"url": "b.png"}, 5), ({"file": "c.png"}, 1)]:
                r = await client.post(
                    "/api/v1/jobs", json={"kind": "resize-image", "payload": payload, "config": {"queue": "images", "max_attempts": attempts}}
                )
                ids.append(r.json()["id"])
            # one round per job: each lease finds a job at once
            run = await trio.to_thread.run_sync(
                lambda: subprocess.run(["bash", "-c", bounded(readme_loop(), base, 3)], cwd=tmp_path, capture_output=True, text=True)
            )
            jobs = [(await client.get(f"/api/v1/jobs/{i}")).json() for i in ids]
    finally:
        stop(server)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["resizing a.png", "resizing b.png"]
    assert [j["status"] for j in jobs] == ["completed", "completed", "failed"]
    assert all(j["result"] == {"ok": True} and j["attempt"] == 1 for j in jobs[:2])
    assert jobs[2]["error"] == "no url in the payload"
    assert not (tmp_path / "slept").exists()


async def test_the_readme_shell_worker_waits_before_leasing_again_when_the_server_is_down(tmp_path: Path) -> None:
    # nothing listens on the port: every lease fails at once, and each
    # failure must be followed by a pause, not by the next lease
    run = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            ["bash", "-c", bounded(readme_loop(), f"http://127.0.0.1:{free_port()}", 3)],
            cwd=tmp_path, capture_output=True, text=True,
        )  # fmt: skip
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "slept").read_text().split() == ["5", "5", "5"]


async def test_the_example_handlers_run_as_their_docstring_says(tmp_path: Path) -> None:
    # The commands exactly as examples/handlers.py prints them, against a
    # `qftrio serve --dev` found through QFTRIO_URL.
    examples = Path(__file__).resolve().parent.parent / "examples"
    doc = (examples / "handlers.py").read_text().split('"""')[1]
    worker_cmd, enqueue_cmd = [line.strip() for line in doc.splitlines() if line.startswith("    QFTRIO_")]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "QFTRIO_URL": base, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    server = spawn(["serve", "--dev", "--db", str(tmp_path / "q.db"), "--bind", f"127.0.0.1:{port}"], log=tmp_path / "server.log")
    worker = None
    try:
        await wait_healthy(base)
        worker = subprocess.Popen(
            ["bash", "-c", worker_cmd], cwd=examples, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        out = subprocess.run(["bash", "-c", enqueue_cmd], cwd=examples, env=env, capture_output=True, text=True, timeout=20)
        assert out.returncode == 0, out.stderr
        job_id = json.loads(out.stdout)["id"]
        async with httpx.AsyncClient(base_url=base, timeout=10, headers={"Authorization": "Bearer dev"}) as client:
            with trio.fail_after(20):
                while (job := (await client.get(f"/api/v1/jobs/{job_id}")).json())["status"] != "completed":
                    await trio.sleep(0.1)
        assert job["result"]["output"] == "cat-320w.png"
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        stop(server)
