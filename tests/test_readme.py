"""The README's curl quickstart, pasted as written, runs a job to completion
against a real ``qftrio serve --dev`` process."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import trio

from .processes import ROOT, free_port, spawn, stop, wait_healthy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (shutil.which("jq") and shutil.which("curl")), reason="needs curl and jq"),
]


def quickstart_blocks() -> list[str]:
    """The ``sh`` blocks of the README's "Quickstart with curl" section, in order."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart with curl", 1)[1].split("A complete worker in shell", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


async def test_the_curl_quickstart_runs_as_written(tmp_path) -> None:
    blocks = quickstart_blocks()
    assert len(blocks) == 3
    port = free_port()
    script = "set -e\n" + "\n".join(blocks).replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}")
    server = spawn(["serve", "--dev", "--db", str(tmp_path / "q.db"), "--bind", f"127.0.0.1:{port}"], cwd=tmp_path)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}")
        proc = await trio.to_thread.run_sync(
            lambda: subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
        )
    finally:
        assert stop(server) == 0
    assert proc.returncode == 0, proc.stderr
    assert '"status":"completed"' in proc.stdout.replace(" ", "")
    assert '"completed":1' in proc.stdout.replace(" ", "")
