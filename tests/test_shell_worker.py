"""The protocol's reference worker, a shell loop of curl and jq, runs jobs
against a real ``qftrio serve --dev`` process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from .processes import free_port, spawn, stop, wait_healthy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (shutil.which("jq") and shutil.which("curl")), reason="needs curl and jq"),
]

# As printed in the protocol document, with the token and queue filled in.
SEED_LOOP = r"""
BASE=$QFTRIO_BASE
AUTH='Authorization: Bearer dev'

while true; do
  leased=$(curl -s -X POST "$BASE/api/v1/queues/images/lease" -H "$AUTH" -H 'Content-Type: application/json' \
    -d '{"max_jobs":1,"lease_secs":60,"wait_secs":20}')
  id=$(echo "$leased"    | jq -r '.jobs[0].job.id // empty')
  token=$(echo "$leased" | jq -r '.jobs[0].lease_token // empty')
  [ -z "$id" ] && continue                      # empty long-poll; lease again

  # Heartbeat in the background every 30s while the handler runs.
  ( while sleep 30; do
      status=$(curl -s -X POST "$BASE/api/v1/jobs/$id/heartbeat" -H "$AUTH" -H 'Content-Type: application/json' \
        -d "{\"lease_token\":\"$token\",\"extend_secs\":60}" | jq -r .status)
      [ "$status" != "running" ] && exit 0      # server owns the outcome now
    done ) & hb=$!

  if ./resize-image "$(echo "$leased" | jq -c '.jobs[0].job.payload')"; then
    curl -s -X POST "$BASE/api/v1/jobs/$id/complete" -H "$AUTH" -H 'Content-Type: application/json' \
      -d "{\"lease_token\":\"$token\",\"result\":{\"ok\":true}}"
  else
    curl -s -X POST "$BASE/api/v1/jobs/$id/fail" -H "$AUTH" -H 'Content-Type: application/json' \
      -d "{\"lease_token\":\"$token\",\"error\":\"resize failed\",\"retryable\":true}"
  fi
  kill $hb 2>/dev/null
done
"""

RESIZE_IMAGE = """#!/bin/sh
case "$1" in *broken*) exit 1 ;; esac
exit 0
"""


async def test_seed_shell_worker_processes_jobs(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = spawn(["serve", "--dev", "--db", str(tmp_path / "q.db"), "--bind", f"127.0.0.1:{port}"], log=tmp_path / "server.log")
    (tmp_path / "resize-image").write_text(RESIZE_IMAGE)
    (tmp_path / "resize-image").chmod(0o755)
    worker = None
    try:
        await wait_healthy(base)
        auth = {"Authorization": "Bearer dev"}
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            good = []
            for i in range(3):
                r = await client.post("/api/v1/jobs", json={"kind": "resize-image", "payload": {"n": i}, "config": {"queue": "images"}}, headers=auth)
                good.append(r.json()["id"])
            r = await client.post(
                "/api/v1/jobs",
                json={"kind": "resize-image", "payload": {"file": "broken"}, "config": {"queue": "images", "max_attempts": 1}},
                headers=auth,
            )
            bad = r.json()["id"]
            worker = subprocess.Popen(
                ["bash", "-c", SEED_LOOP], cwd=tmp_path, env={**os.environ, "QFTRIO_BASE": base},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            with trio.fail_after(30):
                while True:
                    jobs = [(await client.get(f"/api/v1/jobs/{i}", headers=auth)).json() for i in [*good, bad]]
                    if all(j["status"] in ("completed", "failed") for j in jobs):
                        break
                    await trio.sleep(0.1)
        assert [j["status"] for j in jobs] == ["completed", "completed", "completed", "failed"]
        assert all(j["result"] == {"ok": True} and j["attempt"] == 1 for j in jobs[:3])
        assert jobs[3]["error"] == "resize failed"
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        stop(server)


async def test_the_example_handlers_run_as_their_docstring_says(tmp_path: Path) -> None:
    # The commands exactly as examples/handlers.py prints them, against a
    # `qftrio serve --dev` found through QUEUEFLOW_URL.
    examples = Path(__file__).resolve().parent.parent / "examples"
    doc = (examples / "handlers.py").read_text().split('"""')[1]
    worker_cmd, enqueue_cmd = [line.strip() for line in doc.splitlines() if line.startswith("    QUEUEFLOW_")]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "QUEUEFLOW_URL": base, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
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
