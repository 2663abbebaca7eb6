"""Opening PostgreSQL: settings that cannot work are one line on stderr and
exit 2, a database that cannot be reached is one line naming it and exit 1,
for ``qftrio serve`` and ``qftrio migrate``, from ``--database-url`` or
``QUEUEFLOW_DATABASE_URL``; and the data-only role of docs/deploy.md runs a
server on a schema its owner migrated, and says what it lacks on one that is
behind.

The commands run through :func:`qftrio.cli.main` in this process, with what
it logs in view, and as processes of their own where the whole of stderr
must be one line; all against the test cluster (``QFTRIO_TEST_DATABASE_URL``),
on Trio's real clock, each bounded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg.errors
import pytest
import trio

import qftrio
from qftrio import errors
from qftrio.cli import main
from qftrio.server.config import Config
from qftrio.server.serve import serve
from qftrio.server.store import pgtrio, sql
from qftrio.server.store.postgres import MIGRATION_LOCK_KEY, _migrate_on, migrate, pending_migrations

from .pg import connection, pg_url
from .processes import ROOT, free_port

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(pg_url() is None, reason="QFTRIO_TEST_DATABASE_URL is not set"),
]

#: Credentials that let ``qftrio serve`` get as far as opening its store.
SERVE = ["serve", "--bind", "127.0.0.1:0", "--worker-token", "worker-token-0123456789", "--tenant", "acme=tenant-token-0123456789"]

#: Every migration the package ships, in order.
ALL_MIGRATIONS = [name for _, name, _ in sql.migrations("postgres")] + ["functions"]


def database_url() -> str:
    url = pg_url()
    assert url is not None
    return url


def with_parts(url: str, **parts: str) -> str:
    """*url* with some of its parts (``netloc``, ``path``, ``query``) replaced."""
    return urllib.parse.urlsplit(url)._replace(**parts).geturl()


def as_role(url: str, role: str, password: str | None = None) -> str:
    host = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
    return with_parts(url, netloc=f"{role}:{password}@{host}" if password else f"{role}@{host}")


async def sql(url: str, *statements: str) -> list[pgtrio.Record]:
    """Run *statements* on a connection of their own; the last one's rows."""
    async with connection(url) as conn:
        rows: list[pgtrio.Record] = []
        for statement in statements:
            rows = await conn.fetch(statement)
        return rows


async def qftrio_process(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """``qftrio ARGV`` as a process of its own: all it writes to stderr."""
    clean = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": "/nonexistent", **(env or {})}
    with trio.fail_after(30):
        return await trio.run_process(
            [sys.executable, "-m", "qftrio", *argv], capture_stdout=True, capture_stderr=True, env=clean, check=False
        )


def one_line(err: str | bytes) -> str:
    """The one line of *err*, which holds no traceback."""
    text = err.decode() if isinstance(err, bytes) else err
    assert "Traceback" not in text and "unexpected error" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Awaitable[tuple[int, str]]]:
    """Run ``qftrio ARGV`` in this process (in a thread, as test_cli does):
    ``(exit code, the one line on stderr)``, asserting that nothing was
    logged with a traceback. ``env`` sets ``QUEUEFLOW_DATABASE_URL`` to it.
    The garbage collector's settings for ``qftrio serve`` are left alone."""
    monkeypatch.setattr("qftrio._gc.settle_after_imports", lambda: None)

    async def run(*argv: str, env: str | None = None) -> tuple[int, str]:
        if env is None:
            monkeypatch.delenv("QUEUEFLOW_DATABASE_URL", raising=False)
        else:
            monkeypatch.setenv("QUEUEFLOW_DATABASE_URL", env)
        caplog.clear()
        with trio.fail_after(30):
            code = await trio.to_thread.run_sync(functools.partial(main, list(argv)))
        assert [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING] == []
        return code, one_line(capsys.readouterr().err)

    return run


@pytest.fixture
async def password_role() -> AsyncIterator[tuple[str, str]]:
    """A role that must give its password, ``(name, password)``: the test
    cluster trusts every other login, so its pg_hba.conf gets a line of its
    own for this role (written by the server, through a large object) until
    the test ends."""
    url = database_url()
    (me,) = await sql(url, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    if not me["rolsuper"]:
        pytest.skip("needs a superuser to change pg_hba.conf")
    name, password = f"qftrio_pw_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    ((hba_file, original),) = await sql(
        url, "SELECT setting AS f, pg_read_file(setting) AS content FROM pg_settings WHERE name = 'hba_file'"
    )

    async def write_hba(content: str) -> None:
        literal = content.replace("'", "''")
        await sql(
            url,
            f"""DO $$ DECLARE o oid := lo_from_bytea(0, convert_to('{literal}', 'UTF8'));
            BEGIN PERFORM lo_export(o, '{hba_file}'); PERFORM lo_unlink(o); END $$""",
            "SELECT pg_reload_conf()",
        )

    await sql(url, f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    try:
        await write_hba(f"host all {name} 127.0.0.1/32 scram-sha-256\n{original}")
        # the postmaster rereads the file when signalled: wait until it has
        with trio.fail_after(10):
            while True:
                try:
                    await sql(as_role(url, name, "wrong"), "SELECT 1")
                except psycopg.errors.InvalidPassword:
                    break
        yield name, password
    finally:
        with trio.CancelScope(shield=True), trio.fail_after(10):
            await write_hba(original)
            await sql(url, f"DROP ROLE IF EXISTS {name}")


# (how to make the URL from the test's, the exit code, what the line must say)
CASES: dict[str, tuple[Callable[[str], str], int, str]] = {
    "not postgresql": (lambda url: "mysql://x/y", 2, "postgresql"),
    "bad sslmode": (lambda url: with_parts(url, query="sslmode=bogus"), 2, "sslmode"),
    "port not a number": (lambda url: with_parts(url, netloc="postgres:s3cret@127.0.0.1:abc"), 2, "'abc'"),
    "unknown database": (lambda url: with_parts(url, path="/no_such_db"), 2, 'database "no_such_db" does not exist'),
    "unknown role": (lambda url: as_role(url, "no_such_role", "s3cret"), 2, 'role "no_such_role" does not exist'),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_database_url_that_cannot_work_is_one_line(case: str, cli: Any) -> None:
    make, code, says = CASES[case]
    url = make(database_url())
    for argv, env in [(("migrate", "--database-url", url), None), (SERVE, url)]:
        exit_code, line = await cli(*argv, env=env)
        assert exit_code == code, line
        assert says in line
        assert "s3cret" not in line


async def test_a_bad_url_is_one_line_from_a_real_process_too() -> None:
    # where this was a 60-line traceback, logged before the error
    url = with_parts(database_url(), query="sslmode=bogus")
    procs = [
        await qftrio_process(*SERVE, env={"QUEUEFLOW_DATABASE_URL": url}),
        await qftrio_process("migrate", "--database-url", url),
    ]
    for proc in procs:
        assert proc.returncode == 2
        line = one_line(proc.stderr)
        assert line.startswith("qftrio: the database URL is not usable: `sslmode` parameter must be one of")


async def test_an_unreachable_database_is_named_and_exit_1(cli: Any) -> None:
    port = free_port()
    url = with_parts(database_url(), netloc=f"postgres@127.0.0.1:{port}")
    for argv, env in [(("migrate",), url), ((*SERVE, "--database-url", url), None)]:
        assert await cli(*argv, env=env) == (
            1,
            f"qftrio: unavailable: cannot connect to PostgreSQL at 127.0.0.1:{port}: connection refused",
        )


@pytest.mark.xdist_group("pg_hba")  # rewrites the cluster's pg_hba.conf
async def test_a_wrong_password_is_one_line_without_it(password_role: tuple[str, str], cli: Any) -> None:
    name, password = password_role
    url = as_role(database_url(), name, "not-" + password)
    for argv, env in [(("migrate", "--database-url", url), None), (SERVE, url)]:
        code, line = await cli(*argv, env=env)
        assert code == 2
        assert f'password authentication failed for user "{name}"' in line
        assert password not in line


# -- the data-only role -----------------------------------------------------------


def roles_recipe() -> str:
    """The SQL of docs/deploy.md's "Roles" section, as printed."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text[text.index("## Roles") :]
    return section[section.index("```sql\n") + 7 : section.index("\n```", section.index("```sql"))]


@contextlib.asynccontextmanager
async def database_with_data_role() -> AsyncIterator[tuple[str, str, str]]:
    """A new, empty database with the owner and data-only roles of
    docs/deploy.md, made by its SQL as printed (names made unique):
    ``(owner URL, data role URL, data role)``."""
    url = database_url()
    suffix = uuid.uuid4().hex[:8]
    name, owner, app = f"qftrio_setup_{suffix}", f"qftrio_owner_{suffix}", f"qftrio_app_{suffix}"
    database = with_parts(url, path=f"/{name}")
    recipe = roles_recipe().replace("qftrio_owner", owner).replace("qftrio_app", app)
    await sql(url, f"CREATE DATABASE {name}")
    try:
        await sql(database, *recipe.split(";\n"))
        yield as_role(database, owner), as_role(database, app), app
    finally:
        with trio.CancelScope(shield=True), trio.fail_after(20):
            await sql(
                url,
                f"DROP DATABASE IF EXISTS {name} WITH (FORCE)",
                f"DROP ROLE IF EXISTS {app}",
                f"DROP ROLE IF EXISTS {owner}",
            )


async def migrate_as(url: str) -> list[str]:
    return await migrate(url, timeout=None)


async def run_a_job(database_url: str) -> qftrio.Job:
    """Serve on *database_url*, enqueue, lease and complete one job over HTTP."""
    config = Config(database_url=database_url, bind="127.0.0.1:0", worker_token="w", tenants={"acme": "t"})
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(functools.partial(serve, config, shutdown_trigger=stop.wait))
        async with qftrio.Client(base, "t") as app, qftrio.Client(base, "w") as worker:
            job = await app.enqueue("k", {"n": 1}, queue="q")
            (lease,) = await worker.lease("q")
            await worker.complete(lease.job.id, lease.lease_token, {"ok": True})
            done = await app.job_get(job.id)
        stop.set()
    return done


async def test_the_data_only_role_serves_once_the_owner_migrated() -> None:
    with trio.fail_after(180):  # a cap only: migrating and a real server, on a busy machine
        async with database_with_data_role() as (owner, data, role):
            # behind: the role may not migrate, and says so in one line
            proc = await qftrio_process(*SERVE, "--database-url", data)
            assert proc.returncode == 2
            line = one_line(proc.stderr)
            assert "missing 0001_init" in line and repr(role) in line
            assert "CREATE on the schema" in line and "run `qftrio migrate` as the schema's owner" in line

            assert await migrate_as(owner) == ALL_MIGRATIONS

            # current: the role's server runs jobs, and changes no table
            tables = "SELECT count(*) FROM pg_class WHERE relname LIKE 'qftrio%'"
            (before,) = await sql(owner, tables)
            done = await run_a_job(data)
            assert (done.status, done.result) == (qftrio.Status.COMPLETED, {"ok": True})
            assert await sql(owner, tables) == [before]


async def test_a_role_that_may_not_read_the_migrations_says_so(cli: Any) -> None:
    with trio.fail_after(60):
        async with database_with_data_role() as (owner, data, role):
            await migrate_as(owner)
            await sql(owner, f"REVOKE SELECT ON qftrio_schema_migrations FROM {role}")
            code, line = await cli(*SERVE, "--database-url", data)
            assert code == 2
            assert "permission denied for table qftrio_schema_migrations" in line
            assert "grant it SELECT, INSERT, UPDATE, DELETE on the qftrio_* tables" in line



async def test_a_role_that_waited_while_the_owner_migrated_runs_no_ddl() -> None:
    # a rolling upgrade: the data-only role saw the schema behind and queued
    # for the migration lock, which the owner held while migrating
    with trio.fail_after(180):  # a cap only: migrating and a real server, on a busy machine
        async with database_with_data_role() as (owner, data, _), connection(owner) as conn:

            async def run(statement: str) -> Any:
                return await conn.fetchval(statement, MIGRATION_LOCK_KEY)

            await run("SELECT pg_advisory_lock($1)")
            applied: list[list[str]] = []

            async def migrate_as_the_role() -> None:
                applied.append(await migrate(data, timeout=None))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(migrate_as_the_role)
                waiting = """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                             AND objid = $1::bigint AND database = (SELECT oid FROM pg_database
                                                                    WHERE datname = current_database())"""
                while not await run(waiting):
                    pass
                # the lock is the session's, so the owner migrates under it
                assert await _migrate_on(conn) == ALL_MIGRATIONS
                await run("SELECT pg_advisory_unlock($1)")
            assert applied == [[]]


async def test_functions_that_differ_from_this_qftrios_are_replaced_once() -> None:
    # a database another qftrio migrated (its functions.sql differed), and
    # one migrated before functions.sql was kept apart from the migrations
    with trio.fail_after(60):
        async with database_with_data_role() as (owner, _, _):
            await migrate_as(owner)
            float_of = "SELECT qftrio_enqueue_json_float(2)::text"
            for stale in (
                "UPDATE qftrio_schema_migrations SET name = 'functions 0000' WHERE version = 'functions'",
                "DELETE FROM qftrio_schema_migrations WHERE version = 'functions'",
            ):
                await sql(
                    owner,
                    "CREATE OR REPLACE FUNCTION qftrio_enqueue_json_float(f float8) RETURNS jsonb"
                    " LANGUAGE sql IMMUTABLE AS $$ SELECT '0'::jsonb $$",
                    stale,
                )
                assert await pending_migrations(owner) == ["functions"]
                assert await migrate_as(owner) == ["functions"]
                assert [tuple(row) for row in await sql(owner, float_of)] == [("2.0",)]
                assert await migrate_as(owner) == []
                assert await pending_migrations(owner) == []


@pytest.mark.xdist_group("pg_hba")  # rewrites the cluster's pg_hba.conf
async def test_credentials_refused_while_serving_are_unavailable(password_role: tuple[str, str]) -> None:
    # a rotated password: the pool's next connection is refused, which is a
    # 503 to the request that needed it, not an error of the request
    name, password = password_role
    url = database_url()
    with trio.fail_after(30):
        async with pgtrio.open_database(as_role(url, name, password), max_size=1, timeout=None) as db:
            assert await db.fetchval("SELECT 1") == 1
            await sql(url, f"ALTER ROLE {name} PASSWORD 'rotated'")
            await sql(url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{name}'")
            while await sql(url, f"SELECT 1 FROM pg_stat_activity WHERE usename = '{name}'"):
                pass
            refused = False
            for _ in range(3):  # the first call may still find the terminated connection
                with pytest.raises(errors.Unavailable) as raised:
                    await db.fetchval("SELECT 1")
                if "InvalidPassword" in raised.value.message:
                    refused = True
                    break
            assert refused
