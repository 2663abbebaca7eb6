"""The store's pool of connections (``pgtrio.ConnectionPool``): a connection
is kept and reused between calls, no more than the pool's size are open, a
caller waits for one within its timeout (real time, on Trio's virtual clock
too), a connection in an unknown state is closed rather than given to the
next caller, and closing waits for the connections in use. And what
``Database.run`` does with a transaction conflict: it runs the operation
again, up to three tries.

Against the real PostgreSQL of ``QFTRIO_TEST_DATABASE_URL``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg.errors
import pytest
import trio
import trio.testing

from qftrio import errors
from qftrio.server.store.pgtrio import Connection, ConnectionPool, connect, open_database, open_watchdog

from .pg import pg_url

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(pg_url() is None, reason="QFTRIO_TEST_DATABASE_URL is not set"),
]


@asynccontextmanager
async def new_pool(max_size: int) -> AsyncIterator[ConnectionPool]:
    url = pg_url()
    assert url is not None
    async with open_watchdog() as watchdog:

        async def open_one(timeout: float | None) -> Connection:
            return await connect(url, watchdog=watchdog, timeout=timeout)

        pool = ConnectionPool(open_one, max_size, watchdog)
        try:
            yield pool
        finally:
            await pool.close(10)


async def backend(pool: ConnectionPool, query: str = "SELECT pg_backend_pid()") -> int:
    conn = await pool.acquire(10)
    try:
        value = await conn.fetchval(query)
    except psycopg.Error:
        pool.release(conn, reusable=True)
        raise
    pool.release(conn, reusable=True)
    return value


async def test_one_caller_at_a_time_reuses_one_connection() -> None:
    with trio.fail_after(30):
        async with new_pool(4) as pool:
            pids = {await backend(pool) for _ in range(20)}
            assert len(pids) == 1
            assert pool.size == 1


async def test_no_more_connections_than_the_size_are_open_and_every_caller_is_served() -> None:
    pids: list[int] = []

    async def call(pool: ConnectionPool) -> None:
        pids.append(await backend(pool, "SELECT pg_backend_pid() FROM pg_sleep(0.01)"))

    with trio.fail_after(30):
        async with new_pool(2) as pool:
            async with trio.open_nursery() as nursery:
                for _ in range(12):
                    nursery.start_soon(call, pool)
            assert pool.size == 2
    assert len(pids) == 12
    assert len(set(pids)) == 2


async def test_a_caller_waits_within_its_timeout_and_the_pool_serves_on(autojump_clock: trio.testing.MockClock) -> None:
    # on the virtual clock, which jumps while every task waits: the
    # timeout is real time all the same
    async with new_pool(1) as pool:
        held = await pool.acquire(10)
        with pytest.raises(TimeoutError):
            await pool.acquire(0.05)
        # a waiter is served as soon as the connection comes back
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                conn = await pool.acquire(10)
                assert conn is held
                pool.release(conn, reusable=True)

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            pool.release(held, reusable=True)
        assert await backend(pool) == held.get_server_pid()  # the timed-out waiter took nothing with it


async def test_a_connection_in_an_unknown_state_is_closed_and_an_error_of_the_server_is_not() -> None:
    with trio.fail_after(30):
        async with new_pool(1) as pool:
            first = await backend(pool)
            with pytest.raises(psycopg.errors.DivisionByZero):
                await backend(pool, "SELECT 1 / 0")
            assert await backend(pool) == first
            conn = await pool.acquire(10)
            pool.release(conn, reusable=False)  # say a client-side timeout cut its query
            assert conn.is_closed()
            assert await backend(pool) != first


async def test_a_connection_given_back_inside_a_transaction_is_closed() -> None:
    with trio.fail_after(30):
        async with new_pool(1) as pool:
            first = await backend(pool)
            conn = await pool.acquire(10)
            await conn.transaction().start()
            pool.release(conn, reusable=True)
            assert await backend(pool) != first
            assert conn.is_closed()


async def test_a_call_cancelled_mid_statement_leaves_its_connection_idle() -> None:
    with trio.fail_after(30):
        async with new_pool(1) as pool:
            conn = await pool.acquire(10)
            with trio.move_on_after(0.05) as scope:
                async with conn.transaction():
                    await conn.execute("CREATE TEMP TABLE cancelled (x int)")
                    await conn.fetchval("SELECT pg_sleep(0.3)")
            assert scope.cancelled_caught
            # the statement finished, then the transaction was rolled back
            assert not conn.is_closed() and not conn.is_in_transaction()
            assert await conn.fetchval("SELECT to_regclass('cancelled') IS NULL")
            pool.release(conn, reusable=True)
            assert await backend(pool) == conn.get_server_pid()


async def test_closing_waits_for_the_connection_in_use_then_refuses_callers() -> None:
    order: list[str] = []
    with trio.fail_after(30):
        async with new_pool(2) as pool:
            conn = await pool.acquire(10)

            async def finish_call() -> None:
                await conn.fetchval("SELECT pg_sleep(0.05)")
                order.append("call done")
                pool.release(conn, reusable=True)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(finish_call)
                await trio.testing.wait_all_tasks_blocked()
                await pool.close(10)
                order.append("closed")
            with pytest.raises(psycopg.InterfaceError):
                await pool.acquire(10)
            assert conn.is_closed()
    assert order == ["call done", "closed"]


async def test_closing_cuts_a_connection_still_busy_after_its_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with new_pool(1) as pool:
        conn = await pool.acquire(10)
        await pool.close(0.2)  # real time, while the virtual clock jumps
        assert conn.is_closed()


async def test_an_operation_that_meets_a_conflict_runs_again_then_the_database_is_too_busy(autojump_clock: trio.testing.MockClock) -> None:
    tries: list[int] = []

    async def conflicts(conn: Connection, times: int) -> int:
        tries.append(await conn.fetchval("SELECT pg_backend_pid()"))
        if len(tries) <= times:
            raise psycopg.errors.DeadlockDetected("deadlock detected")
        return len(tries)

    url = pg_url()
    assert url is not None
    # the waits between tries are on the virtual clock, the database's on real time
    async with open_database(url, max_size=1, timeout=10) as db:
        assert await db.run(conflicts, 2) == 3
        assert len(set(tries)) == 1  # the connection was kept: PostgreSQL answered each time
        tries.clear()
        with pytest.raises(errors.Unavailable, match="too busy"):
            await db.run(conflicts, 3)
        assert len(tries) == 3

