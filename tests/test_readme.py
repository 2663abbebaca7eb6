"""Every command of the README runs as written, on a fresh copy of the project.

The first command installs into a new ``.venv`` and starts the server; every
later ``sh`` block then runs in order in one bash script in that directory,
with the Python files the README shows written out under the names their
first line gives. Only the port changes (the machine may be running something
on 8000), and the shell worker's ``while true`` loop runs once: the script
defines ``true`` as a function that is true once. ``scripts/test`` is this
suite, so it is the one command not run.
"""

from __future__ import annotations

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

from .processes import ROOT, free_port, stop, wait_healthy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (shutil.which("jq") and shutil.which("curl")), reason="needs curl and jq"),
]

README = (ROOT / "README.md").read_text()
DEFAULT = "127.0.0.1:8000"
FIRST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/qftrio serve --dev"
SERVE = "qftrio serve "
# The shell worker's loop ends after one round (bash looks up functions before
# builtins), and the sleep of its heartbeat, orphaned when the loop kills the
# subshell, does not hold the script's output open.
PRELUDE = 'true() { [ -z "$ran" ] && ran=1; }\nsleep() { command sleep "$@" >/dev/null 2>&1; }\n'


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def at(text: str, port: int) -> str:
    return text.replace(DEFAULT, f"127.0.0.1:{port}")


def test_the_readme_is_in_the_order_a_newcomer_needs() -> None:
    headings = re.findall(r"^## (.*)$", README, re.M)
    assert headings[:3] == ["Start", "When to pick it", "Enqueue and run a job from Python"]
    assert blocks("sh")[0].splitlines() == [FIRST_COMMAND, "scripts/test"]
    # after the first command, qftrio is on PATH only once the venv is activated
    later = "".join(blocks("sh")[1:])
    assert later.startswith("source .venv/bin/activate\n")


def stop_first_command(bash: subprocess.Popen) -> int:
    """SIGTERM to the server the first command started (bash may have exec'd
    it, or may be waiting on it), then SIGKILL to whatever is left of its
    session; the server's exit status."""
    server = [
        int(stat.parent.name)
        for stat in Path("/proc").glob("[0-9]*/stat")
        if _session(stat) == bash.pid and b"serve" in _read(stat.parent / "cmdline")
    ]
    for pid in server:
        os.kill(pid, signal.SIGTERM)
    try:
        return bash.wait(30)  # bash ends with the server, whether it exec'd it or waits on it
    finally:
        kill_session(bash)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL to whatever is left of the session *proc* leads, and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _session(stat: Path) -> int | None:
    fields = _read(stat).rpartition(b")")[2].split()  # state, ppid, pgrp, session, ...
    return int(fields[3]) if len(fields) > 3 else None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process has gone
        return b""


def copy_project(dest: Path) -> None:
    dest.mkdir()
    shutil.copy(ROOT / "pyproject.toml", dest)
    shutil.copy(ROOT / "README.md", dest)
    shutil.copytree(ROOT / "qftrio", dest / "qftrio", ignore=shutil.ignore_patterns("__pycache__"))


def fenced_python_files(dest: Path, port: int) -> list[str]:
    names = []
    for block in blocks("python"):
        name = block.splitlines()[0].removeprefix("# ")
        (dest / name).write_text(at(block, port))
        names.append(name)
    return names


async def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    project = tmp_path / "qftrio"
    copy_project(project)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    assert fenced_python_files(project, port) == ["handlers.py", "enqueue.py"]
    first = blocks("sh")[0].splitlines()[0] + f" --bind 127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith(("QUEUEFLOW_", "QFTRIO_"))}
    env["QUEUEFLOW_URL"] = base  # where the README's qftrio commands find the server on this port
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            ["bash", "-c", first], cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    later = [b for b in blocks("sh")[1:] if not b.startswith(SERVE)]
    script = "set -e\n" + PRELUDE + "\n".join(at(b, port) for b in later)
    try:
        # the first command installs qftrio before it serves: bound the wait by that work
        with trio.fail_after(600):
            while server.poll() is None and not (project / ".venv/bin/qftrio").exists():
                await trio.sleep(0.2)
        await wait_healthy(base, timeout=60)
        run = await trio.to_thread.run_sync(
            lambda: subprocess.run(["bash", "-c", script], cwd=project, env=env, capture_output=True, text=True, timeout=300)
        )
        assert run.returncode == 0, run.stdout + run.stderr
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer dev"}) as client:
            jobs = (await client.get("/api/v1/jobs", params={"queue": "images"})).json()["jobs"]
    finally:
        server_rc = stop_first_command(server)
    assert server_rc == 0, log.read_text()
    out = run.stdout
    # the Python example: the worker ran the handler, enqueue.py saw the result
    assert "completed {'thumbnail': 'a-small.png'}" in out
    # the curl quickstart: the job leased by hand completed, and the stats count it
    assert '"status":"completed"' in out.replace(" ", "")
    # the shell worker ran the job enqueued from the command line
    assert "resizing b.png" in out
    assert sorted((j["payload"]["url"], j["status"]) for j in jobs) == [
        ("a.png", "completed"),
        ("a.png", "completed"),
        ("b.png", "completed"),
    ]


async def test_the_production_command_starts_a_server_without_dev_mode(tmp_path: Path) -> None:
    (command,) = [b for b in blocks("sh") if b.startswith(SERVE)]
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "WORKER_TOKEN": "worker-secret-0123456789",
        "ACME_TOKEN": "acme-secret-0123456789",
    }
    server = subprocess.Popen(
        ["bash", "-c", command.replace("0.0.0.0:8000", f"127.0.0.1:{port}")], cwd=tmp_path, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        await wait_healthy(f"http://127.0.0.1:{port}")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            tenant = await client.get("/api/v1/queues", headers={"Authorization": "Bearer acme-secret-0123456789"})
            dev = await client.get("/api/v1/queues", headers={"Authorization": "Bearer dev"})
    finally:
        stop(server)
    assert tenant.status_code == 200
    assert dev.status_code == 401
