"""The command line: JSON out, and every failure one line with a non-zero exit."""

from __future__ import annotations

import functools
import io
import json
import socket
import subprocess
import sys
from collections.abc import Callable
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
    # refused by the client before anything is sent: said plainly, and no 422 from a server
    assert await run_cli("enqueue", "bad kind", *opts) == 2
    assert capsys.readouterr().err == "qftrio: invalid argument: kind: must be 1-128 characters of A-Z a-z 0-9 _ . - (no spaces)\n"
    assert await run_cli("enqueue", "k", "--queue", "a/b", *opts) == 2
    err = capsys.readouterr().err
    assert err.startswith("qftrio: invalid argument: queue: must be") and "422" not in err and "String should" not in err
    for argv, says in (
        (["--scheduled-at", "soon"], "scheduled_at: must be an RFC 3339 time"),
        (["--delay-secs", "1", "--scheduled-at", "2030-01-01T00:00:00Z"], "give delay_secs or scheduled_at, not both"),
        (["--timeout-secs", str(8 * 86400)], "timeout_secs: must be at most 604800"),
    ):
        assert await run_cli("enqueue", "k", *argv, *opts) == 2
        assert capsys.readouterr().err.startswith(f"qftrio: invalid argument: {says}")
    assert await run_cli("jobs", "list", "--url", server.url, "--token", "wrong") == 1
    assert "401" in capsys.readouterr().err
    assert await run_cli("enqueue", "k", "--timeout-secs", "30", *opts) == 0
    assert json.loads(capsys.readouterr().out)["timeout_secs"] == 30
    with pytest.raises(SystemExit) as exited:
        await run_cli("enqueue", "k", "--timeout-secs", "0", *opts)
    assert exited.value.code == 2 and "--timeout-secs: must be at least 1" in capsys.readouterr().err


async def test_options_and_positionals_in_any_order(server, capsys: pytest.CaptureFixture[str]) -> None:
    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    for argv in (
        ["enqueue", "resize-image", "--queue", "images", '{"url": "b.png"}', *opts],
        ["enqueue", "--queue", "images", *opts, "resize-image", '{"url": "b.png"}'],
        ["enqueue", "--queue", "images", "resize-image", *opts, '{"url": "b.png"}'],
    ):
        assert await run_cli(*argv) == 0, argv
        job = json.loads(capsys.readouterr().out)
        assert (job["kind"], job["queue"], job["payload"]) == ("resize-image", "images", {"url": "b.png"}), argv
    assert await run_cli("jobs", "list", *opts, "--queue", "images") == 0
    assert len(json.loads(capsys.readouterr().out)["jobs"]) == 3
    assert await run_cli("stats", *opts, "images") == 0
    assert json.loads(capsys.readouterr().out)["queue"] == "images"
    # still one positional too many is refused, naming it
    with pytest.raises(SystemExit) as exited:
        await run_cli("enqueue", "k", "--queue", "q", "{}", "{}", *opts)
    assert exited.value.code == 2 and "unrecognized arguments: {}" in capsys.readouterr().err


async def test_a_queue_that_holds_no_jobs_is_said_on_stderr(server, capsys: pytest.CaptureFixture[str]) -> None:
    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    assert await run_cli("stats", "mial", *opts) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["counts"]["pending"] == 0
    assert shown.err == (
        "qftrio: queue 'mial' holds no jobs (`qftrio queues` lists those that do); its figures are all zero\n"
    )
    assert await run_cli("queues", "pause", "mial", *opts) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["paused"] is True
    assert "queue 'mial' holds no jobs" in shown.err and "paused all the same" in shown.err
    assert await run_cli("enqueue", "k", "--queue", "mail", *opts) == 0
    capsys.readouterr()
    for argv in (["stats", "mail"], ["queues", "pause", "mail"], ["queues", "resume", "mail"]):
        assert await run_cli(*argv, *opts) == 0
        assert capsys.readouterr().err == "", argv


async def test_enqueue_reads_the_payload_from_a_file_or_stdin(
    server, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    big = {"blob": "x" * 200_000}  # more than a command line holds
    (tmp_path / "payload.json").write_text(json.dumps(big))
    assert await run_cli("enqueue", "k", f"@{tmp_path / 'payload.json'}", *opts) == 0
    assert json.loads(capsys.readouterr().out)["payload"] == big
    monkeypatch.setattr("sys.stdin", io.StringIO('{"from": "stdin"}'))
    assert await run_cli("enqueue", "k", "-", *opts) == 0
    assert json.loads(capsys.readouterr().out)["payload"] == {"from": "stdin"}
    for arg, says in ((f"@{tmp_path / 'missing.json'}", "cannot read"), ("@" + str(tmp_path), "cannot read")):
        assert await run_cli("enqueue", "k", arg, *opts) == 2
        assert says in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("[1]"))
    assert await run_cli("enqueue", "k", "-", *opts) == 2
    assert "the payload on stdin must be a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)  # the variables are the command's, whatever the store
async def test_qftrio_variables_are_read_first_and_the_old_ones_still_honoured(server) -> None:
    token = server.tenants["acme"]
    for env, code in (
        ({"QFTRIO_URL": server.url, "QFTRIO_TOKEN": token}, 0),
        ({"QUEUEFLOW_URL": server.url, "QUEUEFLOW_TOKEN": token}, 0),
        ({"QFTRIO_URL": server.url, "QFTRIO_TOKEN": "wrong", "QUEUEFLOW_TOKEN": token}, 1),
    ):
        proc = await trio.to_thread.run_sync(lambda env=env: run_process("jobs", "list", env=env))
        assert proc.returncode == code, (env, proc.stderr)
        if code:
            assert "401" in one_line_error(proc)


def test_the_server_reads_qftrio_variables_first() -> None:
    from qftrio.server.config import Config

    config = Config.from_env({
        "QFTRIO_WORKER_TOKEN": "new", "QUEUEFLOW_WORKER_TOKEN": "old", "QUEUEFLOW_TENANTS": "acme=t",
        "QFTRIO_DATABASE_URL": "postgresql://h/db", "QFTRIO_DEV": "1",
    })  # fmt: skip
    assert (config.worker_token, config.tenants, config.database_url, config.dev) == ("new", {"acme": "t"}, "postgresql://h/db", True)
    assert Config.from_env({"QFTRIO_DEV": "0", "QUEUEFLOW_DEV": "1"}).dev is False


def test_help_names_the_qftrio_variables() -> None:
    for argv in (["serve", "--help"], ["worker", "--help"], ["jobs", "list", "--help"], ["migrate", "--help"]):
        out = run_process(*argv).stdout
        assert "QFTRIO_" in out and "QUEUEFLOW" not in out, argv


async def test_operations_commands_answer_json_when_piped(server, capsys: pytest.CaptureFixture[str]) -> None:
    import httpx

    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    for kind in ("x", "x", "y"):
        assert await run_cli("enqueue", kind, "--queue", "ops", *opts) == 0
    capsys.readouterr()
    assert await run_cli("queues", "pause", "ops", *opts) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is True
    assert await run_cli("queues", *opts) == 0
    (listed,) = json.loads(capsys.readouterr().out)["queues"]
    assert (listed["queue"], listed["paused"], listed["counts"]["pending"]) == ("ops", True, 3)
    assert await run_cli("queues", "--url", server.url, "resume", "ops", "--token", server.tenants["acme"]) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is False

    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        r = await http.post("/api/v1/queues/ops/lease", json={"worker_id": "w-cli"}, headers=server.headers("worker"))
        assert len(r.json()["jobs"]) == 1
    assert await run_cli("workers", *opts) == 0
    assert [(w["worker_id"], w["jobs"], w["queues"]) for w in json.loads(capsys.readouterr().out)["workers"]] == [
        ("w-cli", 1, ["ops"])
    ]
    assert await run_cli("jobs", "cancel", "--queue", "ops", "--kind", "x", *opts) == 0
    assert json.loads(capsys.readouterr().out) == {"count": 2}
    assert await run_cli("jobs", "retry", "--status", "cancelled", "--limit", "1", *opts) == 0
    assert json.loads(capsys.readouterr().out) == {"count": 1}
    assert await run_cli("jobs", "delete", "--queue", "ops", "--status", "cancelled", *opts) == 0
    assert json.loads(capsys.readouterr().out) == {"count": 1}
    assert await run_cli("stats", *opts) == 0
    (stats,) = json.loads(capsys.readouterr().out)["queues"]
    assert stats["counts"] == {"pending": 2, "running": 0, "completed": 0, "failed": 0, "cancelled": 0, "scheduled": 0}
    assert await run_cli("jobs", "retry", "--all", *opts) == 0  # no failed or cancelled job left
    assert json.loads(capsys.readouterr().out) == {"count": 0}

    # refusals: one line each, 1 for the server's answer, 2 for usage; nothing changed
    assert await run_cli("jobs", "retry", "--status", "pending", *opts) == 1
    assert "422" in capsys.readouterr().err
    for argv, says in (
        (["jobs", "delete"], "at least one filter"),
        (["jobs", "cancel"], "a job id or at least one filter"),
        (["jobs", "retry", "some-id", "--queue", "ops"], "not both"),
        (["jobs", "cancel", "some-id", "--all"], "not both"),
    ):
        assert await run_cli(*argv, *opts) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
    assert await run_cli("queues", "pause", "bad name", *opts) == 1
    assert "queue" in capsys.readouterr().err
    assert await run_cli("stats", "ops", *opts) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["pending"] == 2


def on_a_terminal(*argv: str, until: str, count: int = 1, at_first: Callable[[], object] | None = None) -> str:
    """The output of ``qftrio *argv`` run on a pseudo-terminal, once *until*
    has appeared *count* times (the command is then stopped); *at_first* is
    called once it has appeared the first time."""
    import os
    import pty
    import time

    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "qftrio", *argv], stdin=child_fd, stdout=child_fd, stderr=subprocess.PIPE, cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TERM": "dumb"},
    )  # fmt: skip
    os.close(child_fd)
    out = ""
    deadline = time.monotonic() + 20
    try:
        while out.count(until) < count and time.monotonic() < deadline:
            try:
                out += os.read(main_fd, 65536).decode(errors="replace")
            except OSError:  # the command ended and closed the terminal
                break
            if at_first is not None and until in out:
                at_first()
                at_first = None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        os.close(main_fd)
    assert b"Traceback" not in err, err
    return out.replace("\r\n", "\n")


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)  # the table is the command's, whatever the store
async def test_stats_and_queues_list_every_page_of_queues(server, capsys: pytest.CaptureFixture[str]) -> None:
    import httpx

    from qftrio.models import MAX_QUEUES_PAGE

    names = [f"q{i:04d}" for i in range(MAX_QUEUES_PAGE + 1)]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for start in range(0, len(names), 1000):
            body = {"jobs": [{"kind": "x", "config": {"queue": q}} for q in names[start : start + 1000]]}
            assert (await http.post("/api/v1/jobs/batch", json=body, headers=server.headers())).status_code == 201
    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    for command in ("stats", "queues"):
        assert await run_cli(command, *opts) == 0
        assert [q["queue"] for q in json.loads(capsys.readouterr().out)["queues"]] == names


async def test_listings_are_tables_on_a_terminal(server) -> None:
    import httpx

    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        body = {"jobs": [{"kind": "x", "config": {"queue": q}} for q in ("images", "images", "mail")]}
        assert (await http.post("/api/v1/jobs/batch", json=body, headers=server.headers())).status_code == 201
        await http.post("/api/v1/queues/mail/pause", headers=server.headers())
        r = await http.post("/api/v1/queues/images/lease", json={"worker_id": "w-term"}, headers=server.headers("worker"))
        (held,) = r.json()["jobs"]

    table = await trio.to_thread.run_sync(lambda: on_a_terminal("queues", *opts, until="mail"))
    header, images, mail = table.strip().splitlines()
    assert header.split()[:6] == ["QUEUE", "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"]
    assert images.split()[:6] == ["images", "1", "1", "0", "0", "0"] and not images.endswith("paused")
    assert mail.split()[:3] == ["mail", "1", "0"] and mail.endswith("paused")
    table = await trio.to_thread.run_sync(lambda: on_a_terminal("workers", *opts, until="ago"))
    assert table.strip().splitlines()[1].split()[:3] == ["w-term", "1", "images"]

    # a live table of every queue: completions per second from successive polls
    def complete() -> None:
        done = {"lease_token": held["lease_token"]}
        r = httpx.post(f"{server.url}/api/v1/jobs/{held['job']['id']}/complete", json=done, headers=server.headers("worker"))
        assert r.status_code == 204

    live = await trio.to_thread.run_sync(
        lambda: on_a_terminal("stats", "--watch", "--interval", "0.2", *opts, until="DONE/S", count=6, at_first=complete)
    )
    # the last frame may be cut short where reading stopped
    frames = [frame for frame in live.split("\x1b[H\x1b[J") if frame.strip()][:-1]
    assert len(frames) >= 5 and all("images" in frame and "mail" in frame for frame in frames)
    rates = [float(line.split()[-1]) for frame in frames[1:] for line in frame.splitlines() if line.startswith("images")]
    assert any(rate > 0 for rate in rates), live
    assert frames[0].splitlines()[-2].split()[-1] == "-"  # no rate before a second poll


def test_serve_refuses_to_start_without_credentials(tmp_path) -> None:
    proc = run_process("serve", "--db", str(tmp_path / "q.db"), "--bind", "127.0.0.1:0")
    assert proc.returncode == 2
    assert "worker token" in one_line_error(proc)
    proc = run_process("serve", "--db", str(tmp_path / "q.db"), "--bind", "127.0.0.1:0", "--worker-token", "worker-token-0123456789")
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
    assert not (tmp_path / "q.db").exists()  # the failed start leaves no database behind


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
        ["queues", "freeze", "images"],
        ["jobs", "delete", "some-id"],
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
                 ["workflows", "--help"], ["stats", "--help"], ["migrate", "--help"],
                 ["queues", "pause", "--help"], ["jobs", "delete", "--help"], ["workers", "--help"]):  # fmt: skip
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
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        body = {"kind": "x", "config": {"queue": "images"}}
        assert (await http.post("/api/v1/jobs", json=body, headers={"Authorization": "Bearer dev"})).status_code == 201
    with open(out_path, "w") as out, open(err_path, "w") as err:
        watch = subprocess.Popen(
            [sys.executable, "-m", "qftrio", "stats", "--watch", "--interval", "0.1", "--url", url, "--token", "dev"],
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
    polls = [json.loads(line)["queues"] for line in lines()]
    assert all([q["queue"] for q in queues] == ["images"] for queues in polls)
    assert polls[0][0]["completed_per_sec"] is None and polls[-1][0]["completed_per_sec"] == 0
    assert "Traceback" not in err_path.read_text()


async def test_a_server_that_is_not_qftrio_is_one_line(tmp_path) -> None:
    """Another HTTP server at the URL: its pages are never printed, and an
    answer of the wrong shape is named, not an unexpected KeyError."""
    import http.server
    import threading

    class NotQftrio(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"{}" if self.path.startswith("/api/v1/jobs") else b"<html><body><h1>Welcome</h1></body></html>"
            kind = "application/json" if body == b"{}" else "text/html"
            self.send_response(200 if body == b"{}" else 404)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotQftrio)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        for argv, says in ((["stats", "q"], "not qftrio's (text/html)"), (["jobs", "list"], "not qftrio's (KeyError")):
            proc = await trio.to_thread.run_sync(lambda argv=argv: run_process(*argv, "--url", url, "--token", "t"))
            assert proc.returncode == 1
            line = one_line_error(proc)
            assert says in line and "<html" not in line
    finally:
        httpd.shutdown()
        httpd.server_close()
