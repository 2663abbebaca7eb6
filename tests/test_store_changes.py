"""The executors of ``store/changes.py``: each store runs a plan inside one
transaction of its own, so a change that fails after a write leaves nothing
of it; statements a store has no use for answer as if they found nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from qftrio.models import Status
from qftrio.models import to_datetime as when
from qftrio.server.store import changes, postgres, sqlite
from qftrio.server.store.base import NewJob, Store

T0 = 1_800_000_000.0


async def run_plan(storage: Store, make: Callable[[], changes.Plan[Any]]) -> Any:
    """*make*'s plan, driven by *storage*'s executor in one transaction."""
    if isinstance(storage, sqlite.SqliteStore):
        return await storage._run(lambda conn: sqlite._drive(conn, make()))
    assert isinstance(storage, postgres.PostgresStore)
    return await postgres._run_plan(storage._db, make)


async def test_a_change_that_fails_after_a_write_leaves_nothing(storage: Store) -> None:
    (inserted,) = await storage.jobs_insert(
        [NewJob(tenant="t", queue="q", kind="k", payload={}, scheduled_at=T0)], now=T0
    )
    job_id = inserted.id

    def cancel_then_fail() -> changes.Plan[None]:
        cancelled = yield changes.Call("job_cancel", (job_id, T0 + 1), changes.Want.JOB)
        assert cancelled.status is Status.CANCELLED  # written, inside the transaction
        raise RuntimeError("a later step of the change failed")

    with pytest.raises(RuntimeError, match="a later step"):
        await run_plan(storage, cancel_then_fail)
    job = await storage.job_get(job_id)
    assert job is not None and (job.status, job.updated_at) == (Status.PENDING, when(T0))


async def test_answers_are_mapped_to_shared_records(storage: Store) -> None:
    (inserted,) = await storage.jobs_insert(
        [NewJob(tenant="t", queue="q", kind="k", payload={"n": 1}, scheduled_at=T0)], now=T0
    )

    def read() -> changes.Plan[tuple[Any, ...]]:
        job = yield changes.Call("job_get", (inserted.id,), changes.Want.JOB)
        status = yield changes.Call("job_lock_status", (inserted.id, "t"), changes.Want.VALUE)
        missing = yield changes.Call("job_lock_status", (inserted.id, "other tenant"), changes.Want.VALUE)
        rows = yield changes.Call("bulk_lock", ([inserted.id], "t"), changes.Want.ROWS)
        # a statement SQLite has no use for (it locks nothing) answers the empty shape
        locked = yield changes.Call("reap_lock_workflows", (T0,), changes.Want.ROWS)
        return job, status, missing, rows, locked

    job, status, missing, rows, locked = await run_plan(storage, read)
    assert (job.id, job.payload, status, missing) == (inserted.id, {"n": 1}, "pending", None)
    assert rows == [(inserted.id, "pending", "q", None)]  # ids as str on both stores
    assert locked == []
