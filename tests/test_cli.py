"""The command line: JSON out, and every failure one line with a non-zero exit."""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
from typing import Any

import pytest
import trio

from qftrio.cli import main

from .processes import ROOT


async def run_cli(*argv: str) -> int:
    return await trio.to_thread.run_sync(functools.partial(main, list(argv)))


def run_process(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "qftrio", *argv], capture_output=True, text=True, timeout=30, env=clean, cwd=ROOT
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


async def test_enqueue_get_list_cancel_retry_stats(server, capsys: pytest.CaptureFixture[str]) -> None:
    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    assert (
        await run_cli("enqueue", "resize-image", '{"src": "a.png"}', "--queue", "images", "--priority", "3", *opts) == 0
    )
    job = json.loads(capsys.readouterr().out)
    assert (job["kind"], job["queue"], job["priority"], job["payload"]) == (
        "resize-image",
        "images",
        3,
        {"src": "a.png"},
    )

    assert await run_cli("jobs", "get", job["id"], *opts) == 0
    assert json.loads(capsys.readouterr().out)["id"] == job["id"]
    assert await run_cli("jobs", "list", "--queue", "images", *opts) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == [job["id"]]
    assert await run_cli("jobs", "cancel", job["id"], *opts) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    assert await run_cli("jobs", "retry", job["id"], *opts) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "pending"
    assert await run_cli("stats", "images", *opts) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["pending"] == 1

    assert await run_cli("jobs", "get", "no-such-job", *opts) == 1
    assert "404" in capsys.readouterr().err
    assert await run_cli("enqueue", "k", "[1, 2]", *opts) == 2
    assert "JSON object" in capsys.readouterr().err
    assert await run_cli("enqueue", "bad kind", *opts) == 1
    assert "kind" in capsys.readouterr().err
    assert await run_cli("jobs", "list", "--url", server.url, "--token", "wrong") == 1
    assert "401" in capsys.readouterr().err


def test_serve_refuses_to_start_without_credentials(tmp_path) -> None:
    proc = run_process("serve", "--db", str(tmp_path / "q.db"), "--bind", "127.0.0.1:0")
    assert proc.returncode == 2
    assert "worker token" in one_line_error(proc)
    proc = run_process("serve", "--db", str(tmp_path / "q.db"), "--bind", "127.0.0.1:0", "--worker-token", "w")
    assert proc.returncode == 2
    assert "tenant" in one_line_error(proc)
    assert not (tmp_path / "q.db").exists()


def test_serve_on_a_busy_port_is_one_line(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_process("serve", "--dev", "--db", str(tmp_path / "q.db"), "--bind", f"127.0.0.1:{port}")
    assert proc.returncode == 2
    assert "cannot listen" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--bogus"],
        ["serve", "--mode", "sideways"],
        ["worker"],
        ["worker", "images", "handlers:registry", "--lanes", "0"],
        ["enqueue"],
        ["jobs"],
        ["nonsense"],
    ],
)
def test_bad_usage_is_one_line_and_exit_2(argv: list[str]) -> None:
    proc = run_process(*argv)
    assert proc.returncode == 2
    assert "error" in one_line_error(proc)


def test_unreachable_server_is_one_line_and_exit_1() -> None:
    proc = run_process("jobs", "list", "--url", "http://127.0.0.1:1", "--token", "t")
    assert proc.returncode == 1
    assert "cannot reach the server" in one_line_error(proc)
    proc = run_process("jobs", "list", "--url", "http://127.0.0.1:1")
    assert proc.returncode == 2
    assert "token" in one_line_error(proc)
    for url in ("http://[::1", "http://127.0.0.1:port"):
        proc = run_process("jobs", "list", "--url", url, "--token", "t")
        assert proc.returncode == 2
        assert "not a usable server URL" in one_line_error(proc)


def test_every_command_has_help() -> None:
    for argv in (["--help"], ["serve", "--help"], ["worker", "--help"], ["enqueue", "--help"], ["jobs", "list", "--help"],
                 ["workflows", "--help"], ["stats", "--help"], ["migrate", "--help"]):  # fmt: skip
        proc = run_process(*argv)
        assert proc.returncode == 0 and "usage:" in proc.stdout, argv


async def test_serve_runs_handlers_in_process(tmp_path) -> None:
    import httpx

    from .processes import free_port, spawn, stop, wait_healthy

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = spawn(
        ["serve", "--dev", "--db", str(tmp_path / "q.db"), "--bind", f"127.0.0.1:{port}",
         "--handlers", "handlers:registry", "--queue", "images"],
        cwd=ROOT / "examples", log=tmp_path / "server.log",
    )  # fmt: skip
    try:
        await wait_healthy(url)
        auth = {"Authorization": "Bearer dev"}
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            body = {
                "kind": "resize-image",
                "payload": {"src": "cat.png", "width": 64, "secs": 0},
                "config": {"queue": "images"},
            }
            job = (await client.post("/api/v1/jobs", json=body, headers=auth)).json()
            bad = {"kind": "resize-image", "payload": {"src": "cat.txt"}, "config": {"queue": "images"}}
            bad_job = (await client.post("/api/v1/jobs", json=bad, headers=auth)).json()
            with trio.fail_after(15):
                while True:
                    done = [(await client.get(f"/api/v1/jobs/{j['id']}", headers=auth)).json() for j in (job, bad_job)]
                    if all(d["status"] in ("completed", "failed") for d in done):
                        break
                    await trio.sleep(0.05)
        assert done[0]["status"] == "completed" and done[0]["result"]["width"] == 64
        assert done[1]["status"] == "failed" and done[1]["attempt"] == 1  # PermanentError: no retry
    finally:
        assert stop(server) == 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nope"], "--nope"),
        ([], "a command is required"),
        (["serve", "--dev", "--bind", "127.0.0.1:99999"], "out of range"),
        (["serve", "--worker-token", "t", "--tenant", "acme=t"], "same token as the worker token"),
        (["serve", "--worker-token", "w", "--tenant", "a=t", "--tenant", "b=t"], "same token as tenant 'a'"),
        (["serve", "--worker-token", "w", "--tenant", "a=t", "--tenant", "a=u"], "given twice"),
        (["serve", "--dev", "--mode", "api", "--handlers", "handlers:registry"], "--mode api"),
        (["serve", "--dev", "--queue", "images"], "pass --handlers"),
        (["serve", "--dev", "--lanes", "3"], "pass --handlers"),
        (["serve", "--dev", "--db", "q.db", "--database-url", "postgresql://h/db"], "--db"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(argv: list[str], says: str, tmp_path) -> None:
    proc = run_process(*argv)
    assert proc.returncode == 2
    assert says in one_line_error(proc)


def test_version() -> None:
    from qftrio import __version__

    proc = run_process("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"qftrio {__version__}"


async def test_a_second_server_on_one_sqlite_file_is_refused(tmp_path) -> None:
    from .processes import free_port, spawn, stop, wait_healthy

    db = str(tmp_path / "q.db")
    port = free_port()
    first = spawn(["serve", "--dev", "--db", db, "--bind", f"127.0.0.1:{port}"], cwd=ROOT, log=tmp_path / "first.log")
    try:
        await wait_healthy(f"http://127.0.0.1:{port}")
        proc = await trio.to_thread.run_sync(
            lambda: run_process("serve", "--dev", "--db", db, "--bind", f"127.0.0.1:{free_port()}")
        )
        assert proc.returncode == 2
        assert "in use by another qftrio server" in proc.stderr.strip().splitlines()[-1]
        assert "Traceback" not in proc.stderr
    finally:
        assert stop(first) == 0
    # once the first has stopped, the file is free again
    second = spawn(["serve", "--dev", "--db", db, "--bind", f"127.0.0.1:{port}"], cwd=ROOT, log=tmp_path / "second.log")
    try:
        await wait_healthy(f"http://127.0.0.1:{port}")
    finally:
        assert stop(second) == 0


async def test_stats_watch_rides_out_a_server_restart(tmp_path) -> None:
    from .processes import free_port, spawn, stop, wait_healthy

    db = str(tmp_path / "q.db")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out_path, err_path = tmp_path / "watch.out", tmp_path / "watch.err"

    def start() -> Any:
        return spawn(["serve", "--dev", "--db", db, "--bind", f"127.0.0.1:{port}"], cwd=ROOT, log=tmp_path / "s.log")

    async def wait_until(predicate: Any) -> None:
        with trio.fail_after(20):
            while not predicate():
                assert watch.poll() is None, err_path.read_text()
                await trio.sleep(0.05)

    def lines() -> list[str]:
        return out_path.read_text().splitlines()

    server = start()
    await wait_healthy(url)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        watch = subprocess.Popen(
            [sys.executable, "-m", "qftrio", "stats", "images", "--watch", "--interval", "0.1", "--url", url,
             "--token", "dev"],
            stdout=out, stderr=err, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    try:
        await wait_until(lambda: len(lines()) >= 2)
        assert stop(server) == 0
        await wait_until(lambda: "retrying" in err_path.read_text())
        seen = len(lines())
        server = start()
        await wait_until(lambda: len(lines()) >= seen + 2)
    finally:
        watch.terminate()
        watch.wait(10)
        stop(server)
    assert all(json.loads(line)["queue"] == "images" for line in lines())
    assert "Traceback" not in err_path.read_text()
