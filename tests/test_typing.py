"""User code type-checks against qftrio as installed: ``mypy --strict`` on a
sample of the public surface (a registry, handlers with and without options,
async and sync, jobs, the client, an embedded worker) reports nothing, and it
still reports the mistakes it should, which it can only when the decorated
handlers keep their own types.

qftrio is copied into the site-packages of a virtual environment of the
test's own, as an install would put it, because mypy does not follow the
import hook of an editable install; the environment reaches the other
packages through a ``.pth`` file. mypy runs in a process of its own.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
from pathlib import Path

import pytest

# The tests share mypy's cache, which two processes must not write at once.
pytestmark = pytest.mark.xdist_group("mypy-cache")

ROOT = Path(__file__).resolve().parent.parent

SAMPLE = '''
from __future__ import annotations

from typing import Any

import trio

import qftrio

registry = qftrio.Registry()


@registry.handler("resize-image")
async def resize(job: qftrio.Job) -> dict[str, Any]:
    await trio.sleep(0)
    return {"id": job.id, "source": job.payload.get("src")}


@registry.handler("send-mail", timeout=30)
def send_mail(job: qftrio.Job) -> None:
    print(job.kind, job.attempt)


@registry.handler("noop", timeout=1.5)
async def noop(job: qftrio.Job) -> None:
    pass


async def main() -> None:
    async with qftrio.Client("http://127.0.0.1:8000", "token") as client:
        job: qftrio.Job = await client.enqueue("resize-image", {"src": "a.png"}, queue="images")
        status: qftrio.Status = (await client.job_get(job.id)).status
        print(status)
        async with qftrio.open_worker(qftrio.HttpTransport(client), "images", registry, lanes=4) as worker:
            worker.stop()
    resized: dict[str, Any] = await resize(job)
    print(resized["id"], registry.kinds)
    send_mail(job)
    await noop(job)


def view() -> str:
    with qftrio.SyncClient("http://127.0.0.1:8000", "token", timeout=5) as sync:
        job: qftrio.Job = sync.enqueue("resize-image", {"src": "a.png"}, queue="images")
        page: list[qftrio.Job]
        page, cursor = sync.jobs_list(status=qftrio.Status.PENDING, limit=10, cursor=None)
        paused: bool = sync.queue_pause("images").paused
        print(len(page), cursor, paused, sync.health()["status"])
        sync.complete(job.id, "token", {"ok": True})
        return job.id


trio.run(main)
print(view())
'''

# Each mistake is marked with the start of what mypy must say about its line.
MISTAKES = '''
from __future__ import annotations

from typing import Any

import qftrio

registry = qftrio.Registry()


@registry.handler("resize-image")
async def resize(job: qftrio.Job) -> dict[str, Any]:
    return {}


@registry.handler("count")  # MISTAKE: Value of type variable
def count(job: qftrio.Job) -> int:
    return 1


@registry.handler("text")  # MISTAKE: Value of type variable
def takes_text(text: str) -> None:
    pass


@registry.handler("slow", timeout="30")  # MISTAKE: Argument "timeout"
def slow(job: qftrio.Job) -> None:
    pass


async def use(job: qftrio.Job) -> None:
    size: int = await resize(job)  # MISTAKE: Incompatible types in assignment
    print(size)


async def use_clients(client: qftrio.Client, sync: qftrio.SyncClient) -> None:
    job: qftrio.Job = client.job_get("j")  # MISTAKE: Incompatible types in assignment
    again: qftrio.Job = await sync.job_get("j")  # MISTAKE: Incompatible types in "await"
    sync.job_get(1)  # MISTAKE: Argument 1 has incompatible type "int"
    sync.enqueue("x", queue=1)  # MISTAKE: Argument "queue" has incompatible type "int"
    count: str = sync.jobs_bulk("cancel")  # MISTAKE: Incompatible types in assignment
    sync.lease("q", wait=1)  # MISTAKE: Unexpected keyword argument "wait"
    print(job, again, count)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python whose site-packages holds qftrio as an install does."""
    env = tmp_path_factory.mktemp("typing-env")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=60)
    python = env / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, timeout=30,
        ).stdout.strip()
    )  # fmt: skip
    shutil.copytree(ROOT / "qftrio", site / "qftrio", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def mypy(installed: Path, source: str, cache: Path) -> tuple[int, str]:
    """``mypy --strict`` on *source*, run where qftrio's checkout is not importable."""
    work = installed.parent.parent / "work"
    work.mkdir(exist_ok=True)
    (work / "sample.py").write_text(textwrap.dedent(source))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(installed), "--cache-dir", str(cache),
         "--no-color-output", "--no-error-summary", "sample.py"],
        capture_output=True, text=True, timeout=300, cwd=work, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mypy's cache: kept between runs where pytest keeps its own cache, so
    that only a first run checks the dependencies from scratch; without
    pytest's cache plugin (``-p no:cacheprovider``), one of this test's own."""
    pytest_cache = getattr(request.config, "cache", None)
    if pytest_cache is not None:
        return Path(pytest_cache.mkdir("mypy"))
    return tmp_path_factory.mktemp("mypy-cache")


def test_the_package_ships_its_marker() -> None:
    assert (ROOT / "qftrio" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["qftrio"]


def test_user_code_is_clean_under_mypy_strict(installed: Path, cache: Path) -> None:
    code, output = mypy(installed, SAMPLE, cache)
    assert (code, output) == (0, "")


def test_mypy_still_reports_the_mistakes_of_user_code(installed: Path, cache: Path) -> None:
    code, output = mypy(installed, MISTAKES, cache)
    assert code == 1
    source = textwrap.dedent(MISTAKES).splitlines()
    expected = {n: line.split("# MISTAKE: ")[1] for n, line in enumerate(source, 1) if "# MISTAKE: " in line}
    reported: dict[int, list[str]] = {}
    for match in re.finditer(r"^sample\.py:(\d+): error: (.*)$", output, re.MULTILINE):
        reported.setdefault(int(match[1]), []).append(match[2])
    assert set(reported) == set(expected), output
    for line, says in expected.items():
        assert any(message.startswith(says) for message in reported[line]), (line, reported[line])
