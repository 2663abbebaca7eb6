"""No caller can exhaust or break the server, over real HTTP: metric labels
bounded, /metrics behind its token, connections capped per client address,
wrong credentials throttled per address, and crafted input answered 4xx."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from qftrio.server.engine import Engine
from qftrio.server.serve import run_server
from qftrio.server.store.base import Store

from .conftest import server_config
from .test_cli import one_line_error, run_process
from .test_http11 import RawConnection, assert_json_error, ok_app, request, serve_app

ACME = "acme-secret"  # conftest's tenant
WRONG = {"Authorization": "Bearer not-a-token-of-anyone"}
#: A cursor holding a lone surrogate: ``[1, "\ud800"]``.
SURROGATE_CURSOR = "WzEsICJcdWQ4MDAiXQ"


async def start(storage: Store, nursery: trio.Nursery, *, engine: Engine | None = None, **overrides: Any) -> str:
    """A real server on *storage* (through *engine*, if given) with
    *overrides* of the test settings; its URL."""
    stop = trio.Event()
    config = server_config(**overrides)
    engine = engine or Engine(storage)
    binds = await nursery.start(functools.partial(run_server, engine, config, shutdown_trigger=stop.wait))
    return binds[0]


@pytest.fixture
async def http(storage: Store, nursery: trio.Nursery) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=await start(storage, nursery), timeout=30) as client:
        yield client


def acme() -> dict[str, str]:
    return {"Authorization": f"Bearer {ACME}"}


def series_of(text: str, queue: str) -> list[str]:
    return [line for line in text.splitlines() if f'queue="{queue}"' in line]


# -- metrics -------------------------------------------------------------------


async def test_metrics_stay_under_1_mb_with_20000_queue_and_kind_names(http) -> None:
    for batch in range(20):
        jobs = [{"kind": f"k{n}", "config": {"queue": f"q{n}"}} for n in range(batch * 1000, (batch + 1) * 1000)]
        r = await http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=acme())
        assert r.status_code == 201, r.text
    # 20,000 queues' statistics: seconds on a busy machine, not a hang
    r = await http.get("/metrics", timeout=300)
    assert r.status_code == 200, r.text
    assert len(r.content) < 1_000_000, len(r.content)
    queues = set(re.findall(r'qftrio_jobs_enqueued_total\{kind="[^"]*",queue="([^"]*)"', r.text))
    assert len(queues) == 51 and "other" in queues  # the default 50, and the rest
    assert 'qftrio_queue_jobs{queue="other",status="pending",tenant="acme"} 19950.0' in r.text


async def test_series_of_a_queue_that_no_longer_exists_are_dropped(storage, nursery) -> None:
    async with httpx.AsyncClient(base_url=await start(storage, nursery, metrics_queues=1), timeout=30) as http:
        for queue in ("gone", "later"):
            r = await http.post("/api/v1/jobs", json={"kind": "k", "config": {"queue": queue}}, headers=acme())
            assert r.status_code == 201
        text = (await http.get("/metrics")).text
        assert series_of(text, "gone") and not series_of(text, "later")  # "later" came past the limit
        for action, body in (("cancel", {"queue": "gone"}), ("delete", {"queue": "gone", "status": "cancelled"})):
            r = await http.post(f"/api/v1/jobs/bulk/{action}", json=body, headers=acme())
            assert r.status_code == 200 and r.json()["count"] == 1, r.text
        text = (await http.get("/metrics")).text
        assert not series_of(text, "gone")
        assert series_of(text, "later")  # which took the place "gone" left


async def test_metrics_token_is_asked_for_when_set(storage, nursery) -> None:
    token = "metrics-token-0123456789"
    async with httpx.AsyncClient(base_url=await start(storage, nursery, metrics_token=token)) as http:
        for headers in ({}, WRONG, acme()):
            r = await http.get("/metrics", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text
            assert "qftrio_" not in r.text
        r = await http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and "qftrio_jobs_enqueued" in r.text


async def test_concurrent_scrapes_share_a_reading_of_the_store(storage, nursery) -> None:
    engine = Engine(storage)
    async with httpx.AsyncClient(base_url=await start(storage, nursery, engine=engine), timeout=30) as http:
        answers: list[httpx.Response] = []

        async def scrape() -> None:
            answers.append(await http.get("/metrics"))

        async with trio.open_nursery() as scrapers:
            for _ in range(12):
                scrapers.start_soon(scrape)
    assert [r.status_code for r in answers] == [200] * 12
    # each reading of the store is one round of the gauges: scrapes that
    # came while one ran shared the next (one each without the sharing)
    assert engine.metrics.rounds < 12


@pytest.mark.parametrize("storage", ["postgres"], indirect=True)
async def test_metrics_are_a_503_when_the_store_is_unavailable(storage, nursery) -> None:
    async with httpx.AsyncClient(base_url=await start(storage, nursery)) as http:
        await storage._db.aclose()  # type: ignore[attr-defined]  # the pool is gone: every call is refused
        for path, headers in (("/api/v1/queues", acme()), ("/metrics", {})):
            r = await http.get(path, headers=headers)
            assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable", (path, r.text)


# -- wrong credentials -------------------------------------------------------------


async def test_wrong_credentials_are_logged_and_throttled_per_address(http, caplog, mock_clock) -> None:
    caplog.set_level(logging.WARNING, "qftrio.server.auth")
    for _ in range(20):  # the burst
        r = await http.get("/api/v1/jobs", headers=WRONG)
        assert r.status_code == 401
    r = await http.get("/api/v1/jobs", headers=WRONG)
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_requests"
    assert r.headers["Retry-After"] == "3"
    # a throttled address is not heard, even with a good token
    assert (await http.get("/api/v1/jobs", headers=acme())).status_code == 429
    r = await http.post("/api/v1/jobs", json={"kind": "k"}, headers=acme())  # a hot route alike
    assert r.status_code == 429 and r.headers["Retry-After"] == "3"
    mock_clock.jump(3)  # Trio's clock, the throttle's, moves only here
    assert (await http.get("/api/v1/jobs", headers=acme())).status_code == 200
    logged = [record.getMessage() for record in caplog.records if record.name == "qftrio.server.auth"]
    assert logged[0] == "unknown credential from 127.0.0.1 on GET /api/v1/jobs"
    assert len(logged) == 20  # once each, and nothing while throttled
    assert not any("not-a-token" in message or ACME in message for message in caplog.messages)


async def test_the_sign_in_form_is_throttled_with_a_form_page(http, mock_clock) -> None:
    for _ in range(20):
        r = await http.post("/dashboard/signin", data={"token": "not-a-token-of-anyone"})
        assert r.status_code == 401
    r = await http.post("/dashboard/signin", data={"token": ACME})
    assert r.status_code == 429 and r.headers["Retry-After"] == "3"
    assert r.headers["content-type"].startswith("text/html")
    assert "too many wrong credentials" in r.text and "<form" in r.text
    mock_clock.jump(3)  # Trio's clock, the throttle's, moves only here
    r = await http.post("/dashboard/signin", data={"token": ACME})
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/"


async def test_behind_a_trusted_proxy_the_forwarded_address_is_throttled(storage, nursery) -> None:
    url = await start(storage, nursery, trusted_proxies=("127.0.0.0/8",))
    async with httpx.AsyncClient(base_url=url) as http:
        for _ in range(21):
            r = await http.get("/api/v1/jobs", headers={**WRONG, "X-Forwarded-For": "198.51.100.1, 203.0.113.7"})
        assert r.status_code == 429
        r = await http.get("/api/v1/jobs", headers={**acme(), "X-Forwarded-For": "203.0.113.8"})
        assert r.status_code == 200  # another client of the same proxy
        r = await http.get("/api/v1/jobs", headers={**acme(), "X-Forwarded-For": "10.9.9.9, 203.0.113.7"})
        assert r.status_code == 429  # what the client itself wrote is not believed


async def test_forwarded_addresses_are_ignored_from_anyone_but_a_trusted_proxy(http) -> None:
    for n in range(21):
        r = await http.get("/api/v1/jobs", headers={**WRONG, "X-Forwarded-For": f"203.0.113.{n}"})
    assert r.status_code == 429


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--trusted-proxy", "the-proxy"], "--trusted-proxy"),
        (["--max-connections-per-address", "0"], "--max-connections-per-address"),
        (["--metrics-queues", "0"], "--metrics-queues"),
        (["--failed-credentials-refill-secs", "0"], "--failed-credentials-refill-secs"),
    ],
)
def test_limits_that_cannot_work_are_refused_by_name(argv: list[str], says: str) -> None:
    proc = run_process("serve", "--dev", *argv)
    assert proc.returncode == 2
    assert says in one_line_error(proc)


def test_tokens_shorter_than_16_characters_are_refused_at_start(tmp_path) -> None:
    good = "worker-token-0123456789"
    for argv, says in [
        (["--worker-token", "short", "--tenant", "acme=tenant-token-0123456789"], "the worker token"),
        (["--worker-token", good, "--tenant", "acme=x"], "tenant 'acme'"),
        (["--worker-token", good, "--tenant", "acme=tenant-token-0123456789", "--metrics-token", "m"], "metrics"),
    ]:
        proc = run_process("serve", "--db", str(tmp_path / "q.db"), "--bind", "127.0.0.1:0", *argv)
        assert proc.returncode == 2
        assert says in one_line_error(proc) and "16 characters" in one_line_error(proc)
    assert not (tmp_path / "q.db").exists()


# -- connections per address ------------------------------------------------------


async def connect_from(source: str, url: str) -> RawConnection:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect((host, int(port)))
    return RawConnection(trio.SocketStream(sock))


async def test_one_address_with_300_unfinished_heads_cannot_deny_another(nursery) -> None:
    # Without a cap per address, these 300 fill the server (none is idle, so
    # none can be closed to make room) and the other address gets 503.
    url = await serve_app(nursery, ok_app, max_connections=300)
    with trio.fail_after(60):  # a bound on the work, far above what it takes
        hostile = []
        for _ in range(300):
            conn = await connect_from("127.0.0.1", url)
            await conn.send(b"GET / HTTP/1.1\r\nHost: qftrio.test\r\n")
            hostile.append(conn)
        other = await connect_from("127.0.0.2", url)
        await other.send(request("GET", "/"))
        assert (await other.read_response()).status == 200
        # past its 256, the first address was answered 503 (a few at a time;
        # the rest closed at once), and its connections closed
        refused = await hostile[256].read_response()
        assert_json_error(refused, 503)
        assert "this address" in refused.json()["error"]["message"]
        for conn in hostile[256:]:
            while await conn._fill():
                pass
        for conn in hostile:
            await conn.stream.aclose()
        await other.stream.aclose()


async def test_at_its_cap_an_address_idle_connection_makes_room(nursery, autojump_clock) -> None:
    url = await serve_app(nursery, ok_app, max_connections_per_address=2)
    with trio.fail_after(10):
        first, second = [await connect_from("127.0.0.1", url) for _ in range(2)]
        for conn in (first, second):
            await conn.send(request("GET", "/"))
            assert (await conn.read_response()).status == 200
        third = await connect_from("127.0.0.1", url)
        await third.send(request("GET", "/"))
        assert (await third.read_response()).status == 200
        await first.expect_closed()  # the address's longest idle one
        for conn in (first, second, third):
            await conn.stream.aclose()


# -- crafted input -----------------------------------------------------------------


async def test_a_cursor_holding_a_lone_surrogate_is_a_422(http) -> None:
    for path in ("/api/v1/jobs", "/api/v1/workflows"):
        r = await http.get(path, params={"cursor": SURROGATE_CURSOR}, headers=acme())
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_cursor", (path, r.text)
    assert (await http.post("/dashboard/signin", data={"token": ACME})).status_code == 303  # the client keeps the cookie
    r = await http.get("/dashboard/jobs", params={"cursor": SURROGATE_CURSOR})
    assert r.status_code == 422 and "cursor" in r.text


async def test_a_line_break_in_the_sign_in_next_is_not_a_header(http) -> None:
    r = await http.post("/dashboard/signin", data={"token": ACME, "next": "/dashboard/jobs\r\nSet-Cookie: evil=1"})
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/"
    assert "evil" not in r.headers.get("set-cookie", "")


@pytest.mark.parametrize("path", ["/dashboard/jobs//x", "/dashboard", "//dashboard/"])
async def test_no_redirect_is_built_from_the_host_header(http, path: str) -> None:
    r = await http.get(path, headers={"Host": "evil.example"})
    location = r.headers.get("location", "")
    assert "evil.example" not in location and not location.startswith("//"), (r.status_code, location)
