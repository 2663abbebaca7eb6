"""``qftrio schedules ...`` and ``qftrio serve --schedules FILE.toml``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio

from qftrio import Client, errors
from qftrio.server.config import Config
from qftrio.server.serve import serve

from .conftest import RunningServer
from .processes import ROOT
from .test_cli import one_line_error, run_cli, run_process


async def test_the_schedules_commands(server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    argv = ["schedules", "set", "nightly", "30 2 * * *", "report", '{"a": 1}', "--timezone", "Europe/Paris", "--queue", "cron"]
    assert await run_cli(*argv, *opts) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["name"], shown["timezone"], shown["job"]["payload"], shown["job"]["config"]["queue"]) == (
        "nightly", "Europe/Paris", {"a": 1}, "cron",
    )  # fmt: skip
    assert await run_cli("schedules", "list", *opts) == 0
    assert [s["name"] for s in json.loads(capsys.readouterr().out)["schedules"]] == ["nightly"]
    assert await run_cli("schedules", "pause", "nightly", *opts) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is True
    assert await run_cli("schedules", "resume", "nightly", *opts) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is False
    assert await run_cli("schedules", "trigger", "nightly", *opts) == 0
    assert json.loads(capsys.readouterr().out)["job"]["schedule"] == "nightly"
    assert await run_cli("schedules", "get", "nightly", *opts) == 0
    assert json.loads(capsys.readouterr().out)["last_job_id"] is not None
    assert await run_cli("schedules", "delete", "nightly", *opts) == 0
    capsys.readouterr()
    assert await run_cli("schedules", "get", "nightly", *opts) == 1
    assert "404" in capsys.readouterr().err
    # options and positionals in any order
    assert await run_cli("schedules", "set", "hourly", "0 * * * *", "report", "--queue", "cron", '{"b": 2}', *opts) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["job"]["kind"], shown["job"]["payload"], shown["job"]["config"]["queue"]) == ("report", {"b": 2}, "cron")
    assert await run_cli("schedules", "set", "x", "61 * * * *", "k", *opts) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cron" in err


GOOD = """
[schedules.nightly]
cron = "30 2 * * *"
timezone = "Europe/Paris"
job = { kind = "report", config = { queue = "cron" } }

[schedules.every-minute]
tenant = "acme"
cron = "* * * * *"
catch_up = "none"
job = { kind = "ping" }
"""


async def test_serve_applies_the_schedules_file_at_start(tmp_path: Path, nursery: trio.Nursery) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(GOOD)
    config = Config(
        bind="127.0.0.1:0", sqlite_path=str(tmp_path / "q.db"), worker_token="w" * 16, tenants={"acme": "a" * 16},
        schedules_file=str(path),
    )  # fmt: skip
    config.validate()
    assert [(t, n) for t, n, _ in config.schedules] == [("acme", "nightly"), ("acme", "every-minute")]
    stop = trio.Event()
    (url,) = await nursery.start(lambda task_status: serve(config, shutdown_trigger=stop.wait, task_status=task_status))
    async with Client(url, "a" * 16, timeout=5) as client:
        found, _ = await client.schedules_list()
        assert {s.name: s.catch_up for s in found} == {"every-minute": "none", "nightly": "latest"}
    stop.set()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[schedules.x]\ncron = "61 * * * *"\njob = { kind = "k" }\n', "schedules.x.cron: "),
        ('[schedules.x]\ncron = "* * * * *"\ntimezone = "Nowhere/Land"\njob = { kind = "k" }\n', "schedules.x.timezone: "),
        ('[schedules.x]\ncron = "* * * * *"\ncatch_up = "twice"\njob = { kind = "k" }\n', "schedules.x.catch_up: "),
        ('[schedules.x]\ncron = "* * * * *"\n', "schedules.x.job: "),
        ('[schedules.x]\ntenant = "other"\ncron = "* * * * *"\njob = { kind = "k" }\n', "schedules.x.tenant: "),
        ("not toml [", "is not TOML"),
    ],
)
def test_a_bad_schedules_file_is_one_line_and_a_non_zero_exit(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(errors.ConfigError, match=says.replace(".", r"\.")):
        Config(tenants={"acme": "a" * 16}, worker_token="w" * 16, schedules_file=str(path)).validate()
    proc = run_process(
        "serve", "--db", str(tmp_path / "q.db"), "--tenant", "acme=" + "a" * 16, "--worker-token", "w" * 16,
        "--schedules", str(path),
    )  # fmt: skip
    assert proc.returncode != 0 and says in one_line_error(proc)


def test_every_error_of_a_schedules_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        '[schedules.a]\ncorn = "* * * * *"\njob = { kind = "k", confg = {} }\n'
        '[schedules.b]\ncron = "* * * * *"\ntimezone = "Nowhere/Land"\njob = { kind = "k" }\n'
        '[schedules.c]\ntenant = "other"\ncron = "* * * * *"\njob = { kind = "k" }\n'
    )
    with pytest.raises(errors.ConfigError) as refused:
        Config(tenants={"acme": "a" * 16}, worker_token="w" * 16, schedules_file=str(path)).validate()
    said = str(refused.value)
    for part in (
        "schedules.a.cron: Field required", "schedules.a.corn: unknown key", "schedules.a.job.confg: unknown key",
        "schedules.b.timezone: ", "schedules.c.tenant: name one of the configured tenants (acme)",
    ):  # fmt: skip
        assert part in said, part
    proc = run_process(
        "serve", "--db", str(tmp_path / "q.db"), "--tenant", "acme=" + "a" * 16, "--worker-token", "w" * 16,
        "--schedules", str(path),
    )  # fmt: skip
    assert proc.returncode == 2 and "schedules.a.corn: unknown key" in one_line_error(proc)


def test_dev_refuses_a_schedule_of_a_tenant_it_does_not_serve(tmp_path: Path) -> None:
    # --dev with no credential serves the tenant "default" alone
    path = tmp_path / "s.toml"
    path.write_text('[schedules.x]\ntenant = "acme"\ncron = "* * * * *"\njob = { kind = "k" }\n')
    with pytest.raises(errors.ConfigError, match=r"schedules\.x\.tenant: name one of the configured tenants \(default\)"):
        Config(dev=True, schedules_file=str(path)).validate()
    proc = run_process("serve", "--dev", "--db", str(tmp_path / "q.db"), "--schedules", str(path))
    assert proc.returncode == 2 and "schedules.x.tenant" in one_line_error(proc)
    path.write_text('[schedules.x]\ncron = "* * * * *"\njob = { kind = "k" }\n')
    config = Config(dev=True, schedules_file=str(path))
    config.validate()
    assert [(t, n) for t, n, _ in config.schedules] == [("default", "x")]


def test_the_schedules_file_of_the_docs_starts_a_dev_server(tmp_path: Path) -> None:
    (example,) = re.findall(r"^```toml\n(.*?)^```", (ROOT / "docs/schedules.md").read_text(), re.S | re.M)
    path = tmp_path / "schedules.toml"
    path.write_text(example)
    config = Config(dev=True, schedules_file=str(path))
    config.validate()
    assert {t for t, _, _ in config.schedules} == {"default"} and len(config.schedules) == 2
