"""Enqueueing from SQL (``qftrio_enqueue``, ``qftrio_enqueue_batch``;
docs/sql-enqueue.md) against a real server on a real PostgreSQL.

The route checks a job in Python (pydantic), the function in plpgsql: one
table of cases goes through both, which must refuse the same jobs (naming
the same field) and store the same rows. The application's side is psycopg
(and asyncpg for the documented example), as an application would hold it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qftrio.client import Client
from qftrio.models import NAME_PATTERN, BackoffConfig, ConcurrencyConfig, EnqueueRequest, Job, JobConfig, UniqueConfig
from qftrio.worker import HttpTransport, Registry, open_worker

from .conftest import RunningServer, serve_store
from .pg import on_asyncio, open_test_postgres_store, pg_url
from .test_postgres_setup import database_with_data_role, migrate_as
from .test_postgres_setup import sql as sql_as

psycopg = pytest.importorskip("psycopg")
from psycopg.types.json import Jsonb  # noqa: E402

pytestmark = pytest.mark.postgres

T = TypeVar("T")

DOC = Path(__file__).resolve().parents[1] / "docs" / "sql-enqueue.md"

#: The HTTP side enqueues as acme, the SQL side as globex: each tenant's
#: idempotency and unique keys are its own, so that neither side finds the
#: other's jobs.
HTTP_TENANT, SQL_TENANT = "acme", "globex"

ENQUEUE = "SELECT id::text, created, job FROM qftrio_enqueue(%s, %s, %s, %s)"
BATCH = "SELECT id::text, created, job FROM qftrio_enqueue_batch(%s, %s)"


@pytest.fixture
async def pg_server(nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    """A real server on a fresh PostgreSQL store whose parked long polls
    only a NOTIFY wakes (their safety poll is out of reach)."""
    if pg_url() is None:
        pytest.skip("QFTRIO_TEST_DATABASE_URL is not set")
    async with open_test_postgres_store() as store:
        async for running in serve_store(store, nursery):
            running.engine.safety_poll_secs = 120
            yield running


@pytest.fixture
async def http(pg_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    # past the longest long poll of these tests (60 s)
    async with httpx.AsyncClient(base_url=pg_server.url, timeout=90) as client:
        yield client


class Sql:
    """The application's connection (psycopg, blocking), used from a
    thread so that the server, on this Trio loop, goes on answering."""

    def __init__(self, *, autocommit: bool = True) -> None:
        self.conn = psycopg.connect(pg_url() or "", autocommit=autocommit)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args)

    async def fetch(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        return await self.run(lambda: self.conn.execute(query, params).fetchall())

    async def execute(self, query: str, *params: Any) -> None:
        await self.run(lambda: self.conn.execute(query, params))

    async def enqueue(self, tenant: str, kind: str, payload: Any = None, config: Any = None) -> tuple[Any, ...]:
        """``qftrio_enqueue``'s row (*payload* and *config* left out: ``{}``)."""
        args = (tenant, kind, Jsonb({} if payload is None else payload), Jsonb({} if config is None else config))
        (row,) = await self.fetch(ENQUEUE, *args)
        return row

    async def jobs(self) -> int:
        ((n,),) = await self.fetch("SELECT count(*) FROM qftrio_jobs")
        return int(n)


@pytest.fixture
def sql(pg_server: RunningServer) -> Iterator[Sql]:
    conn = Sql()
    try:
        yield conn
    finally:
        conn.conn.close()


async def declare_rate_limit(http: httpx.AsyncClient, server: RunningServer, *tenants: str) -> None:
    for tenant in tenants:
        body = {"limit": 10, "per_secs": 60}
        r = await http.put("/api/v1/rate-limits/emails", json=body, headers=server.headers(tenant))
        assert r.status_code == 201, r.text


# -- one table of cases, through the route and through the function -------------

YEARS_10 = 10 * 365 * 86400

class Raw(str):
    """JSON text, sent as it is (numbers Python will not write)."""


def _text(value: Any) -> str:
    return value if isinstance(value, Raw) else json.dumps(value)


def _jsonb(value: Any) -> Any:
    return Jsonb(value, dumps=str) if isinstance(value, Raw) else Jsonb(value)


#: (kind, payload, config): good and bad jobs, each field at and past its edges.
CASES: list[tuple[str, Any, Any]] = [
    ("send", {}, {}),
    ("send", {"to": "a@example.com", "n": [1, 2.5, None, True, {"deep": "é"}]}, {}),
    ("send", [], {}),
    # numbers: as the route reads them (a double, or an integer of at most 4300 digits)
    ("send", {"big": 10**400, "double": 1.5e308, "tiny": 1e-300, "long": [0.1, 2.5e-7, -3.0]}, {}),
    ("send", Raw('{"deep": [{"n": 1%s}]}' % ("0" * 4299)), {}),
    ("send", Raw('{"deep": [{"n": 1%s}]}' % ("0" * 4300)), {}),
    ("send", Raw('{"deep": [{"n": 2%s.5}]}' % ("0" * 308)), {}),
    ("send", "text", {}),
    ("send", None, {}),
    ("", {}, {}),
    ("bad kind", {}, {}),
    ("k" * 128, {}, {}),
    ("k" * 129, {}, {}),
    ("send", {}, None),
    ("send", {}, []),
    ("send", {}, {"nope": 1}),
    *[("send", {}, {"queue": q}) for q in ["q-1.x_Y", "", "a" * 128, "a" * 129, "bad name", "line\n", 5, None]],
    *[
        ("send", {}, {"priority": p})
        for p in [0, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1, 3.0, 3.5, "3", True, None, 1e20]
    ],
    *[("send", {}, {"max_attempts": m}) for m in [1, 1000, 0, 1001, 2.0, None]],
    *[("send", {}, {"delay_secs": d}) for d in [0, 0.5, 7, YEARS_10, YEARS_10 + 1, -1, "1", True, None]],
    *[
        ("send", {}, {"scheduled_at": s})
        for s in [
            "2032-04-23T10:20:30Z", "2032-04-23T10:20:30.123456Z", "2032-04-23T10:20:30.1234567Z",
            "2032-04-23T10:20:30,5z", "2032-04-23t10:20:30+02:30", "2032-04-23T10:20:30-0230",
            "2032-04-23T10:20:30+23:59", "2032-04-23 10:20:30", "2032-04-23_10:20", "2032-04-23",
            "2032-04-23T10:20Z", "2032-04-23T24:00:00Z", "2032-04-23T10:60:00Z", "2032-04-23T10:20:60Z",
            "2032-02-30T00:00:00Z", "2031-02-29", "2032-02-29", "2032-04-23T10:20:30+02", "2032-04-23T10:20:30+24:00",
            "2032-04-23Z", "2032-04-23T10Z", "2032-4-23", " 2032-04-23", "2032-04-23T10:20:30.Z", "0000-01-01",
            "0001-01-01T00:00:00Z", "9998-12-31T23:59:59Z", "9999-01-01T00:00:00Z", "9998-12-31T23:59:59-02:00",
            "1700000000", "1700000000.5", "-1", "+5", "1.", "20000000000", "20000000001", "99999999999999",
            "1e9", "now", "", 1700000000, None,
        ]  # fmt: skip
    ],
    ("send", {}, {"delay_secs": 1, "scheduled_at": "2032-04-23T10:20:30Z"}),
    ("send", {}, {"delay_secs": None, "scheduled_at": "2032-04-23T10:20:30Z"}),
    *[("send", {}, {"idempotency_key": k}) for k in ["key-1", "", "x" * 255, "y" * 256, 5, None]],
    ("send", {"second": True}, {"idempotency_key": "key-1"}),
    *[("send", {}, {"timeout_secs": t}) for t in [1, 7 * 86400, 0, 7 * 86400 + 1, 10.0, 1.5, "1", None]],
    *[
        ("send", {}, {"backoff": b})
        for b in [
            {}, {"initial_secs": 2}, {"initial_secs": 0.25, "factor": 1, "max_secs": 30 * 86400, "jitter": 0},
            {"initial_secs": 0}, {"initial_secs": 30 * 86400 + 1}, {"factor": 0.5}, {"factor": 100}, {"factor": 101},
            {"max_secs": 0}, {"jitter": 1}, {"jitter": 1.1}, {"jitter": -0.1}, {"initial_secs": 0.0001},
            {"initial_secs": 0.00001}, {"x": 1}, {"factor": "2"}, [], "x", None,
        ]  # fmt: skip
    ],
    *[
        ("send", {}, {"headers": h})
        for h in [
            {}, {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, {"a b": "x"},
            {"a": "x\ny"}, {"a": "x\ty"}, {"a": "x\x7f"}, {"a": 1}, {"a" * 256: "x"}, {"a" * 257: "x"},
            {"k": "v" * 8191}, {"k": "v" * 8192}, {"k": "é" * 4095}, {"k": "é" * 4096}, {"é": "x"}, {"": "x"},
            [], None,
        ]  # fmt: skip
    ],
    *[
        ("send", {}, {"concurrency": c})
        for c in [
            {"key": "c"}, {"key": "c", "limit": 5}, {"key": "c", "limit": 1_000_000}, {"key": ""},
            {"key": "k" * 256}, {"limit": 2}, {"key": "c", "limit": 0}, {"key": "c", "limit": 1_000_001},
            {"key": "c", "limit": 2.0}, {"key": "c", "x": 1}, {"key": 5}, "c", None,
        ]  # fmt: skip
    ],
    *[("send", {}, {"rate_limit": r}) for r in ["emails", "nope", "bad name", "", None]],
    *[
        ("send", {}, {"unique": u})
        for u in [
            {"key": "u-1"}, {"key": "u-1"}, {"key": "u-2", "statuses": ["completed"]},
            {"key": "u-3", "statuses": ["pending", "pending", "running", "failed", "cancelled"]},
            {"key": "u", "statuses": []}, {"key": "u", "statuses": ["pending"] * 6}, {"key": "u", "statuses": ["done"]},
            {"key": "u", "statuses": "pending"}, {"key": "u-4", "period_secs": 60}, {"key": "u-4", "period_secs": 60.5},
            {"key": "u", "period_secs": 0}, {"key": "u", "period_secs": YEARS_10 + 1},
            {"key": "u-5", "period_secs": None},
            {"statuses": ["pending"]}, {"key": ""}, {"key": "u", "x": 1}, None,
        ]  # fmt: skip
    ],
    (
        "send",
        {"everything": 1},
        {
            "queue": "all", "priority": 7, "max_attempts": 9, "delay_secs": 30, "idempotency_key": "key-all",
            "timeout_secs": 60, "backoff": {"factor": 3}, "headers": {"x-a": "b"},
            "concurrency": {"key": "c", "limit": 2}, "rate_limit": "emails",
            "unique": {"key": "u-all", "statuses": ["pending"], "period_secs": 3600},
        },
    ),  # fmt: skip
]

#: Columns that differ between any two jobs, compared apart.
_OWN = ["id", "tenant", "created_at", "updated_at", "scheduled_at"]


def _fields(message: str) -> list[str]:
    """The fields a refusal names ("field: what; field: what")."""
    return [part.split(": ", 1)[0] for part in message.split("; ")]


def _names(sql_field: str, http_fields: list[str]) -> bool:
    """Whether the function's field is one the route named (or holds it:
    the route names a header's name as ``headers.NAME.[key]``)."""
    return any(f == sql_field or f.startswith(sql_field + ".") for f in http_fields)


def _canonical(value: Any) -> str:
    # 2 and 2.0 differ on the wire: compare the JSON text
    return json.dumps(value, sort_keys=True)


async def _row(sql: Sql, job_id: str) -> tuple[str, float, float]:
    """The stored row of a job, without what differs between any two jobs,
    and its wait (``scheduled_at - created_at``) and ``scheduled_at``."""
    ((row, wait, scheduled_at),) = await sql.fetch(
        "SELECT (to_jsonb(j) - %s::text[])::text, scheduled_at - created_at, scheduled_at FROM qftrio_jobs AS j"
        " WHERE id = %s",
        _OWN, job_id,
    )  # fmt: skip
    return row, wait, scheduled_at


async def _compare(http: httpx.AsyncClient, server: RunningServer, sql: Sql, case: tuple[str, Any, Any]) -> str | None:
    """What differs between the route's and the function's answer to
    *case*, or None."""
    kind, payload, config = case
    body = '{"kind": %s, "payload": %s, "config": %s}' % (_text(kind), _text(payload), _text(config))
    headers = {**server.headers(HTTP_TENANT), "Content-Type": "application/json"}
    r = await http.post("/api/v1/jobs", content=body, headers=headers)
    before = await sql.jobs()
    try:
        # JSON null too: the route refuses it
        ((job_id, created, job),) = await sql.fetch(ENQUEUE, SQL_TENANT, kind, _jsonb(payload), _jsonb(config))
    except psycopg.Error as exc:
        if await sql.jobs() != before:
            return f"a refused call stored a job: {exc}"
        if r.status_code < 400:
            return f"the route took it ({r.status_code}), the function refused: {exc.sqlstate} {exc}"
        if exc.sqlstate != "22023":
            return f"refused with SQLSTATE {exc.sqlstate}, not 22023: {exc}"
        field = exc.diag.column_name or ""
        if not str(exc).startswith(f"{field}: "):
            return f"the message does not start with its field {field!r}: {exc}"
        http_fields = _fields(r.json()["error"]["message"])
        if not _names(field, http_fields):
            return f"the function names {field!r}, the route {http_fields}: {r.json()['error']['message']} / {exc}"
        return None
    if r.status_code >= 400:
        return f"the route refused it ({r.status_code} {r.text}), the function took it"
    if created != (r.status_code == 201):
        return f"created: {created}, the route answered {r.status_code}"
    answered = r.json()
    got = (await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers(SQL_TENANT))).json()
    if _canonical(job) != _canonical(got):
        return f"the function's answer is not the job the API shows: {job} / {got}"
    # the job the route stored, as the API shows it (the route's own answer
    # shows the payload as it read it, before the database had it)
    shown = (await http.get(f"/api/v1/jobs/{answered['id']}", headers=server.headers(HTTP_TENANT))).json()
    if _canonical({k: v for k, v in job.items() if k not in _OWN}) != _canonical(
        {k: v for k, v in shown.items() if k not in _OWN}
    ):
        return f"the answers differ: {job} / {shown}"
    http_row, http_wait, http_at = await _row(sql, answered["id"])
    sql_row, sql_wait, sql_at = await _row(sql, job_id)
    if http_row != sql_row:
        return f"the stored rows differ: {http_row} / {sql_row}"
    if config.get("scheduled_at") is not None:
        if created and http_at != sql_at:
            return f"scheduled_at: {http_at} / {sql_at}"
    # a job not created is an earlier example's, scheduled as that example asked
    elif created and abs(http_wait - sql_wait) > 1e-6:
        return f"the waits differ: {http_wait} / {sql_wait}"
    return None


async def test_the_function_answers_every_case_as_the_route(
    pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql
) -> None:
    await declare_rate_limit(http, pg_server, HTTP_TENANT, SQL_TENANT)
    wrong = []
    for case in CASES:
        difference = await _compare(http, pg_server, sql, case)
        if difference is not None:
            wrong.append(f"{case!r:.200}: {difference}")
    assert not wrong, "\n".join(wrong)


# The same over configs hypothesis draws: each field often at its edges,
# often of a wrong type, or left out.


def _often(valid: st.SearchStrategy[Any], *others: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """*valid* three times in four, else one of *others*."""
    return st.one_of(valid, valid, valid, st.one_of(*others))


def _number(lo: float, hi: float) -> st.SearchStrategy[Any]:
    return _often(
        st.one_of(st.integers(min_value=math.ceil(lo), max_value=int(hi)), st.floats(min_value=lo, max_value=hi)),
        st.sampled_from([lo, hi]).flatmap(lambda e: st.sampled_from([e, e - 1, e + 1, e + 0.5, float(e)])),
        st.floats(allow_nan=False, allow_infinity=False),
        st.integers(),
        st.sampled_from([True, "1", None, [], {}]),
    )


# no lone surrogate (not UTF-8) nor U+0000 (tested apart)
_CHARS = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")
_TEXT = st.text(_CHARS, max_size=12)
_NAME = _often(st.from_regex(NAME_PATTERN, fullmatch=True), _TEXT, st.integers(), st.none())
_KEY = _often(
    st.text(_CHARS, min_size=1, max_size=3),
    st.just(""), st.text("k", min_size=254, max_size=256), st.integers(), st.none(),
)
_TIME = st.one_of(
    st.builds(
        lambda day, clock, seconds, fraction, sep, zone: f"{day}{sep}{clock}{seconds}{fraction}{zone}",
        st.dates().map(lambda d: d.isoformat()),
        st.times().map(lambda t: t.strftime("%H:%M")),
        st.sampled_from(["", ":00", ":59", ":60"]),
        st.sampled_from(["", ".5", ",123456", ".1234567", "."]),
        st.sampled_from(["T", "t", " ", "_", "x"]),
        st.sampled_from(["", "Z", "z", "+02:30", "-0230", "+23:59", "+24:00", "+02"]),
    ),
    st.dates().map(lambda d: d.isoformat()),
    st.integers(min_value=-(10**15), max_value=10**15).map(str),
    st.decimals(min_value=-(10**11), max_value=10**11, places=3, allow_nan=False).map(str),
    _TEXT,
    st.integers(),
)
CONFIGS = st.fixed_dictionaries(
    {},
    optional={
        "queue": _NAME,
        "priority": _number(-(2**31), 2**31 - 1),
        "max_attempts": _number(1, 1000),
        "delay_secs": _number(0, YEARS_10),
        "scheduled_at": st.one_of(_TIME, st.none()),
        "idempotency_key": _KEY,
        "timeout_secs": _number(1, 7 * 86400),
        "backoff": st.one_of(
            st.none(),
            st.fixed_dictionaries({}, optional={
                "initial_secs": _number(0, 30 * 86400), "factor": _number(1, 100),
                "max_secs": _number(0, 30 * 86400), "jitter": _number(0, 1), "other": st.just(1),
            }),
        ),  # fmt: skip
        "headers": st.one_of(st.none(), st.dictionaries(st.one_of(st.from_regex(r"[a-z-]{1,8}", fullmatch=True), _TEXT),
                                                        st.one_of(_TEXT, st.integers()), max_size=3)),  # fmt: skip
        "concurrency": st.one_of(
            st.none(), st.fixed_dictionaries({}, optional={"key": _KEY, "limit": _number(1, 1_000_000)})
        ),
        "rate_limit": st.one_of(st.sampled_from(["emails", "nope"]), _NAME),
        "unique": st.one_of(
            st.none(),
            st.fixed_dictionaries({}, optional={
                "key": _KEY,
                "statuses": st.lists(st.sampled_from(["pending", "running", "completed", "failed", "cancelled", "x"]),
                                     max_size=6),
                "period_secs": _number(0, YEARS_10),
            }),
        ),  # fmt: skip
        "other": st.just(1),
    },
)


async def test_the_function_answers_drawn_configs_as_the_route(
    pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql
) -> None:
    await declare_rate_limit(http, pg_server, HTTP_TENANT, SQL_TENANT)

    # Run from a thread, each example's calls on this Trio loop, which the
    # server shares.
    @settings(max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(kind=_often(st.just("send"), st.from_regex(NAME_PATTERN, fullmatch=True), _TEXT), config=CONFIGS)
    def check(kind: str, config: dict[str, Any]) -> None:
        difference = trio.from_thread.run(_compare, http, pg_server, sql, (kind, {}, config))
        assert difference is None, difference

    await trio.to_thread.run_sync(check)


async def test_a_job_too_large_is_refused_by_both(pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql) -> None:
    # The route caps the request's body (1 MiB by default, 413), the
    # function the job's JSON (1 MiB, or the setting qftrio.max_body_bytes).
    big = {"blob": "x" * (1 << 20)}
    r = await http.post("/api/v1/jobs", json={"kind": "send", "payload": big}, headers=pg_server.headers(HTTP_TENANT))
    assert r.status_code == 413
    with pytest.raises(psycopg.Error) as refused:
        await sql.enqueue(SQL_TENANT, "send", big)
    assert refused.value.sqlstate == "22023"
    assert str(refused.value).startswith("payload: the JSON is ")
    await sql.execute("SET qftrio.max_body_bytes = 100")
    with pytest.raises(psycopg.Error, match="over the 100 allowed"):
        await sql.enqueue(SQL_TENANT, "send", {"blob": "x" * 100})
    assert await sql.jobs() == 0


async def test_u0000_is_refused_by_both(pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql) -> None:
    # PostgreSQL's jsonb holds no U+0000: the call fails before the function runs.
    for payload, config in [({"a": "x\x00"}, {}), ({"a\x00": 1}, {}), ({}, {"idempotency_key": "a\x00"})]:
        body = {"kind": "send", "payload": payload, "config": config}
        r = await http.post("/api/v1/jobs", json=body, headers=pg_server.headers(HTTP_TENANT))
        assert r.status_code == 422, r.text
        with pytest.raises(psycopg.Error) as refused:
            await sql.enqueue(SQL_TENANT, "send", payload, config)
        assert refused.value.sqlstate == "22P05"
    assert await sql.jobs() == 0


# -- transactions: the job exists if and only if the caller commits ----------------


async def _stats(http: httpx.AsyncClient, server: RunningServer, queue: str, tenant: str = SQL_TENANT) -> Any:
    r = await http.get(f"/api/v1/queues/{queue}/stats", headers=server.headers(tenant))
    assert r.status_code == 200, r.text
    return r.json()["counts"]


async def test_a_rollback_leaves_nothing(pg_server: RunningServer, http: httpx.AsyncClient) -> None:
    app = Sql(autocommit=False)
    try:
        before = await _stats(http, pg_server, "mail")
        config = {"queue": "mail", "idempotency_key": "once"}
        job_id, created, _ = await app.enqueue(SQL_TENANT, "send", {"n": 1}, config)
        assert created
        await app.run(app.conn.rollback)
        r = await http.get(f"/api/v1/jobs/{job_id}", headers=pg_server.headers(SQL_TENANT))
        assert r.status_code == 404
        assert await _stats(http, pg_server, "mail") == before
        # the key was not taken: the next enqueue with it is a new job
        body = {"kind": "send", "config": config}
        r = await http.post("/api/v1/jobs", json=body, headers=pg_server.headers(SQL_TENANT))
        assert r.status_code == 201
        assert r.json()["id"] != job_id
        assert (await _stats(http, pg_server, "mail"))["pending"] == before["pending"] + 1
    finally:
        app.conn.close()


async def test_a_commit_counts_the_job_and_wakes_a_long_poll_parked_on_the_server(
    pg_server: RunningServer, http: httpx.AsyncClient
) -> None:
    app = Sql(autocommit=False)
    store: Any = pg_server.engine.store
    got: dict[str, Any] = {}

    async def long_poll() -> None:
        r = await http.post("/api/v1/queues/mail/lease", json={"wait_secs": 60}, headers=pg_server.headers("worker"))
        got["jobs"] = r.json()["jobs"]

    try:
        before = await _stats(http, pg_server, "mail")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_poll)
            # parked, and its server listening, before anything is enqueued
            def parked() -> bool:
                listener = store._listener
                return bool(pg_server.engine.waker._parked.get("mail")) and listener is not None and listener.listening

            with trio.fail_after(60):
                while not parked():
                    await trio.sleep(0.01)
            job_id, _, _ = await app.enqueue(SQL_TENANT, "send", {"n": 1}, {"queue": "mail"})
            # not committed: no one sees it
            r = await http.get(f"/api/v1/jobs/{job_id}", headers=pg_server.headers(SQL_TENANT))
            assert r.status_code == 404
            assert await _stats(http, pg_server, "mail") == before
            assert "jobs" not in got
            await app.run(app.conn.commit)
        # The poll would have waited 60 s, and no safety poll comes before
        # 120 s: it was the commit's notification that woke it.
        assert [lease["job"]["id"] for lease in got["jobs"]] == [job_id]
        after = await _stats(http, pg_server, "mail")
        assert after["running"] == before["running"] + 1
    finally:
        app.conn.close()


async def test_bad_input_raises_and_the_transaction_stores_nothing(
    pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql
) -> None:
    app = Sql(autocommit=False)
    try:
        await app.enqueue(SQL_TENANT, "send", {}, {"queue": "mail"})
        with pytest.raises(psycopg.Error) as refused:
            await app.enqueue(SQL_TENANT, "send", {}, {"queue": "mail", "max_attempts": 0})
        assert refused.value.sqlstate == "22023"
        assert refused.value.diag.column_name == "config.max_attempts"
        await app.run(app.conn.rollback)
    finally:
        app.conn.close()
    # a batch with one bad job stores none of them
    jobs = [{"kind": "send"}, {"kind": "send"}, {"kind": "send", "config": {"priority": "high"}}]
    with pytest.raises(psycopg.Error, match=r"^jobs\.2\.config\.priority: "):
        await sql.fetch(BATCH, SQL_TENANT, Jsonb(jobs))
    with pytest.raises(psycopg.Error, match=r"^jobs\.1\.config\.rate_limit: no rate limit named 'nope'"):
        await sql.fetch(
            BATCH, SQL_TENANT,
            Jsonb([{"kind": "send"}, {"kind": "send", "config": {"rate_limit": "nope"}}]),
        )  # fmt: skip
    for tenant in ["", None]:
        with pytest.raises(psycopg.Error, match=r"^tenant: "):
            await sql.enqueue(tenant, "send")  # type: ignore[arg-type]
    assert await sql.jobs() == 0
    assert not any((await _stats(http, pg_server, "mail")).values())


async def test_a_job_enqueued_by_sql_is_run_by_a_worker(pg_server: RunningServer, sql: Sql) -> None:
    registry = Registry()

    @registry.handler("greet")
    async def greet(job: Job) -> dict[str, Any]:
        return {"greeting": f"hello {job.payload['name']}", "attempt": job.attempt}

    job_id, _, _ = await sql.enqueue(SQL_TENANT, "greet", {"name": "ada"}, {"queue": "hello", "headers": {"x-a": "b"}})
    async with Client(pg_server.url, pg_server.tenants[SQL_TENANT]) as tenant:
        async with Client(pg_server.url, pg_server.worker_token) as worker:
            async with open_worker(HttpTransport(worker), "hello", registry, wait_secs=5):
                with trio.fail_after(30):
                    while (job := await tenant.job_get(job_id)).status != "completed":
                        await trio.sleep(0.01)
    assert job.result == {"greeting": "hello ada", "attempt": 1}
    assert job.headers == {"x-a": "b"}


async def test_each_tenant_sees_and_keys_its_own_jobs(
    pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql
) -> None:
    mine, created, _ = await sql.enqueue("globex", "send", {}, {"idempotency_key": "k", "unique": {"key": "u"}})
    theirs, created_too, _ = await sql.enqueue("acme", "send", {}, {"idempotency_key": "k", "unique": {"key": "u"}})
    assert created and created_too and mine != theirs
    assert (await http.get(f"/api/v1/jobs/{mine}", headers=pg_server.headers("acme"))).status_code == 404
    assert (await http.get(f"/api/v1/jobs/{mine}", headers=pg_server.headers("globex"))).json()["tenant"] == "globex"
    again, created_again, job = await sql.enqueue("globex", "other", {"x": 1}, {"idempotency_key": "k"})
    assert (again, created_again, job["kind"]) == (mine, False, "send")


async def test_the_batch_form_takes_1_to_1000_jobs(pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql) -> None:
    jobs = [{"kind": "send", "payload": {"n": n}, "config": {"queue": "bulk"}} for n in range(1001)]
    for bad, message in [(jobs, "must hold 1 to 1000 jobs, not 1001"), ([], "must hold 1 to 1000 jobs, not 0"),
                         ({"kind": "send"}, "must be a JSON array")]:  # fmt: skip
        with pytest.raises(psycopg.Error) as refused:
            await sql.fetch(BATCH, SQL_TENANT, Jsonb(bad))
        assert refused.value.diag.message_primary == f"jobs: {message}"
    assert await sql.jobs() == 0
    rows = await sql.fetch(BATCH, SQL_TENANT, Jsonb(jobs[:1000]))
    assert [job["payload"]["n"] for _, _, job in rows] == list(range(1000))
    assert all(created for _, created, _ in rows)
    assert (await _stats(http, pg_server, "bulk"))["pending"] == 1000
    # time-ordered UUIDv7 ids, as the server's
    uuid7 = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    assert all(re.fullmatch(uuid7, i) for i, _, _ in rows)


async def test_the_batch_form_answers_as_the_batch_route(
    pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql
) -> None:
    await declare_rate_limit(http, pg_server, HTTP_TENANT, SQL_TENANT)
    batches: list[list[Any]] = [
        [{"kind": "a", "config": {"idempotency_key": "k"}}, {"kind": "b", "config": {"idempotency_key": "k"}}],
        [{"kind": "a", "config": {"unique": {"key": "u"}}}, {"kind": "b", "config": {"unique": {"key": "u"}}}],
        [{"kind": "a", "config": {"rate_limit": "emails", "unique": {"key": "v"}}}, {"kind": "c"}],
        [{"kind": "a"}, {"kind": "a", "config": {"priority": 1.5}}],
        [{"kind": "a"}, {"kind": "a", "extra": 1}],
        [{"kind": "a"}, "a"],
        [{"payload": {}}],
    ]
    for jobs in batches:
        r = await http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=pg_server.headers(HTTP_TENANT))
        try:
            rows = await sql.fetch(BATCH, SQL_TENANT, Jsonb(jobs))
        except psycopg.Error as exc:
            assert r.status_code == 422, (jobs, r.text, exc)
            assert _names(exc.diag.column_name or "", _fields(r.json()["error"]["message"])), (r.text, exc)
            continue
        assert r.status_code == 201, (jobs, r.text)
        answered = r.json()["jobs"]
        # the same jobs stored, the same one answered for a repeated key
        assert [a["id"] == answered[0]["id"] for a in answered] == [row[0] == rows[0][0] for row in rows]
        for a, (job_id, _, job) in zip(answered, rows):
            assert (await _row(sql, a["id"]))[0] == (await _row(sql, job_id))[0]


async def test_a_unique_key_held_by_an_open_transaction_makes_the_route_wait_for_it(
    pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql
) -> None:
    # the same advisory lock as the server's: the route waits for the
    # application's transaction, then answers its job
    app = Sql(autocommit=False)
    answer: dict[str, Any] = {}

    async def enqueue_by_http() -> None:
        body = {"kind": "send", "config": {"unique": {"key": "once"}}}
        answer["r"] = await http.post("/api/v1/jobs", json=body, headers=pg_server.headers(SQL_TENANT))

    try:
        job_id, _, _ = await app.enqueue(SQL_TENANT, "send", {}, {"unique": {"key": "once"}})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(enqueue_by_http)
            waiting = """SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
            with trio.fail_after(60):
                while not (await sql.fetch(waiting)):
                    await trio.sleep(0.01)
            assert "r" not in answer
            await app.run(app.conn.commit)
        assert answer["r"].status_code == 200
        assert answer["r"].json()["id"] == job_id
    finally:
        app.conn.close()


async def test_concurrent_batches_of_new_keys_never_deadlock(pg_server: RunningServer) -> None:
    # Two applications' batches bringing the same keys, new to the table, in
    # opposite orders, at once, round after round: the keys' rows are made in
    # one order, so neither transaction waits on the other in a cycle (which
    # PostgreSQL would break by failing one with a deadlock).
    apps = [Sql(), Sql()]
    try:
        for round_ in range(20):
            keys = [f"new{round_}-{i:02d}" for i in range(40)]
            orders = [keys, keys[::-1]]

            async def enqueue(n: int) -> None:
                jobs = [{"kind": "sync", "config": {"concurrency": {"key": k, "limit": 1}}} for k in orders[n]]
                await apps[n].fetch(BATCH, SQL_TENANT, Jsonb(jobs))

            async with trio.open_nursery() as nursery:
                for n in range(2):
                    nursery.start_soon(enqueue, n)
        ((pending, keyed),) = await apps[0].fetch(
            "SELECT count(*), count(DISTINCT concurrency_key) FROM qftrio_jobs WHERE status = 'pending'"
        )
        assert (pending, keyed) == (20 * 80, 20 * 40)
    finally:
        for app in apps:
            app.conn.close()


# -- the documented examples, as written ---------------------------------------------


def _example(language: str, marker: str) -> str:
    """The code block of docs/sql-enqueue.md that holds *marker*."""
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


APP_TABLE = "CREATE TABLE IF NOT EXISTS users (id bigserial PRIMARY KEY, email text UNIQUE NOT NULL)"


async def test_the_psycopg_example(pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql) -> None:
    await sql.execute(APP_TABLE)
    await sql.execute("DELETE FROM users")
    namespace: dict[str, Any] = {}
    exec(_example("python", "import psycopg"), namespace)
    with psycopg.connect(pg_url() or "") as conn:
        job_id = await trio.to_thread.run_sync(namespace["sign_up"], conn, "ada@example.com")
    r = await http.get(f"/api/v1/jobs/{job_id}", headers=pg_server.headers("acme"))
    assert r.json()["payload"] == {"email": "ada@example.com"}
    assert await sql.fetch("SELECT email FROM users") == [("ada@example.com",)]


async def test_the_asyncpg_example(pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql) -> None:
    import asyncpg

    await sql.execute(APP_TABLE)
    await sql.execute("DELETE FROM users")
    namespace: dict[str, Any] = {}
    exec(_example("python", "import asyncpg"), namespace)

    async def run() -> Any:
        conn = await asyncpg.connect(pg_url())
        try:
            return await namespace["sign_up"](conn, "grace@example.com")
        finally:
            await conn.close()

    job_id = await on_asyncio(run)
    r = await http.get(f"/api/v1/jobs/{job_id}", headers=pg_server.headers("acme"))
    assert r.json()["payload"] == {"email": "grace@example.com"}
    assert await sql.fetch("SELECT email FROM users") == [("grace@example.com",)]


async def test_a_repeated_key_answers_the_job_as_it_stands(
    pg_server: RunningServer, http: httpx.AsyncClient, sql: Sql
) -> None:
    # claimed and failed since: its attempt, worker and error history as the API shows them
    job_id, _, _ = await sql.enqueue(SQL_TENANT, "send", {}, {"queue": "mail", "idempotency_key": "k"})
    r = await http.post("/api/v1/queues/mail/lease", json={"worker_id": "w1"}, headers=pg_server.headers("worker"))
    (lease,) = r.json()["jobs"]
    r = await http.post(
        f"/api/v1/jobs/{job_id}/fail", json={"lease_token": lease["lease_token"], "error": "boom"},
        headers=pg_server.headers("worker"),
    )  # fmt: skip
    assert r.status_code == 204
    again, created, job = await sql.enqueue(SQL_TENANT, "send", {}, {"idempotency_key": "k"})
    shown = (await http.get(f"/api/v1/jobs/{job_id}", headers=pg_server.headers(SQL_TENANT))).json()
    assert (again, created) == (job_id, False)
    assert job["errors"][0]["error"] == "boom" and job["worker_id"] == "w1"
    assert _canonical(job) == _canonical(shown)


async def test_the_data_only_role_enqueues_whatever_its_search_path() -> None:
    # docs/deploy.md's roles: the tables in the schema qftrio; the application
    # calls the function schema-qualified from a search_path of its own
    if pg_url() is None:
        pytest.skip("QFTRIO_TEST_DATABASE_URL is not set")
    with trio.fail_after(60):
        async with database_with_data_role() as (owner, data, _):
            await migrate_as(owner)
            config = json.dumps({"queue": "q", "unique": {"key": "u"}, "concurrency": {"key": "c"}})
            call = f"SELECT id::text, created FROM qftrio.qftrio_enqueue('acme', 'k', '{{}}', '{config}')"
            (row,) = await sql_as(data, "SET search_path = public", call)
            assert row["created"]
            counted = "SELECT sum(n) FROM qftrio_job_counts WHERE queue = 'q' AND status = 'pending'"
            assert await sql_as(owner, "SELECT id::text FROM qftrio_jobs") == [(row["id"],)]
            assert [tuple(r) for r in await sql_as(owner, counted)] == [(1,)]


async def test_a_unique_job_needs_read_committed(pg_server: RunningServer, sql: Sql) -> None:
    # under an older snapshot the lookup after the lock would miss the job
    # the transaction it waited for committed
    app = Sql(autocommit=False)
    try:
        for level in ["REPEATABLE READ", "SERIALIZABLE"]:
            await app.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            with pytest.raises(psycopg.Error) as refused:
                await app.enqueue(SQL_TENANT, "send", {}, {"unique": {"key": "u"}})
            assert refused.value.sqlstate == "0A000"
            assert refused.value.diag.message_primary == (
                f"config.unique: a unique job is enqueued only in a READ COMMITTED transaction, not {level}"
            )
            await app.run(app.conn.rollback)
            # other jobs are enqueued at any level
            await app.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            await app.enqueue(SQL_TENANT, "send", {}, {"idempotency_key": level})
            await app.run(app.conn.commit)
    finally:
        app.conn.close()
    assert await sql.jobs() == 2


async def test_the_function_knows_every_field_the_route_takes(pg_server: RunningServer, sql: Sql) -> None:
    # a field added to the route's models and not to the function is refused
    # by the function as unknown: this names it
    configs: list[dict[str, Any]] = [{name: None} for name in JobConfig.model_fields]
    for where, model in [("backoff", BackoffConfig), ("concurrency", ConcurrencyConfig), ("unique", UniqueConfig)]:
        configs += [{where: {name: None}} for name in model.model_fields]
    unknown = []
    for config in configs:
        try:
            await sql.enqueue(SQL_TENANT, "send", {}, config)
        except psycopg.Error as exc:
            if exc.diag.message_primary and exc.diag.message_primary.endswith(": unknown field"):
                unknown.append(exc.diag.column_name)
    assert unknown == []
    assert set(EnqueueRequest.model_fields) == {"kind", "payload", "config"}
