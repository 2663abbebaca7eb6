"""PostgreSQL from Trio (``pgtrio``): values go in and come back as the
store passes and reads them, transactions commit or roll back, the
database's failures are told by SQLSTATE class, a cancelled call leaves no
statement in flight, timeouts run in real time (so on Trio's virtual clock
too), and LISTEN delivers what others send, not what the store's own
connections do.

Against the real PostgreSQL of ``QFTRIO_TEST_DATABASE_URL``.
"""

from __future__ import annotations

import uuid

import psycopg.errors
import pytest
import trio
import trio.testing

from qftrio import errors
from qftrio.server.store import pgtrio

from .pg import connection, pg_url

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(pg_url() is None, reason="QFTRIO_TEST_DATABASE_URL is not set"),
]


def url() -> str:
    value = pg_url()
    assert value is not None
    return value


async def test_values_go_in_and_come_back_as_the_store_uses_them() -> None:
    job_id = str(uuid.uuid4())
    async with pgtrio.open_database(url(), max_size=1, timeout=10) as db:
        (row,) = await db.fetch(
            """SELECT $1::uuid AS id, $2::jsonb AS payload, $3::text[] AS names, $4::float8 AS at,
                      $5::int AS whole, $6::text AS nothing, $7::bool AS yes""",
            job_id, {"a": [1, 2.5, None], "s": "é"}, ["x", 'y"z', None, "a,b"], 1.5, 3.0, None, True,
        )  # fmt: skip
        assert str(row["id"]) == job_id and str(row[0]) == job_id
        assert row["payload"] == {"a": [1, 2.5, None], "s": "é"}
        assert row["names"] == ["x", 'y"z', None, "a,b"]
        assert row["at"] == 1.5 and row["whole"] == 3 and row["nothing"] is None and row["yes"] is True
        assert dict(row)["at"] == 1.5 and tuple(row)[3] == 1.5
        assert await db.fetchval("SELECT $1::float8", 1_800_000_000.123456) == 1_800_000_000.123456
        assert await db.fetch("SELECT 1 WHERE false") == []


async def test_values_postgresql_cannot_store_are_invalid_input() -> None:
    async with pgtrio.open_database(url(), max_size=1, timeout=10) as db:
        for value in ({"x": float("nan")}, {"s": "a\x00b"}):
            with pytest.raises(errors.InvalidInput, match="cannot be stored"):
                await db.fetch("SELECT $1::jsonb", value)
        with pytest.raises(errors.InvalidInput):
            await db.fetch("SELECT $1::text", "a\x00b")
        assert await db.fetchval("SELECT 1") == 1  # the connection serves on


async def test_a_transaction_commits_or_rolls_back_as_a_whole() -> None:
    async with pgtrio.open_database(url(), max_size=1, timeout=10) as db:
        await db.fetch("CREATE TABLE IF NOT EXISTS pgtrio_t (x int)")
        await db.fetch("TRUNCATE pgtrio_t")

        async def insert(conn: pgtrio.Connection, fail: bool) -> None:
            await conn.execute("INSERT INTO pgtrio_t VALUES ($1)", 1)
            async with conn.transaction():  # a savepoint
                await conn.execute("INSERT INTO pgtrio_t VALUES ($1)", 2)
                if fail:
                    raise errors.Conflict("no")
            await conn.execute("INSERT INTO pgtrio_t VALUES ($1)", 3)

        await db.run(insert, False)
        with pytest.raises(errors.Conflict):
            await db.run(insert, True)
        assert [r["x"] for r in await db.fetch("SELECT x FROM pgtrio_t ORDER BY x")] == [1, 2, 3]

        async def inner_fails(conn: pgtrio.Connection) -> None:
            await conn.execute("INSERT INTO pgtrio_t VALUES ($1)", 4)
            with pytest.raises(psycopg.errors.DivisionByZero):
                async with conn.transaction():
                    await conn.execute("INSERT INTO pgtrio_t VALUES ($1)", 5)
                    await conn.fetch("SELECT 1 / 0")

        await db.run(inner_fails)
        assert [r["x"] for r in await db.fetch("SELECT x FROM pgtrio_t ORDER BY x")] == [1, 2, 3, 4]
        await db.fetch("DROP TABLE pgtrio_t")


async def test_failures_of_the_database_are_unavailable_by_sqlstate_class() -> None:
    async with pgtrio.open_database(url(), max_size=2, timeout=10, statement_timeout=0.05) as db:
        with pytest.raises(errors.Unavailable):  # 57014, the statement timeout
            await db.fetch("SELECT pg_sleep(1)")

        async def read_only(conn: pgtrio.Connection) -> None:
            await conn.execute("SET TRANSACTION READ ONLY")
            await conn.execute("CREATE TEMP TABLE t (x int)")

        with pytest.raises(errors.Unavailable):  # 25006, as on a standby
            await db.run(read_only)

        async def lock_timeout(conn: pgtrio.Connection) -> None:
            await conn.execute("SET LOCAL lock_timeout = '10ms'")
            await conn.execute("LOCK TABLE pg_class_lock_probe")

        await db.fetch("CREATE TABLE IF NOT EXISTS pg_class_lock_probe (x int)")
        async with connection(url()) as holder:
            async with holder.transaction():
                await holder.execute("LOCK TABLE pg_class_lock_probe")
                with pytest.raises(errors.Unavailable):  # 55P03
                    await db.run(lock_timeout)
        await db.fetch("DROP TABLE pg_class_lock_probe")

        # a connection the server ended (57P01): this call fails, the pool reconnects
        pid = await db.fetchval("SELECT pg_backend_pid()")
        async with connection(url()) as other:
            await other.fetch("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(errors.Unavailable):
            await db.fetch("SELECT 1")
        assert await db.fetchval("SELECT pg_backend_pid()") != pid

        # an error of the statement itself is not the database's failure
        with pytest.raises(psycopg.errors.SyntaxError):
            await db.fetch("SELEC 1")


async def test_a_cancelled_call_finishes_its_statement_and_the_connection_serves_on() -> None:
    async with pgtrio.open_database(url(), max_size=1, timeout=10) as db:
        pid = await db.fetchval("SELECT pg_backend_pid()")
        with trio.fail_after(10):
            with trio.move_on_after(0.02) as scope:
                await db.fetch("SELECT pg_sleep(0.2)")
        assert scope.cancelled_caught
        assert await db.fetchval("SELECT pg_backend_pid()") == pid


async def test_database_waits_are_not_cut_by_the_virtual_clock(autojump_clock: trio.testing.MockClock) -> None:
    # every task waits on a socket for real time, so the virtual clock
    # jumps: deadlines of Trio's clock would fire at once
    async with pgtrio.open_database(url(), max_size=1, timeout=1) as db:
        assert await db.fetchval("SELECT 1 FROM pg_sleep(1.5)") == 1


async def test_a_statement_past_its_client_side_bound_is_cut_in_real_time(autojump_clock: trio.testing.MockClock) -> None:
    async with pgtrio.open_watchdog() as watchdog:
        conn = await pgtrio.connect(url(), watchdog=watchdog, timeout=10, command_timeout=0.2)
        with pytest.raises(TimeoutError):
            await conn.fetch("SELECT pg_sleep(5)")
        assert conn.is_closed()
        assert pgtrio.translate_error(TimeoutError()) is not None


async def test_connecting_to_a_server_that_never_answers_times_out(autojump_clock: trio.testing.MockClock) -> None:
    # a socket that takes connections (the kernel's backlog) and says nothing
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    port = listener.getsockname()[1]
    with listener:
        with pytest.raises(errors.Unavailable, match=f"127.0.0.1:{port}: timed out"):
            async with pgtrio.open_database(f"postgresql://u@127.0.0.1:{port}/d?sslmode=disable", timeout=0.3):
                pass


async def test_host_names_are_looked_up_and_each_address_tried() -> None:
    # the lookup runs in a thread, not in libpq on the event loop; a name
    # that resolves connects, one that does not is skipped for the next host
    # of the URL, and with none left the error names the lookup
    here = url().replace("127.0.0.1", "localhost", 1)
    assert "localhost" in here
    host = here.split("@", 1)[1].split("/", 1)[0]
    async with pgtrio.open_database(here, max_size=1) as db:
        assert await db.fetchval("SELECT 1") == 1
    elsewhere = here.replace(host, f"qftrio.invalid,{host}", 1)
    async with pgtrio.open_database(elsewhere, max_size=1) as db:
        assert await db.fetchval("SELECT 1") == 1
    with pytest.raises(errors.Unavailable, match="qftrio.invalid.*failed to resolve host"):
        async with pgtrio.open_database("postgresql://u@qftrio.invalid:5432/d", timeout=10):
            pass


async def test_settings_libpq_does_not_know_are_the_servers() -> None:
    async with pgtrio.open_database(url() + "?search_path=elsewhere&statement_timeout=1234", max_size=1) as db:
        assert await db.fetchval("SHOW search_path") == "elsewhere"
        assert await db.fetchval("SHOW statement_timeout") == "1234ms"
        assert await db.fetchval("SHOW application_name") == "qftrio"
        assert await db.fetchval("SHOW jit") == "off"


async def test_listen_receives_what_others_send_and_not_what_the_pool_sends() -> None:
    with trio.fail_after(20):
        async with pgtrio.open_database(url(), max_size=1, timeout=10) as db:
            async with pgtrio.open_listener(url(), "pgtrio test", watchdog=db.watchdog, ignore=db.backends) as listener:
                await listener.listen()
                await db.fetch("SELECT pg_notify('pgtrio test', 'own')")
                async with connection(url()) as other:
                    await other.fetch("SELECT pg_notify('pgtrio test', 'a'), pg_notify('pgtrio test', 'b')")
                assert await listener.receive() == ["a", "b"]  # in the order they came
                # a poke wakes a receive with nothing
                async with trio.open_nursery() as nursery:
                    received: list[list[str]] = []

                    async def receive() -> None:
                        received.append(await listener.receive())

                    nursery.start_soon(receive)
                    await trio.testing.wait_all_tasks_blocked()
                    listener.poke()
                assert received == [[]]
                # one sent while the connection answers a statement of its own
                # (as its idle check) is read with the answer, and kept
                async with connection(url()) as other, trio.open_nursery() as nursery:
                    nursery.start_soon(listener._conn.fetchval, "SELECT pg_sleep(0.3)")
                    await trio.sleep(0.05)
                    await other.fetch("SELECT pg_notify('pgtrio test', 'during')")
                assert await listener.receive() == ["during"]
                await listener.unlisten()
                async with connection(url()) as other:
                    await other.fetch("SELECT pg_notify('pgtrio test', 'unheard')")
                    await other.fetch("SELECT pg_terminate_backend($1)", listener.backend_pid)
                # the end of the connection is noticed, and nothing was heard
                with pytest.raises(errors.Unavailable, match="lost"):
                    await listener.receive()


async def test_an_idle_listener_checks_its_connection_and_hears_on(autojump_clock: trio.testing.MockClock) -> None:
    async with pgtrio.open_watchdog() as watchdog:
        async with pgtrio.open_listener(url(), "pgtrio idle", watchdog=watchdog) as listener:
            await listener.listen()
            received: list[list[str]] = []

            async def receive() -> None:
                received.append(await listener.receive(keepalive_secs=60))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                await trio.sleep(600)  # ten checks, on the virtual clock
                async with connection(url()) as other:
                    await other.fetch("SELECT pg_notify('pgtrio idle', 'late')")
            assert received == [["late"]]


async def test_executemany_runs_every_row_and_raises_the_first_error() -> None:
    async with connection(url()) as conn:
        await conn.execute("CREATE TEMP TABLE many (x int PRIMARY KEY, s text)")
        await conn.executemany("INSERT INTO many VALUES ($1, $2)", [(i, str(i)) for i in range(50)])
        assert await conn.fetchval("SELECT count(*) FROM many") == 50
        async with conn.transaction():
            await conn.execute("SAVEPOINT before")
            with pytest.raises(psycopg.errors.UniqueViolation):
                await conn.executemany("INSERT INTO many VALUES ($1, $2)", [(100, "a"), (1, "again"), (101, "b")])
            await conn.execute("ROLLBACK TO SAVEPOINT before")
        assert await conn.fetchval("SELECT count(*) FROM many") == 50
        assert not conn.is_closed()  # the connection serves on
        await conn.executemany("INSERT INTO many VALUES ($1, $2)", [(200, "one")])
        assert await conn.fetchval("SELECT s FROM many WHERE x = $1", 200) == "one"
