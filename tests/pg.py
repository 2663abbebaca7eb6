"""PostgreSQL for tests: a fresh, empty, migrated store per test.

The database comes from ``QFTRIO_TEST_DATABASE_URL`` (``scripts/test`` starts
a throwaway cluster and sets it). The schema is migrated once per process;
each store then starts from emptied tables (``TRUNCATE``), which takes a few
milliseconds. Tests using this must not run in parallel on one database:
under pytest-xdist each worker has a database of its own (tests/conftest.py).

Client-side timeouts are off (``timeout=None``): they run in real time (see
:mod:`qftrio.server.store.pgtrio`), and a test that stops PostgreSQL on
purpose should wait on its own bound.

:func:`connection` opens a test's own connection, as the store opens its
own; :func:`on_asyncio` runs a test's own asyncpg code (an application's, in
the documented examples) on an asyncio loop of its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import trio

from qftrio.server.store import pgtrio
from qftrio.server.store.postgres import PostgresStore, migrate, open_postgres_store

__all__ = ["pg_url", "open_test_postgres_store", "connection", "on_asyncio", "reset_database"]

T = TypeVar("T")

_migrated: set[str] = set()


def pg_url() -> str | None:
    """The test database's URL, or None when PostgreSQL tests are off."""
    return os.environ.get("QFTRIO_TEST_DATABASE_URL") or None


async def on_asyncio(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)`` on an asyncio loop of its own thread, for the
    duration of the call."""
    return await trio.to_thread.run_sync(asyncio.run, fn(*args))


@contextlib.asynccontextmanager
async def connection(url: str) -> AsyncIterator[pgtrio.Connection]:
    """A connection of the test's own to *url*, closed on the way out."""
    async with pgtrio.open_watchdog() as watchdog:
        conn = await pgtrio.connect(url, watchdog=watchdog, timeout=10)
        try:
            yield conn
        finally:
            conn.terminate()


async def reset_database(url: str) -> None:
    """Migrate *url* (once per process) and empty every qftrio table except
    the migrations ledger."""
    if url not in _migrated:
        await migrate(url, timeout=None)
        _migrated.add(url)

    async with connection(url) as conn:
        await conn.execute("SET lock_timeout = '10s'")
        tables = await conn.fetch(
            """SELECT quote_ident(tablename) AS name FROM pg_tables
            WHERE schemaname = current_schema() AND tablename LIKE 'qftrio\\_%'
              AND tablename <> 'qftrio_schema_migrations'"""
        )
        if tables:
            await conn.execute(f"TRUNCATE {', '.join(t['name'] for t in tables)} CASCADE")


@contextlib.asynccontextmanager
async def open_test_postgres_store(**options: Any) -> AsyncIterator[PostgresStore]:
    """A fresh, empty, migrated :class:`PostgresStore` on the test database.

    *options* go to :func:`open_postgres_store` (e.g. ``pool_size``).
    """
    url = pg_url()
    if url is None:
        import pytest

        pytest.skip("QFTRIO_TEST_DATABASE_URL is not set")
    options.setdefault("pool_size", 5)
    options.setdefault("timeout", None)
    await reset_database(url)
    async with open_postgres_store(url, migrate=False, **options) as store:
        yield store
