"""The worker end to end: in-process over real HTTP, in-process on the engine,
and as real ``qftrio worker`` processes against a real ``qftrio serve``
process (cancellation, a second signal, the command line's errors). What
every runtime must do (kill -9, draining, heartbeats) is
tests/sdk_conformance/'s."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio.client import Client
from qftrio.models import Job, Status
from qftrio.server.engine import Engine
from qftrio.server.inprocess import EngineTransport
from qftrio.server.serve import run_server, serve
from qftrio.server.store.sqlite import open_sqlite_store
from qftrio.worker import HttpTransport, Registry, WorkerEvent, open_worker
from qftrio.worker.transport import ReportReply

from .conftest import RunningServer, server_config
from .processes import QFTRIO, ROOT, free_port, spawn, stop

WORKER_TOKEN = "e2e-worker-token-1"
TENANT_TOKEN = "e2e-tenant-token-1"


async def wait_until(predicate: Callable[[], Any], *, timeout: float = 15, every: float = 0.05) -> Any:
    with trio.fail_after(timeout):
        while True:
            value = await predicate()
            if value:
                return value
            await trio.sleep(every)


# -- in-process, over HTTP and on the engine ---------------------------------------


class CountingHttpTransport(HttpTransport):
    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self.complete_calls: list[int] = []

    async def complete(self, items: Any) -> list[ReportReply]:
        self.complete_calls.append(len(items))
        return await super().complete(items)


def quick_registry() -> Registry:
    reg = Registry()

    @reg.handler("quick")
    async def quick(job: Job) -> dict[str, Any]:
        await trio.sleep(0.01)
        return {"n": job.payload["n"]}

    @reg.handler("forever")
    async def forever(job: Job) -> dict[str, Any]:
        await trio.sleep_forever()
        return {}

    return reg


async def test_http_worker_batches_its_reports(server: RunningServer) -> None:
    async with Client(server.url, server.tenants["acme"]) as tenant, Client(server.url, server.worker_token) as wc:
        jobs = await tenant.enqueue_many([{"kind": "quick", "payload": {"n": n}, "queue": "fast"} for n in range(60)])
        transport = CountingHttpTransport(wc)
        with trio.fail_after(20):
            async with open_worker(transport, "fast", quick_registry(), lanes=20, batch=20, lease_secs=10, wait_secs=1):
                await wait_until(lambda: _all_status(tenant, "fast", Status.COMPLETED, 60))
        results = sorted([(await tenant.job_get(j.id)).result["n"] for j in jobs])  # type: ignore[index]
    assert results == list(range(60))
    assert sum(transport.complete_calls) == 60
    assert len(transport.complete_calls) < 30, transport.complete_calls  # coalesced


async def _all_status(client: Client, queue: str, status: Status, n: int) -> bool:
    stats = await client.queue_stats(queue)
    return stats.counts.get(status.value, 0) == n


async def test_engine_worker_completes_and_obeys_cancel(server: RunningServer) -> None:
    events: list[WorkerEvent] = []
    async with Client(server.url, server.tenants["acme"]) as tenant:
        done = await tenant.enqueue("quick", {"n": 7}, queue="inproc")
        stuck = await tenant.enqueue("forever", queue="inproc")
        with trio.fail_after(20):
            async with open_worker(
                EngineTransport(server.engine), "inproc", quick_registry(), lease_secs=2, wait_secs=1, on_event=events.append
            ):
                await wait_until(lambda: _status_is(tenant, stuck.id, Status.RUNNING))
                await tenant.job_cancel(stuck.id)
                t0 = trio.current_time()
                await wait_until(lambda: _has_event(events, "lost"))
                assert trio.current_time() - t0 <= 1.5
        assert (await tenant.job_get(done.id)).result == {"n": 7}
        assert (await tenant.job_get(stuck.id)).status is Status.CANCELLED
    (lost,) = [e for e in events if e.type == "lost"]
    assert lost.job_id == stuck.id and lost.error == "the job is cancelled"


async def _status_is(client: Client, job_id: str, status: Status) -> bool:
    return (await client.job_get(job_id)).status is status


async def _has_event(events: list[WorkerEvent], type: str) -> bool:
    return any(e.type == type for e in events)


#: Jobs of the "together" registry, each waiting until TOGETHER of them run at once.
TOGETHER = 10
_together_started = {"n": 0}
together_registry = Registry()


@together_registry.handler("together")
async def _together(job: Job) -> dict[str, Any]:
    _together_started["n"] += 1
    with trio.fail_after(5):
        while _together_started["n"] < TOGETHER:
            await trio.sleep(0.01)
    return {}


async def test_in_process_handlers_run_as_many_jobs_at_once_as_a_worker(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    # serve --handlers with no --lanes: more than the four at once it once ran
    _together_started["n"] = 0
    stop_serving = trio.Event()
    config = server_config(
        sqlite_path=str(tmp_path / "together.db"),
        handlers=f"{__name__}:together_registry",
        handler_queues=("together",),
    )
    (url,) = await nursery.start(functools.partial(serve, config, shutdown_trigger=stop_serving.wait))
    async with Client(url, "acme-secret") as tenant:
        jobs = await tenant.enqueue_many([{"kind": "together", "queue": "together"}] * TOGETHER)
        ended = await wait_until(lambda: _all_ended(tenant, [j.id for j in jobs]))
    stop_serving.set()
    assert [(j.status, j.attempt) for j in ended] == [(Status.COMPLETED, 1)] * TOGETHER


def big_registry() -> Registry:
    reg = Registry()

    @reg.handler("shout")
    async def shout(job: Job) -> dict[str, Any]:
        raise ValueError("x" * job.payload["chars"])

    started = 0
    all_started = trio.Event()

    @reg.handler("blob")
    async def blob(job: Job) -> dict[str, Any]:
        # the first `together` jobs finish at once, when the last of them starts
        nonlocal started
        started += 1
        if started >= job.payload.get("together", 1):
            all_started.set()
        with trio.fail_after(10):
            await all_started.wait()
        return {"blob": "b" * job.payload["bytes"]}

    return reg


async def _all_ended(client: Client, job_ids: list[str]) -> list[Job] | None:
    jobs = [await client.job_get(i) for i in job_ids]
    return jobs if all(j.status in (Status.COMPLETED, Status.FAILED) for j in jobs) else None


async def test_an_error_over_the_servers_cap_is_truncated_saying_so(server: RunningServer) -> None:
    async with Client(server.url, server.tenants["acme"]) as tenant, Client(server.url, server.worker_token) as wc:
        job = await tenant.enqueue("shout", {"chars": 100_000}, queue="big", max_attempts=1)
        async with open_worker(HttpTransport(wc), "big", big_registry(), lease_secs=5, wait_secs=1):
            (failed,) = await wait_until(lambda: _all_ended(tenant, [job.id]))
    assert failed.status is Status.FAILED and failed.attempt == 1
    error = failed.error or ""
    assert len(error) == 65536 and error.startswith("ValueError: xxx")
    assert error.endswith("[truncated: 100012 characters in all]")


async def test_a_result_too_large_fails_its_job_at_once_saying_its_size(server: RunningServer) -> None:
    async with Client(server.url, server.tenants["acme"]) as tenant, Client(server.url, server.worker_token) as wc:
        job = await tenant.enqueue("blob", {"bytes": 2_000_000}, queue="big")
        async with open_worker(HttpTransport(wc), "big", big_registry(), lease_secs=5, wait_secs=1):
            (failed,) = await wait_until(lambda: _all_ended(tenant, [job.id]))
    assert failed.status is Status.FAILED and failed.attempt == 1  # not retried
    assert "result too large: 2000011 bytes" in (failed.error or "")


async def test_reports_too_large_together_go_in_requests_under_the_cap(server: RunningServer) -> None:
    async with Client(server.url, server.tenants["acme"]) as tenant, Client(server.url, server.worker_token) as wc:
        blob = {"kind": "blob", "payload": {"bytes": 30_000, "together": 60}, "queue": "big"}
        jobs = await tenant.enqueue_many([blob] * 60)
        transport = CountingHttpTransport(wc)
        async with open_worker(transport, "big", big_registry(), lanes=60, lease_secs=5, wait_secs=1):
            ended = await wait_until(lambda: _all_ended(tenant, [j.id for j in jobs]))
    assert all(j.status is Status.COMPLETED and j.attempt == 1 for j in ended)
    # handed over together, more than one request holds (60 of 30 KB), so split
    assert sum(transport.complete_calls) == 60 and max(transport.complete_calls) > 34


@pytest.fixture
async def small_body_server(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[str]:
    """A server on the embedded store whose body cap is 64 KiB."""
    async with open_sqlite_store(tmp_path / "small.db") as store:
        stop_serving = trio.Event()
        config = server_config(max_body_bytes=65536)
        binds = await nursery.start(functools.partial(run_server, Engine(store), config, shutdown_trigger=stop_serving.wait))
        yield binds[0]
        stop_serving.set()


async def test_one_refused_report_fails_its_own_job_and_not_the_batch(small_body_server: str) -> None:
    url = small_body_server
    async with Client(url, "acme-secret") as tenant, Client(url, "worker-secret") as wc:
        small = await tenant.enqueue_many([{"kind": "blob", "payload": {"bytes": 10}, "queue": "big"}] * 5)
        big = await tenant.enqueue("blob", {"bytes": 100_000}, queue="big")
        async with open_worker(HttpTransport(wc), "big", big_registry(), lanes=6, lease_secs=5, wait_secs=1):
            ended = await wait_until(lambda: _all_ended(tenant, [*(j.id for j in small), big.id]))
    *done, refused = ended
    assert all(j.status is Status.COMPLETED for j in done)
    assert refused.status is Status.FAILED and refused.attempt == 1
    assert "the server refused the result" in (refused.error or "") and "65536" in (refused.error or "")


# -- real processes ----------------------------------------------------------------

HANDLERS = textwrap.dedent(
    '''
    import os
    import time

    import trio

    from qftrio.worker import Registry

    registry = Registry()
    MARKS = os.environ["E2E_MARKS"]


    def mark(job, what):
        with open(os.path.join(MARKS, f"{job.id}.{what}"), "w") as f:
            f.write(repr(time.time()))


    @registry.handler("sleep")
    async def sleep(job):
        mark(job, f"started-{job.attempt}")
        try:
            await trio.sleep(job.payload["secs"])
        except BaseException:
            mark(job, "cancelled")
            raise
        return {"attempt": job.attempt, "worker": job.worker_id}


    @registry.handler("gc-settings")
    async def gc_settings(job):
        import gc

        return {"young_threshold": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}
    '''
)


class Procs:
    """A ``qftrio serve`` process, and ``qftrio worker`` processes started
    on demand, all stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.marks = tmp / "marks"
        self.marks.mkdir()
        (tmp / "e2e_handlers.py").write_text(HANDLERS)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.env = {"E2E_MARKS": str(self.marks), "QUEUEFLOW_WORKER_TOKEN": WORKER_TOKEN}
        self.procs: list[subprocess.Popen] = []
        self.server = self._spawn(
            "serve",
            ["serve", "--bind", self.url.removeprefix("http://"), "--db", str(tmp / "q.db"),
             "--worker-token", WORKER_TOKEN, "--tenant", f"e2e={TENANT_TOKEN}",
             "--handlers", "e2e_handlers:registry", "--queue", "in-server"],
        )
        self._wait_healthy()

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        proc = spawn(args, env=self.env, cwd=self.tmp, log=self.tmp / f"{name}.log")
        self.procs.append(proc)
        return proc

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.server.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("qftrio serve did not come up:\n" + (self.tmp / "serve.log").read_text())

    def worker(self, name: str, queue: str, *, lease_secs: int = 2, lanes: int = 1, extra: list[str] = ()) -> subprocess.Popen:
        return self._spawn(
            name,
            ["worker", queue, "e2e_handlers:registry", "--url", self.url, "--lease-secs", str(lease_secs),
             "--wait-secs", "1", "--lanes", str(lanes), "--worker-id", name, *extra],
        )

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def marked(self, job_id: str, what: str) -> float | None:
        path = self.marks / f"{job_id}.{what}"
        return float(path.read_text()) if path.exists() and path.read_text() else None

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    p = Procs(tmp_path_factory.mktemp("e2e"))
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
async def api(procs: Procs) -> AsyncIterator[Client]:
    async with Client(procs.url, TENANT_TOKEN, timeout=5) as client:
        yield client


async def wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    with trio.fail_after(timeout):
        while proc.poll() is None:
            await trio.sleep(0.05)
    return proc.returncode


async def test_worker_and_server_processes_settle_their_garbage_collector(procs: Procs, api: Client) -> None:
    job = await api.enqueue("gc-settings", queue="gc")
    w = procs.worker("gc", "gc")
    try:
        done = await wait_until(lambda: _completed(api, job.id), timeout=20)
    finally:
        stop(w)
    # the server's own handlers (serve --handlers) run in the server process
    in_server = await api.enqueue("gc-settings", queue="in-server")
    in_server_done = await wait_until(lambda: _completed(api, in_server.id), timeout=20)
    # what their imports made is frozen; the young generation is collected less often
    for result in (done.result, in_server_done.result):
        assert result["young_threshold"] == 10_000 and result["frozen"] > 10_000


async def test_a_cancelled_job_is_abandoned_within_a_heartbeat(procs: Procs, api: Client) -> None:
    job = await api.enqueue("sleep", {"secs": 60}, queue="cancel")
    w = procs.worker("canceller", "cancel", lease_secs=2)
    try:
        await wait_until(lambda: _async(procs.marked(job.id, "started-1")))
        cancelled_at = time.time()
        await api.job_cancel(job.id)
        handler_stopped = await wait_until(lambda: _async(procs.marked(job.id, "cancelled")), timeout=5)
    finally:
        stop(w)
    assert handler_stopped - cancelled_at <= 1.0 + 0.5  # one heartbeat interval (lease/2), plus slack
    after = await api.job_get(job.id)
    assert after.status is Status.CANCELLED and after.result is None
    assert "lost" in procs.log("canceller")


async def test_second_signal_cancels_at_once_with_130(procs: Procs, api: Client) -> None:
    job = await api.enqueue("sleep", {"secs": 60}, queue="twice")
    w = procs.worker("impatient", "twice", lease_secs=2)
    await wait_until(lambda: _async(procs.marked(job.id, "started-1")))
    w.send_signal(signal.SIGINT)
    await trio.sleep(0.2)
    w.send_signal(signal.SIGTERM)
    assert await wait_exit(w, 3) == 130
    assert procs.marked(job.id, "cancelled") is not None
    after = await api.job_get(job.id)
    assert after.status is Status.RUNNING and after.result is None  # nothing reported; the lease will expire
    await api.job_cancel(job.id)
    assert "Traceback" not in procs.log("impatient")


async def test_a_shutdown_timeout_cancels_a_handler_that_outlasts_it(procs: Procs, api: Client) -> None:
    job = await api.enqueue("sleep", {"secs": 600}, queue="stuck")
    w = procs.worker("stuck", "stuck", lease_secs=2, extra=["--shutdown-timeout", "0.5"])
    await wait_until(lambda: _async(procs.marked(job.id, "started-1")))
    w.send_signal(signal.SIGTERM)
    assert await wait_exit(w, 10) == 130, procs.log("stuck")
    assert procs.marked(job.id, "cancelled") is not None
    after = await api.job_get(job.id)
    assert after.status is Status.RUNNING and after.result is None  # nothing reported; the lease will expire
    await api.job_cancel(job.id)
    log = procs.log("stuck")
    assert "shutdown timeout (0.5 s) ran out" in log and "Traceback" not in log


async def test_one_worker_process_serves_several_queues_each_with_its_lanes(procs: Procs, api: Client) -> None:
    backlog = [await api.enqueue("sleep", {"secs": 1}, queue="multi-a") for _ in range(3)]
    other = await api.enqueue("sleep", {"secs": 0}, queue="multi-b")
    w = procs.worker("multi", "multi-a,multi-b", lanes=1)
    try:
        done = await wait_until(lambda: _completed(api, other.id), timeout=20)
        # the backlog on multi-a did not hold multi-b's job back
        assert not all([(await api.job_get(j.id)).status is Status.COMPLETED for j in backlog])
        finished = [await wait_until(lambda j=j: _completed(api, j.id), timeout=20) for j in backlog]
    finally:
        assert stop(w) == 0
    assert done.result == {"attempt": 1, "worker": "multi"}
    assert all(j.result == {"attempt": 1, "worker": "multi"} for j in finished)
    assert "leasing from 'multi-a', 'multi-b'" in procs.log("multi")


def _run_cli(procs: Procs, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QFTRIO, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **procs.env, **env},
        cwd=procs.tmp,
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_a_refused_token_is_one_line_and_exit_2(procs: Procs) -> None:
    res = _run_cli(procs, ["worker", "q", "e2e_handlers:registry", "--url", procs.url], QUEUEFLOW_WORKER_TOKEN="nope")
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.startswith("qftrio")]
    assert len(lines) == 1 and "refused the worker token" in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    res = _run_cli(procs, ["worker", "q", "e2e_handlers:registry", "--url", procs.url], QUEUEFLOW_WORKER_TOKEN=TENANT_TOKEN)
    assert res.returncode == 2 and "worker token" in res.stderr and "Traceback" not in res.stderr
    # QFTRIO_WORKER_TOKEN is read first (the valid QUEUEFLOW_WORKER_TOKEN of procs.env is set too)
    res = _run_cli(procs, ["worker", "q", "e2e_handlers:registry", "--url", procs.url], QFTRIO_WORKER_TOKEN="nope")
    assert res.returncode == 2 and "refused the worker token" in res.stderr, res.stderr


def test_an_unimportable_registry_is_one_line_and_exit_2(procs: Procs) -> None:
    for ref, words in [
        ("no_such_module:registry", "no module named 'no_such_module'"),
        ("e2e_handlers:nothing", "has no attribute 'nothing'"),
        ("e2e_handlers:mark", "not a qftrio Registry"),
        ("e2e_handlers", "expected module:attribute"),
    ]:
        res = _run_cli(procs, ["worker", "q", ref, "--url", procs.url])
        assert res.returncode == 2, (ref, res.stderr)
        assert words in res.stderr and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_an_import_error_names_its_file_and_line_and_shows_the_traceback_at_debug(procs: Procs) -> None:
    (procs.tmp / "broken_handlers.py").write_text("import qftrio\nregistry = qftrio.Registry()\nraise RuntimeError('no API key')\n")
    (procs.tmp / "typo_handlers.py").write_text("import qftrio\n\ndef f(:\n    pass\n")
    for module, line, error in (("broken_handlers", 3, "RuntimeError: no API key"), ("typo_handlers", 3, "SyntaxError")):
        res = _run_cli(procs, ["worker", "q", f"{module}:registry", "--url", procs.url])
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        (said,) = res.stderr.strip().splitlines()
        assert f"{procs.tmp / module}.py:{line}: {error}" in said
    res = _run_cli(procs, ["worker", "q", "broken_handlers:registry", "--url", procs.url, "--log-level", "DEBUG"])
    assert res.returncode == 2 and "Traceback" in res.stderr and "raise RuntimeError('no API key')" in res.stderr


class _Impostor(http.server.BaseHTTPRequestHandler):
    """Something at the worker's URL that is not qftrio: it answers every
    POST with ``status`` and ``body``."""

    status = 404
    body = b"<!DOCTYPE html>\n<html>\n<head><title>404 Not Found</title></head>\n" + b"<p>padding</p>\n" * 500 + b"</html>\n"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _impostor(status: int, body: bytes) -> Iterator[str]:
    handler = type("Handler", (_Impostor,), {"status": status, "body": body})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()
            thread.join()


def _one_line_exit_2(res: subprocess.CompletedProcess[str], words: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("qftrio worker:")]
    assert len(lines) == 1 and words in lines[0], res.stderr
    assert "Traceback" not in res.stderr and "padding" not in res.stderr


@pytest.mark.parametrize(
    "status, body, words",
    [
        (404, _Impostor.body, "has no qftrio worker routes"),
        (200, b'{"leases": []}', "does not answer as qftrio does"),
    ],
)
def test_a_url_where_qftrio_does_not_answer_is_one_line_and_exit_2(
    procs: Procs, status: int, body: bytes, words: str
) -> None:
    with _impostor(status, body) as url:
        res = _run_cli(procs, ["worker", "q", "e2e_handlers:registry", "--url", url])
    _one_line_exit_2(res, words)


def test_settings_the_server_always_refuses_are_one_line_and_exit_2(procs: Procs) -> None:
    worker = ["worker", "q", "e2e_handlers:registry", "--url", procs.url]
    for queues, says in (("a,a", "'a' is given twice"), ("a,,b", "queue ''"), ("a,b c", "queue 'b c'")):
        _one_line_exit_2(_run_cli(procs, ["worker", queues, "e2e_handlers:registry", "--url", procs.url]), says)
    _one_line_exit_2(_run_cli(procs, [*worker, "--worker-id", "w" * 201]), "worker_id")
    for token in ("line\nbreak", "caf\u00e9"):
        _one_line_exit_2(_run_cli(procs, worker, QUEUEFLOW_WORKER_TOKEN=token), "token")


def test_a_registry_with_no_handler_is_one_line_and_exit_2(procs: Procs) -> None:
    (procs.tmp / "empty_handlers.py").write_text("import qftrio\nregistry = qftrio.Registry()\n")
    res = _run_cli(procs, ["worker", "q", "empty_handlers:registry", "--url", procs.url])
    _one_line_exit_2(res, "no handlers")


async def _async(value: Any) -> Any:
    return value


async def _completed(api: Client, job_id: str) -> Job | None:
    job = await api.job_get(job_id)
    return job if job.status is Status.COMPLETED else None


def _example_handlers() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_handlers", ROOT / "examples" / "handlers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- qftrio.testing, on the example handlers ------------------------------------------


async def test_testing_server_runs_jobs_end_to_end() -> None:
    from qftrio.testing import open_test_server

    registry = _example_handlers().registry
    async with open_test_server() as srv:
        job = await srv.run_job(registry, "resize-image", {"src": "a.png", "width": 64, "secs": 0}, queue="images")
        assert job.status is Status.COMPLETED and job.result == {"output": "a-64w.png", "width": 64, "attempt": 1}
        bad = await srv.run_job(registry, "resize-image", {"src": "a.gif"})
        assert bad.status is Status.FAILED and "src must be an image" in (bad.error or "")
        flaky = await srv.run_job(registry, "sleep", {"secs": 0, "fail_attempts": 1}, max_attempts=2)
        assert flaky.status is Status.COMPLETED and flaky.attempt == 2
        async with srv.client() as client:
            assert (await client.health())["status"] == "ok"


async def test_call_handler_without_a_server() -> None:
    from qftrio.errors import PermanentError
    from qftrio.testing import call_handler, make_job

    registry = _example_handlers().registry
    out = await call_handler(registry, "checksum", {"text": "hi"})
    assert out == {"sha256": "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"}
    with pytest.raises(PermanentError):
        await call_handler(registry, "resize-image", {"src": "a.gif"})
    with pytest.raises(KeyError):
        await call_handler(registry, "nope")
    assert make_job("k", attempt=3).attempt == 3
