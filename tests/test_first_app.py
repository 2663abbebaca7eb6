"""Every command of docs/first-app.md runs as written, in a folder beside a
copy of the project, and the app does what the guide says.

The files the guide shows are written out under the names their first line
gives. Each ``sh`` block runs in order, in a shell that first ran the line
the guide gives for each new terminal; a block headed ``# terminal N`` is
left running (the server and the web app until they answer), the others
must exit 0. The clone's virtualenv is this suite's, as the README's Start
makes it; the SDK is a copy, built by the guide's own commands. Only the
ports change (the machine may be running something on 8000 or 5000).
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

from .processes import ROOT, free_port, wait_healthy
from .test_readme import kill_session

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (shutil.which("jq") and shutil.which("curl")), reason="needs curl and jq"),
    pytest.mark.skipif(
        not (shutil.which("node") and shutil.which("npm")) and not os.environ.get("CI"),
        reason="needs Node 20+ and npm (.ci/run installs them)",
    ),
]

GUIDE = (ROOT / "docs/first-app.md").read_text()
SERVER, WEB = "127.0.0.1:8000", "127.0.0.1:5000"


def fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", GUIDE, re.S | re.M)


def each_terminal() -> str:
    """The line the guide has each new terminal run first."""
    (line,) = re.findall(r"in each new terminal run first:\s+`([^`]+)`", GUIDE)
    return line


def copy_project(dest: Path) -> None:
    """The clone as the README's Start leaves it: the sources, the SDK
    unbuilt, and a virtualenv with qftrio installed (this suite's)."""
    dest.mkdir()
    shutil.copy(ROOT / "pyproject.toml", dest)
    shutil.copytree(ROOT / "qftrio", dest / "qftrio", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "sdk/typescript", dest / "sdk/typescript", ignore=shutil.ignore_patterns("node_modules", "dist")
    )
    (dest / ".venv").symlink_to(Path(sys.prefix))


def test_the_guide_shows_each_part_once() -> None:
    names = [block.splitlines()[0] for lang in ("python", "ts", "toml") for block in fenced(lang)]
    assert names == ["# app.py", "# handlers.py", "// worker.ts", "# schedules.toml"]
    terminals = [b.splitlines()[0] for b in fenced("sh") if b.startswith("# terminal")]
    assert [t.partition(":")[0] for t in terminals] == [f"# terminal {n}" for n in (1, 2, 3, 4)]
    assert "SyncClient" in fenced("python")[0] and "runWorker" in fenced("ts")[0]


async def test_every_command_of_the_guide_runs_as_written(tmp_path: Path) -> None:
    copy_project(tmp_path / "qftrio")
    app = tmp_path / "myapp"
    server_port, web_port = free_port(), free_port()
    base, web = f"http://127.0.0.1:{server_port}", f"http://127.0.0.1:{web_port}"

    def at(text: str) -> str:
        text = text.replace(SERVER, f"127.0.0.1:{server_port}").replace(WEB, f"127.0.0.1:{web_port}")
        text = text.replace("--port 5000", f"--port {web_port}")
        return text.replace("qftrio serve --dev", f"qftrio serve --dev --bind 127.0.0.1:{server_port}")

    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith(("QUEUEFLOW_", "QFTRIO_"))
    }  # fmt: skip
    env["QFTRIO_URL"] = base  # where the qftrio commands and the workers find the server on this port
    running: list[tuple[str, subprocess.Popen]] = []
    outputs: list[str] = []
    try:
        for i, block in enumerate(fenced("sh")):
            # the first block makes the app's folder, where the guide's files go
            script = at(block if i == 0 else f"{each_terminal()}\n{block}")
            if block.startswith("# terminal"):
                with open(tmp_path / f"{block.split(':')[0][2:].replace(' ', '-')}.log", "wb") as log:
                    proc = subprocess.Popen(
                        ["bash", "-c", f"exec 2>&1\n{script}"], cwd=tmp_path, env=env, stdout=log, start_new_session=True
                    )
                running.append((block.splitlines()[0], proc))
                if "qftrio serve" in block:
                    await wait_healthy(base, timeout=60)
                elif "flask" in block:
                    await _wait_answering(web, proc)
                continue
            done = await trio.to_thread.run_sync(
                lambda: subprocess.run(
                    ["bash", "-c", f"set -e\n{script}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
                )
            )
            assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}\n{_logs(tmp_path)}"
            outputs.append(done.stdout)
            if i == 0:
                for file_block in (b for lang in ("python", "ts", "toml") for b in fenced(lang)):
                    (app / file_block.splitlines()[0].split(" ", 1)[1]).write_text(at(file_block))
        for name, proc in running:
            assert proc.poll() is None, f"{name} ended: {_logs(tmp_path)}"
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            jobs = (await client.get("/api/v1/jobs", headers={"Authorization": "Bearer dev"})).json()["jobs"]
            assert (await client.post("/dashboard/signin", data={"token": "dev"})).status_code == 303
            pages = {path: (await client.get(f"/dashboard/{path}")).text for path in ("", "schedules", "workers")}
    finally:
        codes = [_stop(proc) for _, proc in running]
    out = "".join(outputs)
    # the web route enqueued, each worker ran its job, and the route read the results back
    assert '{"result":{"sent_to":"ada@example.com"},"status":"completed"}' in out
    assert '{"result":{"avatar":"https://avatars.example/ada%40example.com.png"},"status":"completed"}' in out
    assert "daily-digest" in out  # schedules list and trigger
    # Ctrl+C stops each terminal cleanly
    assert codes == [0, 0, 0, 0], _logs(tmp_path)
    by_kind = {j["kind"]: j for j in jobs}
    assert set(by_kind) == {"send-welcome", "make-avatar", "daily-digest"}
    assert by_kind["daily-digest"]["schedule"] == "daily-digest"
    assert "emails" in pages[""] and "avatars" in pages[""]
    assert "daily-digest" in pages["schedules"]
    assert "emails" in pages["workers"] and "avatars" in pages["workers"]


async def _wait_answering(url: str, proc: subprocess.Popen) -> None:
    """Until *url* answers anything at all (the web app is up), or *proc* ends."""
    with trio.fail_after(60):
        async with httpx.AsyncClient(timeout=2) as client:
            while proc.poll() is None:
                try:
                    await client.get(url)
                    return
                except httpx.TransportError:
                    await trio.sleep(0.05)
    raise AssertionError(f"the web app ended with {proc.returncode}")


def _stop(proc: subprocess.Popen) -> int | None:
    """SIGINT, as Ctrl+C in its terminal, to what a terminal runs; then
    SIGKILL to whatever is left of it. Its exit status (None if killed)."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        return None
    finally:
        kill_session(proc)


def _logs(folder: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(folder.glob("terminal-*.log")))
