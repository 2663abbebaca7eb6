"""Fixtures of the conformance suite: each runtime's adapter, built once per
session; a real ``qftrio serve`` per runtime; adapter processes started per
scenario, whose lines (ADAPTER.md) the scenarios wait on.

A runtime whose toolchain or SDK is missing is skipped, saying which,
except in CI (``CI`` set), where that fails.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio import Client
from qftrio.models import Job

from ..processes import QFTRIO, ROOT, free_port

HERE = Path(__file__).resolve().parent
RUNTIMES = ["python", "typescript", "go", "rust"]
WORKER_TOKEN = "conformance-worker-token"
TENANT_TOKEN = "conformance-tenant-token"
#: Caps on waits bounded by the work: they only turn a hang into a failure.
CAP = 30.0
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qftrio"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """How to start one runtime's adapter."""

    name: str
    argv: list[str]


def _missing(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 900) -> None:
    done = subprocess.run(
        argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stdout}", pytrace=False)


def _sdk(language: str) -> Path:
    """The SDK folder: this checkout's, or another's named by
    ``QFTRIO_CONFORMANCE_SDK_GO`` / ``QFTRIO_CONFORMANCE_SDK_RUST`` (only
    read: builds go elsewhere)."""
    return Path(os.environ.get(f"QFTRIO_CONFORMANCE_SDK_{language.upper()}", ROOT / "sdk" / language))


def _build_python(tmp: Path) -> Runtime:
    return Runtime("python", [sys.executable, str(HERE / "adapters" / "python_worker.py")])


def _build_typescript(tmp: Path) -> Runtime:
    if not (shutil.which("node") and shutil.which("npm")):
        _missing("the TypeScript runtime needs Node 20+ and npm")
    sdk = ROOT / "sdk" / "typescript"
    # Other test processes may build the SDK at the same time (its build
    # starts by removing dist/): build under a lock, and run the adapter
    # from a copy of its own, the package's name resolving to the copy.
    with open(sdk / "package.json", "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = sdk / "node_modules" / ".qftrio-installed-lock.json"
        lockfile = (sdk / "package-lock.json").read_bytes()
        if not stamp.exists() or stamp.read_bytes() != lockfile:
            _run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund"], cwd=sdk)
            stamp.write_bytes(lockfile)
        _run(["npm", "run", "build"], cwd=sdk)
        copy = tmp / "qftrio-typescript"
        shutil.copytree(sdk / "dist", copy / "dist")
        shutil.copy(sdk / "package.json", copy / "package.json")
    return Runtime("typescript", ["node", str(copy / "dist" / "test" / "conformance-adapter.js")])


def _build_go(tmp: Path) -> Runtime:
    if shutil.which("go") is None:
        _missing("the Go runtime needs the go toolchain")
    sdk = _sdk("go")
    if not (sdk / "cmd" / "qftrio-conformance").is_dir():
        _missing(f"no Go adapter at {sdk}/cmd/qftrio-conformance (QFTRIO_CONFORMANCE_SDK_GO names another folder)")
    binary = tmp / "qftrio-conformance"
    env = {"GOCACHE": os.environ.get("GOCACHE", str(CACHE / "go-build")), "GOFLAGS": "-mod=readonly"}
    _run(["go", "build", "-o", str(binary), "./cmd/qftrio-conformance"], cwd=sdk, env=env)
    return Runtime("go", [str(binary)])


def _build_rust(tmp: Path) -> Runtime:
    if shutil.which("cargo") is None:
        _missing("the Rust runtime needs cargo")
    sdk = _sdk("rust")
    if not (sdk / "examples" / "conformance.rs").is_file():
        _missing(f"no Rust adapter at {sdk}/examples/conformance.rs (QFTRIO_CONFORMANCE_SDK_RUST names another folder)")
    target = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "cargo-target"))
    # --locked: the SDK's Cargo.lock is used as committed, never rewritten.
    _run(["cargo", "build", "--locked", "--example", "conformance"], cwd=sdk, env={"CARGO_TARGET_DIR": str(target)})
    # A copy of its own: another build into the shared target may replace the file.
    binary = Path(shutil.copy(target / "debug" / "examples" / "conformance", tmp / "conformance"))
    return Runtime("rust", [str(binary)])


BUILDS: dict[str, Callable[[Path], Runtime]] = {
    "python": _build_python,
    "typescript": _build_typescript,
    "go": _build_go,
    "rust": _build_rust,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each runtime's scenarios in one group of their own: under pytest-xdist
    (``--dist loadgroup``), one process builds that runtime's adapter and
    serves it, and the runtimes run side by side."""
    for item in items:
        runtime = getattr(item, "callspec", None) and item.callspec.params.get("runtime")
        if runtime and HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group(f"conformance-{runtime}"))


@pytest.fixture(scope="session", params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    """Each runtime's adapter, built once per session."""
    return BUILDS[request.param](tmp_path_factory.mktemp(f"build-{request.param}"))


@dataclasses.dataclass
class Server:
    """One ``qftrio serve`` process on a SQLite file."""

    url: str
    port: int
    proc: subprocess.Popen
    log: Path
    queues: Iterator[int] = dataclasses.field(default_factory=itertools.count)

    def queue(self, name: str) -> str:
        """A queue no other scenario on this server uses."""
        return f"{name}-{next(self.queues)}"


def start_server(tmp: Path) -> Server:
    port = free_port()
    log = tmp / "serve.log"
    args = ["serve", "--bind", f"127.0.0.1:{port}", "--db", str(tmp / "q.db"), "--worker-token", WORKER_TOKEN,
            "--tenant", f"conformance={TENANT_TOKEN}"]  # fmt: skip
    with open(log, "ab") as out:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([*QFTRIO, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=2) as client:
        for _ in range(int(CAP / 0.05)):
            if proc.poll() is not None:
                break
            try:
                if client.get(f"{url}/healthz").status_code == 200:
                    return Server(url, port, proc, log)
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"qftrio serve did not come up:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def server(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The runtime's server: scenarios share it on queues of their own."""
    srv = start_server(tmp_path_factory.mktemp(f"server-{runtime.name}"))
    try:
        yield srv
    finally:
        srv.proc.terminate()
        try:
            srv.proc.wait(10)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()


@pytest.fixture
async def api(server: Server) -> AsyncIterator[Client]:
    """A tenant client of the runtime's server."""
    async with Client(server.url, TENANT_TOKEN, timeout=10) as client:
        yield client


class Adapter:
    """A running adapter process and the events it printed so far."""

    def __init__(self, runtime: Runtime, proc: trio.Process, log: Path) -> None:
        self.runtime = runtime
        self.proc = proc
        self.log = log
        self.events: list[dict[str, Any]] = []
        self.garbage: list[bytes] = []  # lines of stdout that are not the contract's
        self.closed = False
        self._changed = trio.Event()

    def __repr__(self) -> str:
        return f"<{self.runtime.name} adapter, events {self.events}, stderr:\n{self.stderr()[-4000:]}>"

    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        buffer = b""
        async for data in self.proc.stdout:
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                if isinstance(event, dict) and isinstance(event.get("event"), str):
                    self.events.append(event)
                else:
                    self.garbage.append(line)
            self._notify()
        self.closed = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def find(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event and all(e.get(k) == v for k, v in fields.items())]

    async def until(self, check: Callable[[], bool], *, what: str, timeout: float = CAP) -> None:
        """Wait until *check* holds, tried after each line the adapter prints."""
        try:
            with trio.fail_after(timeout):
                while not check():
                    if self.closed:
                        raise AssertionError(f"the adapter ended before {what}: {self!r}")
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(f"no {what} after {timeout}s: {self!r}") from None

    async def wait(self, event: str, *, timeout: float = CAP, **fields: Any) -> dict[str, Any]:
        """The first *event* line with *fields*, once printed."""
        await self.until(lambda: bool(self.find(event, **fields)), what=f"{event} {fields}", timeout=timeout)
        return self.find(event, **fields)[0]

    async def wait_exit(self, *, timeout: float = CAP) -> int:
        try:
            with trio.fail_after(timeout):
                return await self.proc.wait()
        except trio.TooSlowError:
            raise AssertionError(f"the adapter still runs after {timeout}s: {self!r}") from None

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)


_workers = itertools.count(1)


@pytest.fixture
def adapters(runtime: Runtime, tmp_path: Path, nursery: trio.Nursery) -> Callable[..., Any]:
    """``async with adapters(url, queue, lanes=1, ...) as adapter``: the
    runtime's adapter working *queue* of the server at *url*, until the end
    of the block (then killed if still running)."""

    @asynccontextmanager
    async def start(
        url: str, queue: str, *, lanes: int = 1, lease_secs: int = 2, wait_secs: int = 1,
        token: str = WORKER_TOKEN, ready: bool = True,
    ) -> AsyncIterator[Adapter]:  # fmt: skip
        worker_id = f"{runtime.name}-{next(_workers)}"
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "QFTRIO_URL": url,
            "QFTRIO_TOKEN": token,
            "ADAPTER_QUEUE": queue,
            "ADAPTER_LANES": str(lanes),
            "ADAPTER_LEASE_SECS": str(lease_secs),
            "ADAPTER_WAIT_SECS": str(wait_secs),
            "ADAPTER_WORKER_ID": worker_id,
        }
        log = tmp_path / f"{worker_id}.log"
        with open(log, "ab") as err:
            proc = await trio.lowlevel.open_process(
                runtime.argv, env=env, stdout=subprocess.PIPE, stderr=err, cwd=tmp_path
            )
        adapter = Adapter(runtime, proc, log)
        # The reader lives in the test's nursery: it ends with the process's output.
        nursery.start_soon(adapter._read)
        try:
            if ready:
                await adapter.wait("ready")
            yield adapter
            assert not adapter.garbage, f"lines outside the contract on stdout: {adapter.garbage}"
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            with trio.move_on_after(10, shield=True):
                await proc.wait()
        assert "Traceback" not in adapter.stderr(), adapter.stderr()

    return start


async def wait_job(api: Client, job_id: str, check: Callable[[Job], bool], *, what: str, timeout: float = CAP) -> Job:
    """Poll the job until *check* holds; the job then."""
    job = None
    try:
        with trio.fail_after(timeout):
            while True:
                job = await api.job_get(job_id)
                if check(job):
                    return job
                await trio.sleep(0.05)
    except trio.TooSlowError:
        raise AssertionError(f"after {timeout}s, still waiting for {what}: {job}") from None
