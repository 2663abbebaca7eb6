"""What ``qftrio serve`` says and leaves as it starts: the store it uses, no
database file after a failed start, a JSON 404 naming a wrong path, and a
hint for a database password that breaks its URL."""

from __future__ import annotations

import functools
import logging
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from qftrio import errors
from qftrio.cli import main
from qftrio.server.config import Config
from qftrio.server.serve import serve

from .conftest import RunningServer
from .pg import pg_url


async def start_and_stop(config: Config) -> None:
    """Serve *config* until it listens, then shut it down."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(serve, config, shutdown_trigger=stop.wait))
        stop.set()


def store_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "qftrio.server" and r.getMessage().startswith("store:")]


async def test_serve_logs_the_sqlite_files_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="qftrio.server"):
        await start_and_stop(Config(dev=True, sqlite_path="jobs.db", bind="127.0.0.1:0"))
    assert store_lines(caplog) == [f"store: the embedded SQLite file {tmp_path / 'jobs.db'}"]


@pytest.mark.skipif(pg_url() is None, reason="QFTRIO_TEST_DATABASE_URL is not set")
async def test_serve_logs_the_postgresql_host_and_database_without_the_password(caplog: pytest.LogCaptureFixture) -> None:
    import urllib.parse

    url = pg_url()
    assert url is not None
    parts = urllib.parse.urlsplit(url)
    with caplog.at_level(logging.INFO, logger="qftrio.server"):
        await start_and_stop(Config(dev=True, database_url=url, bind="127.0.0.1:0"))
    (line,) = store_lines(caplog)
    assert line.startswith(f"store: PostgreSQL at {parts.hostname}:{parts.port}, database '{parts.path.lstrip('/')}'")
    assert not parts.password or parts.password not in line


async def test_a_failed_start_leaves_no_database_file_it_created(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        bind = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(BaseExceptionGroup) as refused:
            await start_and_stop(Config(dev=True, sqlite_path=str(tmp_path / "new.db"), bind=bind))
        assert refused.group_contains(errors.ConfigError, match="cannot listen")
        assert os.listdir(tmp_path) == []
        # a file that was there before is the user's: it stays
        (tmp_path / "old.db").write_bytes(b"")
        with pytest.raises(BaseExceptionGroup):
            await start_and_stop(Config(dev=True, sqlite_path=str(tmp_path / "old.db"), bind=bind))
        assert (tmp_path / "old.db").exists()


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)  # the router's, whatever the store
async def test_a_wrong_path_answers_a_json_404_naming_it(server: RunningServer, http: httpx.AsyncClient) -> None:
    for method, path in (("GET", "/api/v1/jobz"), ("POST", "/api/v1/queues/a%2Fb/lease"), ("GET", "/nope?x=1")):
        r = await http.request(method, path, headers=server.headers())
        assert r.status_code == 404 and r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == "not_found"
        message = r.json()["error"]["message"]
        assert f"{method} {path.split('?')[0]}" in message and "spelling" not in message


@pytest.mark.parametrize(
    "url",
    ["postgresql://bob:p@ss@127.0.0.1:1/app", "postgresql://bob:p/ss@127.0.0.1:1/app", "postgresql://bob:p#ss@127.0.0.1:1/app"],
)
async def test_a_reserved_character_in_the_password_gets_a_hint(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["migrate", "--database-url", url], ["serve", "--dev", "--bind", "127.0.0.1:0", "--database-url", url]):
        code = await trio.to_thread.run_sync(functools.partial(main, argv))
        err: Any = capsys.readouterr().err.strip().splitlines()[-1]
        assert code == 2
        assert "percent-encode @ / ? # in the password (@ as %40" in err and "ss" not in err.replace("password", "")
