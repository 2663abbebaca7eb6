"""Fixtures shared by the suites: stores of every backend, engines, and a
real server on a real port."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from qftrio.server.engine import Engine
from qftrio.server.store.base import Store
from qftrio.server.store.sqlite import open_sqlite_store

#: A fixed wall-clock origin for engines driven by Trio's clock.
EPOCH = 1_800_000_000.0

BACKENDS = ["sqlite", "postgres"]


async def _open_store(backend: str, tmp_path: Path) -> AsyncIterator[Store]:
    if backend == "sqlite":
        async with open_sqlite_store(tmp_path / "qftrio.db") as store:
            yield store
    else:
        if not os.environ.get("QFTRIO_TEST_DATABASE_URL"):
            pytest.skip("QFTRIO_TEST_DATABASE_URL is not set")
        from .pg import open_test_postgres_store

        async with open_test_postgres_store() as store:
            yield store


@pytest.fixture(params=BACKENDS)
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh, empty store of each backend."""
    async for store in _open_store(request.param, tmp_path):
        yield store


@pytest.fixture
async def engine(storage: Store) -> Engine:
    """An engine whose wall clock follows Trio's clock."""
    return Engine(storage, clock=lambda: EPOCH + trio.current_time())
