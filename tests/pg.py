"""PostgreSQL for tests: a fresh, empty, migrated store per test.

The database comes from ``QFTRIO_TEST_DATABASE_URL`` (``scripts/test`` starts
a throwaway cluster and sets it). The schema is migrated once per process;
each store then starts from emptied tables (``TRUNCATE``), which takes a few
milliseconds. Tests using this must not run in parallel on one database.

Client-side timeouts are off (``timeout=None``): trio-asyncio's loop reads
Trio's clock, and under ``autojump_clock`` any such timeout would fire while
PostgreSQL is still answering (see :mod:`qftrio.server.store.pgasync`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import trio_asyncio

from qftrio.server.store.postgres import PostgresStore, migrate, open_postgres_store

__all__ = ["pg_url", "open_test_postgres_store", "maybe_asyncio_loop", "reset_database"]

_migrated: set[str] = set()


def pg_url() -> str | None:
    """The test database's URL, or None when PostgreSQL tests are off."""
    return os.environ.get("QFTRIO_TEST_DATABASE_URL") or None


@contextlib.asynccontextmanager
async def maybe_asyncio_loop() -> AsyncIterator[None]:
    """Open a trio-asyncio loop unless the current context already has one."""
    if trio_asyncio.current_loop.get() is not None:
        yield
        return
    async with trio_asyncio.open_loop():
        yield


async def reset_database(url: str) -> None:
    """Migrate *url* (once per process) and empty every qftrio table except
    the migrations ledger. Must run inside a trio-asyncio loop."""
    if url not in _migrated:
        await migrate(url, timeout=None)
        _migrated.add(url)

    async def truncate() -> None:
        conn = await asyncpg.connect(url, timeout=None)
        try:
            await conn.execute("SET lock_timeout = '10s'")
            tables = await conn.fetch(
                """SELECT quote_ident(tablename) AS name FROM pg_tables
                WHERE schemaname = current_schema() AND tablename LIKE 'qftrio\\_%'
                  AND tablename <> 'qftrio_schema_migrations'"""
            )
            if tables:
                await conn.execute(f"TRUNCATE {', '.join(t['name'] for t in tables)} CASCADE")
        finally:
            await conn.close()

    await trio_asyncio.aio_as_trio(truncate)()


@contextlib.asynccontextmanager
async def open_test_postgres_store(**options: Any) -> AsyncIterator[PostgresStore]:
    """A fresh, empty, migrated :class:`PostgresStore` on the test database.

    Opens a trio-asyncio loop around itself if none is running. *options* go
    to :func:`open_postgres_store` (e.g. ``pool_size``).
    """
    url = pg_url()
    if url is None:
        import pytest

        pytest.skip("QFTRIO_TEST_DATABASE_URL is not set")
    options.setdefault("pool_size", 5)
    options.setdefault("timeout", None)
    async with maybe_asyncio_loop():
        await reset_database(url)
        async with open_postgres_store(url, migrate=False, **options) as store:
            yield store
