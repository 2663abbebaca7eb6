"""The Rust SDK's own suite (``sdk/rust``, ``cargo test``): clippy, then the
tests, against a real ``qftrio serve`` that the tests start with this
virtualenv's ``qftrio``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .processes import qftrio_bin

SDK = Path(__file__).resolve().parent.parent / "sdk" / "rust"

pytestmark = pytest.mark.slow


def _cargo(*args: str, timeout: float) -> None:
    # CI runs in a fresh clone: the build directory lives outside it, so that
    # only the first run on a machine compiles the dependencies.
    target = os.environ.get("CARGO_TARGET_DIR") or str(Path.home() / ".cache" / "qftrio" / "cargo-target")
    env = {**os.environ, "QFTRIO_BIN": qftrio_bin(), "CARGO_TARGET_DIR": target}
    # The caps only turn a hang into a failure: a cold build takes about a minute.
    done = subprocess.run(
        ["cargo", *args], cwd=SDK, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if done.returncode != 0:
        pytest.fail(f"cargo {' '.join(args)} exited with {done.returncode}:\n{done.stdout}", pytrace=False)


@pytest.mark.skipif(
    not shutil.which("cargo") and not os.environ.get("CI"),
    reason="needs Rust's cargo (rustup, or Debian's cargo)",
)
def test_rust_sdk() -> None:
    _cargo("fmt", "--check", timeout=120)
    _cargo("clippy", "--locked", "--all-targets", "--", "-D", "warnings", timeout=900)
    _cargo("test", "--locked", timeout=900)
