"""The TypeScript SDK's own suite (``sdk/typescript``, Node's test runner):
built, then run against real ``qftrio serve`` processes it starts with this
virtualenv's ``qftrio``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .processes import qftrio_bin

SDK = Path(__file__).resolve().parent.parent / "sdk" / "typescript"
#: A copy of the lock file ``npm ci`` last installed from.
STAMP = SDK / "node_modules" / ".qftrio-installed-lock.json"

pytestmark = pytest.mark.slow


def _npm(*args: str, timeout: float) -> None:
    env = {**os.environ, "QFTRIO_BIN": qftrio_bin()}
    # The caps only turn a hang into a failure: each step takes seconds.
    done = subprocess.run(
        ["npm", *args], cwd=SDK, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if done.returncode != 0:
        pytest.fail(f"npm {' '.join(args)} exited with {done.returncode}:\n{done.stdout}", pytrace=False)


@pytest.mark.skipif(
    not (shutil.which("node") and shutil.which("npm")) and not os.environ.get("CI"),
    reason="needs Node 20+ and npm (.ci/run installs them)",
)
def test_typescript_sdk() -> None:
    version = subprocess.run(["node", "--version"], stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        pytest.fail(f"the TypeScript SDK needs Node 20 or later; node is {version}", pytrace=False)
    lock = (SDK / "package-lock.json").read_bytes()
    if not STAMP.exists() or STAMP.read_bytes() != lock:
        _npm("ci", "--prefer-offline", "--no-audit", "--no-fund", timeout=600)
        STAMP.write_bytes(lock)
    _npm("run", "build", timeout=300)
    _npm("test", timeout=600)
