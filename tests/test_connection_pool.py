"""The store's pool of asyncpg connections (``pgasync.ConnectionPool``): a
connection is kept and reused between calls, no more than the pool's size
are open, a caller waits for one within its timeout, a connection in an
unknown state is closed rather than given to the next caller, and closing
waits for the connections in use. And what ``Database.run`` does with a
transaction conflict: it runs the operation again, up to three tries.

Each test runs its asyncio part on a loop of its own thread, as the store
does, against the real PostgreSQL of ``QFTRIO_TEST_DATABASE_URL``.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
import trio
import trio.testing

from qftrio import errors
from qftrio.server.store.pgasync import ConnectionPool, open_database

from .pg import on_asyncio, pg_url

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(pg_url() is None, reason="QFTRIO_TEST_DATABASE_URL is not set"),
]


def new_pool(max_size: int) -> ConnectionPool:
    url = pg_url()

    async def connect(timeout: float | None) -> asyncpg.Connection:
        return await asyncpg.connect(url, timeout=timeout)

    return ConnectionPool(connect, max_size)


async def backend(pool: ConnectionPool, query: str = "SELECT pg_backend_pid()") -> int:
    conn = await pool.acquire(10)
    try:
        value = await conn.fetchval(query)
    except asyncpg.PostgresError:
        pool.release(conn, reusable=True)
        raise
    pool.release(conn, reusable=True)
    return value


async def test_one_caller_at_a_time_reuses_one_connection() -> None:
    async def run() -> tuple[set[int], int]:
        pool = new_pool(4)
        pids = {await backend(pool) for _ in range(20)}
        size = pool.size
        await pool.close(10)
        return pids, size

    with trio.fail_after(30):
        pids, size = await on_asyncio(run)
    assert len(pids) == 1
    assert size == 1


async def test_no_more_connections_than_the_size_are_open_and_every_caller_is_served() -> None:
    async def run() -> tuple[list[int], int]:
        pool = new_pool(2)
        pids = await asyncio.gather(*(backend(pool) for _ in range(12)))
        size = pool.size
        await pool.close(10)
        return pids, size

    with trio.fail_after(30):
        pids, size = await on_asyncio(run)
    assert len(pids) == 12
    assert len(set(pids)) == 2
    assert size == 2


async def test_a_caller_waits_within_its_timeout_and_the_pool_serves_on() -> None:
    async def run() -> tuple[bool, int, int]:
        pool = new_pool(1)
        held = await pool.acquire(10)
        timed_out = False
        try:
            await pool.acquire(0.05)
        except TimeoutError:
            timed_out = True
        # a waiter is served as soon as the connection comes back
        waiting = asyncio.ensure_future(pool.acquire(10))
        await asyncio.sleep(0)
        pool.release(held, reusable=True)
        conn = await waiting
        same = conn is held
        pool.release(conn, reusable=True)
        pid = await backend(pool)
        await pool.close(10)
        return timed_out and same, pid, held.get_server_pid()

    with trio.fail_after(30):
        served, pid, held_pid = await on_asyncio(run)
    assert served
    assert pid == held_pid  # the timed-out waiter took nothing with it


async def test_a_connection_in_an_unknown_state_is_closed_and_an_error_of_the_server_is_not() -> None:
    async def run() -> tuple[int, int, int, bool]:
        pool = new_pool(1)
        first = await backend(pool)
        with pytest.raises(asyncpg.DivisionByZeroError):
            await backend(pool, "SELECT 1 / 0")
        after_server_error = await backend(pool)
        conn = await pool.acquire(10)
        pool.release(conn, reusable=False)  # say a client-side timeout cut its query
        closed = conn.is_closed()
        after_unknown = await backend(pool)
        await pool.close(10)
        return first, after_server_error, after_unknown, closed

    with trio.fail_after(30):
        first, after_server_error, after_unknown, closed = await on_asyncio(run)
    assert after_server_error == first
    assert closed
    assert after_unknown != first


async def test_a_connection_given_back_inside_a_transaction_is_closed() -> None:
    async def run() -> tuple[bool, int, int]:
        pool = new_pool(1)
        first = await backend(pool)
        conn = await pool.acquire(10)
        transaction = conn.transaction()
        await transaction.start()
        pool.release(conn, reusable=True)
        after = await backend(pool)
        await pool.close(10)
        return conn.is_closed(), first, after

    with trio.fail_after(30):
        closed, first, after = await on_asyncio(run)
    assert closed
    assert after != first


async def test_closing_waits_for_the_connection_in_use_then_refuses_callers() -> None:
    async def run() -> tuple[list[str], bool]:
        pool = new_pool(2)
        order: list[str] = []
        conn = await pool.acquire(10)

        async def finish_call() -> None:
            await conn.fetchval("SELECT 1")
            order.append("call done")
            pool.release(conn, reusable=True)

        call = asyncio.ensure_future(finish_call())
        await asyncio.sleep(0)
        await pool.close(10)
        order.append("closed")
        await call
        refused = False
        try:
            await pool.acquire(10)
        except asyncpg.InterfaceError:
            refused = True
        return order, refused and conn.is_closed()

    with trio.fail_after(30):
        order, refused = await on_asyncio(run)
    assert order == ["call done", "closed"]
    assert refused


async def test_an_operation_that_meets_a_conflict_runs_again_then_the_database_is_too_busy(autojump_clock: trio.testing.MockClock) -> None:
    tries: list[int] = []

    async def conflicts(conn: asyncpg.Connection, times: int) -> int:
        tries.append(await conn.fetchval("SELECT pg_backend_pid()"))
        if len(tries) <= times:
            raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
        return len(tries)

    url = pg_url()
    assert url is not None
    # the waits between tries are on the virtual clock (no trio.fail_after:
    # it would expire while Trio waits for the loop's thread)
    async with open_database(url, max_size=1, timeout=10) as db:
        assert await db.run(conflicts, 2) == 3
        assert len(set(tries)) == 1  # the connection was kept: PostgreSQL answered each time
        tries.clear()
        with pytest.raises(errors.Unavailable, match="too busy"):
            await db.run(conflicts, 3)
        assert len(tries) == 3
