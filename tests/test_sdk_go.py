"""The Go SDK's own suite (``sdk/go``): ``gofmt``, ``go vet`` and ``go test``,
run against real ``qftrio serve`` processes it starts with this virtualenv's
``qftrio``. Go's build and module caches stay where Go keeps them (under
``$HOME``), so that a second run builds nothing again."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .processes import qftrio_bin

SDK = Path(__file__).resolve().parent.parent / "sdk" / "go"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not shutil.which("go") and not os.environ.get("CI"), reason="needs Go 1.22+ (.ci/run installs it)"
    ),
]


def _run(*args: str, timeout: float) -> str:
    env = {**os.environ, "QFTRIO_BIN": qftrio_bin()}
    # The caps only turn a hang into a failure: each step takes seconds once built.
    done = subprocess.run(
        args, cwd=SDK, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited with {done.returncode}:\n{done.stdout}", pytrace=False)
    return done.stdout


def test_go_sdk() -> None:
    unformatted = _run("gofmt", "-l", ".", timeout=120)
    assert not unformatted.strip(), f"gofmt would change:\n{unformatted}"
    _run("go", "vet", "./...", timeout=300)
    _run("go", "test", "-count=1", "./...", timeout=600)
