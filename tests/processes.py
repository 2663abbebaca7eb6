"""Helpers for tests that run qftrio as real processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx
import trio

QFTRIO = [sys.executable, "-m", "qftrio.cli"]
ROOT = Path(__file__).resolve().parent.parent


def qftrio_bin() -> str:
    """The ``qftrio`` executable of this virtualenv (or on PATH), for other
    languages' tests to start servers with."""
    beside = Path(sys.executable).with_name("qftrio")
    found = str(beside) if beside.exists() else shutil.which("qftrio")
    assert found, "no qftrio executable beside this Python or on PATH"
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, log: Path | None = None) -> subprocess.Popen:
    """Start ``qftrio ARGS`` in the background, output to *log*."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if log is None:
        return subprocess.Popen([*QFTRIO, *args], env=full_env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    with open(log, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen([*QFTRIO, *args], env=full_env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


async def wait_healthy(url: str, *, timeout: float = 20) -> None:
    """Wait until ``GET /healthz`` answers 200."""
    with trio.fail_after(timeout):
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                try:
                    if (await client.get(f"{url}/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.05)


def stop(proc: subprocess.Popen, *, timeout: float = 10) -> int:
    """SIGTERM, then SIGKILL if it is still running after *timeout*."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
