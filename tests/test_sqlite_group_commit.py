"""The embedded store's group commit: concurrent calls share one transaction,
each in a savepoint of its own, so a call that raises rolls back only itself
and every call returns only once its commit is on disk."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio
import trio.testing

from qftrio.server.store.sqlite import open_sqlite_store


async def test_a_failing_call_of_a_group_rolls_back_only_itself(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "q.db") as store:
        await store._run(lambda conn: conn.execute("CREATE TABLE scratch (n INTEGER)"))

        def ok(n: int):
            def fn(conn: sqlite3.Connection) -> int:
                conn.execute("INSERT INTO scratch VALUES (?)", (n,))
                return n

            return fn

        def bad(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO scratch VALUES (999)")
            raise ValueError("refused")

        results: dict[int, int] = {}
        errors: list[BaseException] = []

        async def call(n: int) -> None:
            if n == 7:
                with pytest.raises(ValueError, match="refused"):
                    await store._run(bad)
                errors.append(ValueError())
            else:
                results[n] = await store._run(ok(n))

        async with trio.open_nursery() as nursery:
            for n in range(30):
                nursery.start_soon(call, n)

        assert results == {n: n for n in range(30) if n != 7} and len(errors) == 1
        rows = await store._run(lambda conn: sorted(r[0] for r in conn.execute("SELECT n FROM scratch")))
        assert rows == [n for n in range(30) if n != 7]
    # durable: what was acknowledged is in the file
    with sqlite3.connect(tmp_path / "q.db") as conn:
        assert conn.execute("SELECT count(*) FROM scratch").fetchone()[0] == 29


async def test_calls_made_during_a_commit_go_together_in_the_next(tmp_path: Path) -> None:
    async with open_sqlite_store(tmp_path / "q.db") as store:
        await store._run(lambda conn: conn.execute("CREATE TABLE scratch (n INTEGER)"))
        first_running = trio.Event()
        release = trio.Event()
        token = trio.lowlevel.current_trio_token()
        groups: list[int] = []

        def slow(conn: sqlite3.Connection) -> None:
            token.run_sync_soon(first_running.set)
            trio.from_thread.run(release.wait, trio_token=token)

        outside = sqlite3.connect(tmp_path / "q.db", check_same_thread=False)

        def record(conn: sqlite3.Connection) -> None:
            # rows this transaction sees, and rows committed (another connection)
            conn.execute("INSERT INTO scratch VALUES (1)")
            seen = conn.execute("SELECT count(*) FROM scratch").fetchone()[0]
            groups.append((seen, outside.execute("SELECT count(*) FROM scratch").fetchone()[0]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(store._run, slow)
            await first_running.wait()
            for _ in range(5):
                nursery.start_soon(store._run, record)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        outside.close()
        # the five waited together and ran one after another in one
        # transaction: nothing of it was committed until all had run
        assert groups == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0)]
