"""The PostgreSQL store: several ``qftrio serve`` processes on one database.

asyncpg runs through trio-asyncio (see :mod:`.pgasync`), so the whole program
must run inside ``async with trio_asyncio.open_loop():``. Open the store with
:func:`open_postgres_store`; apply the schema with :func:`migrate` (which
``open_postgres_store`` does by default).

How the rules of :mod:`.base` are kept with many servers at once:

* Claims are one statement: candidates are picked with ``FOR UPDATE SKIP
  LOCKED``, so concurrent claimers never wait on each other and never take the
  same row; the partial index ``qftrio_jobs_claim_idx`` keeps a claim's cost
  independent of how many finished jobs the table holds.
* Heartbeats and completions are one statement per batch (``unnest`` arrays),
  which locks the rows, checks each lease token and updates in one go.
  Failures lock the rows (``SELECT ... FOR UPDATE``), ask the engine's
  ``retry_at`` in Python, and update, in one transaction. Batches lock rows in
  id order, so two batches never deadlock.
* The janitor (``jobs_reap_expired``, ``jobs_prune``) skips rows another
  server is working on (``SKIP LOCKED``), so janitors do not collide.
* Workflows (migration 0002) advance inside the job transactions that cause
  it, as :mod:`.base` requires. A transaction that touches a workflow locks
  its row (``FOR UPDATE``, in id order) *before* any of its jobs; heartbeats
  and claims lock jobs only and never wait for a workflow, so no cycle of
  waits can form. Concurrent completions of one workflow's steps thus take
  turns on its row, which keeps the context merge and the counts exact.
* Whatever makes work ready (an insert, a retry, a fail with a retry, a reap,
  a workflow step unblocked) sends ``NOTIFY qftrio_jobs, '<queue>'`` in its own transaction, so the
  notification is delivered if and only if the change commits. Each server
  holds one LISTEN connection (:meth:`PostgresStore.run_listener`).

Times are ``double precision`` epoch seconds: the floats the interface passes,
stored exactly.
"""

from __future__ import annotations

import logging
import random
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import asyncpg
import trio

from ... import _json, errors
from ...models import (
    STATUS_OF,
    ErrorEntry,
    Job,
    Lease,
    QueueStats,
    Status,
    StepStatus,
    Workflow,
    WorkflowStatus,
    WorkflowStep,
)
from . import pgasync
from .base import (
    ALL_QUEUES,
    LEASE_EXPIRED,
    WORKFLOW_QUEUE,
    ClaimRequest,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    HeartbeatResult,
    Inserted,
    NewJob,
    NewWorkflow,
    Outcome,
    Reaped,
    ReportResult,
    RetryAt,
    Store,
)

__all__ = ["PostgresStore", "open_postgres_store", "migrate", "pending_migrations", "CHANNEL", "ALL_QUEUES"]

log = logging.getLogger("qftrio.store.postgres")

#: The NOTIFY channel; the payload is a queue name.
CHANNEL = "qftrio_jobs"

#: What :meth:`PostgresStore.run_listener` passes to ``on_notify`` when it may
#: have missed notifications (its connection was lost and came back): wake
#: every queue.

#: ``pg_advisory_lock`` key held while migrating (any constant unique to qftrio).
MIGRATION_LOCK_KEY = 0x71F7_0001

_JOB_COLUMNS = (
    "id, tenant, queue, kind, payload, status, priority, attempt, max_attempts, scheduled_at, created_at, "
    "updated_at, locked_until, worker_id, lease_token, result, error, errors, idempotency_key, workflow_id, step, "
    "context"
)


# -- helpers ------------------------------------------------------------------


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uuid_param(value: str) -> str | None:
    """:func:`_uuid` for values only passed as ``uuid`` parameters (asyncpg
    takes the text): the reports' hot path, without building UUID objects."""
    return value if _CANONICAL_UUID.fullmatch(value) else None


def _uuid(value: str | None) -> uuid.UUID | None:
    """*value* as a UUID if it is one in canonical form, else None: ids and
    tokens are compared as the strings qftrio issued."""
    if not isinstance(value, str):
        return None
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return None
    return parsed if str(parsed) == value else None


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; an error message from a worker might.
    return value.replace("\x00", "\ufffd")


def _job(row: asyncpg.Record) -> Job:
    # One per claimed job: a dict lookup for the status, and no generator for
    # an empty error history, take it from 4.6 to 3.5 µs.
    workflow_id = row["workflow_id"]
    history = row["errors"]
    return Job(
        id=str(row["id"]),
        tenant=row["tenant"],
        queue=row["queue"],
        kind=row["kind"],
        payload=row["payload"],
        status=STATUS_OF[row["status"]],
        priority=row["priority"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        scheduled_at=row["scheduled_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        locked_until=row["locked_until"],
        worker_id=row["worker_id"],
        result=row["result"],
        error=row["error"],
        errors=tuple(ErrorEntry(attempt=int(e["attempt"]), error=str(e["error"]), at=float(e["at"])) for e in history)
        if history
        else (),
        workflow_id=None if workflow_id is None else str(workflow_id),
        step=row["step"],
        context=row["context"],
    )


async def _notify(conn: asyncpg.Connection, queues: Sequence[str] | set[str]) -> None:
    # asyncio-flavoured; inside the caller's transaction, so it is delivered on commit only
    if queues:
        await conn.execute("SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q", CHANNEL, sorted(queues))


# -- migrations -------------------------------------------------------------------


def _migration_files() -> list[tuple[str, str, str]]:
    """``(version, name, sql)`` of every migration shipped, in order."""
    folder = resources.files(__package__).joinpath("migrations").joinpath("postgres")
    out = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            stem = entry.name[: -len(".sql")]
            version, _, name = stem.partition("_")
            out.append((version, stem, entry.read_text(encoding="utf-8")))
    out.sort()
    return out


async def _applied_versions(conn: asyncpg.Connection) -> set[str] | None:
    exists = await conn.fetchval("SELECT to_regclass('qftrio_schema_migrations') IS NOT NULL")
    if not exists:
        return None
    return {r["version"] for r in await conn.fetch("SELECT version FROM qftrio_schema_migrations")}


async def _migrate_on(conn: asyncpg.Connection) -> list[str]:
    # asyncio-flavoured. The advisory lock serialises concurrent migrators
    # (several servers starting at once); the second one finds nothing to do.
    await conn.execute("SET lock_timeout = '60s'")
    await conn.execute("SET statement_timeout = 0")
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS qftrio_schema_migrations (
                version text PRIMARY KEY,
                name text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )"""
        )
        applied = await _applied_versions(conn) or set()
        done = []
        known = set()
        for version, name, sql in _migration_files():
            known.add(version)
            if version in applied:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO qftrio_schema_migrations (version, name) VALUES ($1, $2)", version, name
                )
            log.info("applied migration %s", name)
            done.append(name)
        unknown = applied - known
        if unknown:
            log.warning("the database has migrations this qftrio does not know: %s", ", ".join(sorted(unknown)))
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
        await conn.execute("RESET lock_timeout; RESET statement_timeout")


async def _pending_on(conn: asyncpg.Connection) -> list[str]:
    applied = await _applied_versions(conn) or set()
    return [name for version, name, _ in _migration_files() if version not in applied]


async def migrate(url: str, *, timeout: float | None = 10.0) -> list[str]:
    """Apply the migrations *url* lacks; return their names (e.g.
    ``["0001_init"]``), empty when the schema is current.

    Safe to run from several processes at once: a PostgreSQL advisory lock
    makes them take turns.

    Raises:
        Unavailable: the database cannot be reached.
    """
    async with pgasync.open_database(url, max_size=1, timeout=timeout, statement_timeout=None) as db:
        return await db.run(_migrate_on, transaction=False)


async def pending_migrations(url: str, *, timeout: float | None = 10.0) -> list[str]:
    """The names of the migrations *url* lacks."""
    async with pgasync.open_database(url, max_size=1, timeout=timeout, statement_timeout=None) as db:
        return await db.run(_pending_on, transaction=False)


# -- the store ----------------------------------------------------------------------


_CLAIM_SQL = f"""
WITH ready AS (
    SELECT id, status, priority, scheduled_at, created_at FROM qftrio_jobs
    WHERE queue = $1 AND status = 'pending' AND scheduled_at <= $2
    ORDER BY priority DESC, scheduled_at, created_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT id, status, priority, scheduled_at, created_at FROM qftrio_jobs
    WHERE queue = $1 AND status = 'running' AND locked_until < $2 AND attempt < max_attempts
    ORDER BY priority DESC, scheduled_at, created_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), chosen AS (
    SELECT * FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) AS c
    ORDER BY priority DESC, scheduled_at, created_at
    LIMIT $3
)
UPDATE qftrio_jobs AS j SET
    status = 'running',
    attempt = j.attempt + 1,
    locked_until = $2 + $4::float8,
    lease_token = gen_random_uuid(),
    worker_id = $5,
    updated_at = $2,
    error = CASE WHEN c.status = 'running' THEN $6 ELSE j.error END,
    errors = CASE WHEN c.status = 'running'
        THEN j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'error', $6::text, 'at', $2))
        ELSE j.errors END
FROM chosen AS c
WHERE j.id = c.id
RETURNING {", ".join("j." + c.strip() for c in _JOB_COLUMNS.split(","))}
"""

def _leases(rows: Sequence[asyncpg.Record]) -> list[Lease]:
    """Claimed rows as leases, in lease order."""
    leases = [Lease(job=_job(row), lease_token=str(row["lease_token"])) for row in rows]
    leases.sort(key=lambda lease: (-lease.job.priority, lease.job.scheduled_at, lease.job.created_at))
    return leases


# Insert a parked long-poll's queue's new jobs, those it takes (the due ones,
# in lease order, up to its limit) claimed already, unless something older
# is claimable in the queue; NOTIFY the queue if any stay pending.
_INSERT_HANDING_OVER_SQL = f"""
WITH older AS (
    SELECT EXISTS (
        SELECT 1 FROM qftrio_jobs WHERE queue = $3 AND status = 'pending' AND scheduled_at <= $4
    ) OR EXISTS (
        SELECT 1 FROM qftrio_jobs
        WHERE queue = $3 AND status = 'running' AND locked_until < $4 AND attempt < max_attempts
    ) AS found
), input AS (
    SELECT u.*, u.scheduled_at <= $4 AS due,
        row_number() OVER (PARTITION BY u.scheduled_at <= $4 ORDER BY u.priority DESC, u.scheduled_at, u.ord) AS rank
    FROM unnest($1::uuid[], $2::text[], $5::text[], $6::jsonb[], $7::int[], $8::int[], $9::float8[])
        WITH ORDINALITY AS u(id, tenant, kind, payload, priority, max_attempts, scheduled_at, ord)
), chosen AS (
    SELECT i.*, (i.due AND i.rank <= $10 AND NOT o.found) AS hand FROM input AS i CROSS JOIN older AS o
), inserted AS (
    INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, priority, max_attempts, scheduled_at,
        status, attempt, locked_until, lease_token, worker_id, created_at, updated_at)
    SELECT c.id, c.tenant, $3, c.kind, c.payload, c.priority, c.max_attempts, c.scheduled_at,
        CASE WHEN c.hand THEN 'running' ELSE 'pending' END,
        CASE WHEN c.hand THEN 1 ELSE 0 END,
        CASE WHEN c.hand THEN $4 + $11::float8 END,
        CASE WHEN c.hand THEN gen_random_uuid() END,
        CASE WHEN c.hand THEN $12::text END,
        $4, $4
    FROM chosen AS c
    RETURNING {_JOB_COLUMNS}
), notified AS (
    SELECT count(pg_notify($13, $3)) FROM (SELECT 1 FROM inserted WHERE status = 'pending' LIMIT 1) AS p
)
SELECT inserted.*, (SELECT found FROM older) AS older_found FROM inserted, notified
"""

def _page_query(
    columns: str,
    table: str,
    tenant: str,
    equal: dict[str, Any],
    before: tuple[float, str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """One page of a tenant's rows of *table*, newest first by ``(created_at,
    id)``, after the row *before*; *equal* maps columns to the value they
    must have (None: any)."""
    where = ["tenant = $1"]
    args: list[Any] = [tenant]

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    for column, value in equal.items():
        if value is not None:
            where.append(f"{column} = {arg(value)}")
    if before is not None:
        created_at, last_id = before
        key = _uuid(last_id)
        if key is None:
            raise errors.InvalidInput("cursor: not a cursor this server issued", code="invalid_cursor")
        where.append(f"(created_at, id) < ({arg(float(created_at))}::float8, {arg(key)}::uuid)")
    sql = f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} ORDER BY created_at DESC, id DESC LIMIT {arg(limit)}"
    return sql, args


_NEXT_AVAILABLE_SQL = """
SELECT least(
    (SELECT min(scheduled_at) FROM qftrio_jobs
     WHERE queue = $1 AND status = 'pending' AND scheduled_at > created_at AND scheduled_at > $2),
    (SELECT min(locked_until) FROM qftrio_jobs
     WHERE queue = $1 AND status = 'running' AND attempt < max_attempts))
"""

# Heartbeats the way completes go (``_COMPLETE_CURRENT_SQL``): the current
# leases are extended without being locked first, the other items take
# ``_HEARTBEAT_SQL``.
_HEARTBEAT_CURRENT_SQL = """
UPDATE qftrio_jobs AS j SET locked_until = $4 + i.extend, updated_at = $4
FROM unnest($1::uuid[], $2::uuid[], $3::float8[]) WITH ORDINALITY AS i(id, token, extend, ord)
WHERE j.id = i.id AND j.status = 'running' AND j.lease_token = i.token
RETURNING i.ord, j.locked_until
"""

# One statement per batch: lock the rows (id order), extend those whose token
# is current and that are running, and report every item's row as locked.
_HEARTBEAT_SQL = """
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::float8[]) WITH ORDINALITY AS i(id, token, extend, ord)
), locked AS (
    SELECT id, status, lease_token FROM qftrio_jobs
    WHERE id IN (SELECT id FROM items)
    ORDER BY id
    FOR UPDATE
), extended AS (
    UPDATE qftrio_jobs AS j SET locked_until = $4 + i.extend, updated_at = $4
    FROM items AS i JOIN locked AS l ON l.id = i.id
    WHERE j.id = i.id AND l.status = 'running' AND l.lease_token = i.token
      AND j.status = 'running' AND j.lease_token = i.token
    RETURNING j.id, j.locked_until
)
SELECT i.ord, l.status, coalesce(l.lease_token = i.token, false) AS current, e.locked_until
FROM items AS i
LEFT JOIN locked AS l ON l.id = i.id
LEFT JOIN extended AS e ON e.id = i.id
ORDER BY i.ord
"""

_COMPLETE_SQL = """
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) WITH ORDINALITY AS i(id, token, result, ord)
), locked AS (
    SELECT id, status, lease_token, queue FROM qftrio_jobs
    WHERE id IN (SELECT id FROM items)
    ORDER BY id
    FOR UPDATE
), completed AS (
    UPDATE qftrio_jobs AS j SET status = 'completed', result = i.result, locked_until = NULL, updated_at = $4
    FROM items AS i JOIN locked AS l ON l.id = i.id
    WHERE j.id = i.id AND l.status = 'running' AND l.lease_token = i.token
      AND j.status = 'running' AND j.lease_token = i.token
    RETURNING j.id, j.tenant, j.queue, j.workflow_id, j.step, j.result
)
SELECT i.ord, l.status, l.queue, coalesce(l.lease_token = i.token, false) AS current,
       c.id IS NOT NULL AS applied, c.tenant, c.workflow_id, c.step, c.result
FROM items AS i
LEFT JOIN locked AS l ON l.id = i.id
LEFT JOIN completed AS c ON c.id = i.id
ORDER BY i.ord
"""


# The common case: completes the running jobs outside workflows whose token
# is current, and says which (by position). No row is locked before its
# update, and nothing is read for the items it leaves: those (replays, stale
# tokens, unknown ids, workflow steps) go through ``_COMPLETE_PLAIN_SQL``
# after it. Locking each row first, for an outcome of every item, doubled the
# statement's cost (4.9 against 2.5 ms for 100 jobs).
_COMPLETE_CURRENT_SQL = """
UPDATE qftrio_jobs AS j SET status = 'completed', result = i.result, locked_until = NULL, updated_at = $4
FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) WITH ORDINALITY AS i(id, token, result, ord)
WHERE j.id = i.id AND j.status = 'running' AND j.lease_token = i.token AND j.workflow_id IS NULL
RETURNING i.ord, j.queue
"""

# Every outcome, in one statement: completes jobs outside
# workflows. Workflow steps are only reported (``step``): they complete in a
# transaction that locks their workflow first (``_COMPLETE_SQL``). A job's
# workflow never changes, so telling them apart needs no lock.
_COMPLETE_PLAIN_SQL = """
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) WITH ORDINALITY AS i(id, token, result, ord)
), steps AS (
    SELECT id FROM qftrio_jobs WHERE id IN (SELECT id FROM items) AND workflow_id IS NOT NULL
), locked AS (
    SELECT id, status, lease_token, queue FROM qftrio_jobs
    WHERE id IN (SELECT id FROM items) AND workflow_id IS NULL
    ORDER BY id
    FOR UPDATE
), completed AS (
    UPDATE qftrio_jobs AS j SET status = 'completed', result = i.result, locked_until = NULL, updated_at = $4
    FROM items AS i JOIN locked AS l ON l.id = i.id
    WHERE j.id = i.id AND l.status = 'running' AND l.lease_token = i.token
      AND j.status = 'running' AND j.lease_token = i.token
    RETURNING j.id
)
SELECT i.ord, l.status, l.queue, coalesce(l.lease_token = i.token, false) AS current,
       c.id IS NOT NULL AS applied, s.id IS NOT NULL AS step
FROM items AS i
LEFT JOIN locked AS l ON l.id = i.id
LEFT JOIN completed AS c ON c.id = i.id
LEFT JOIN steps AS s ON s.id = i.id
ORDER BY i.ord
"""

# -- workflows ----------------------------------------------------------------------
# asyncio-flavoured helpers that run inside the caller's transaction. Lock
# order: a workflow's row (FOR UPDATE, in id order) before any of its jobs.

_WORKFLOW_COLUMNS = "id, tenant, name, status, context, created_at, updated_at"

#: ``rule(conn, job id, workflow id, job status)``, asyncio-flavoured: what a
#: job transition does to the job's workflow (:meth:`PostgresStore._owned_transition`).
_StepRule = Callable[[asyncpg.Connection, uuid.UUID, uuid.UUID, Status], Awaitable["Job | None"]]

_LOCK_WORKFLOWS_OF_JOBS_SQL = """
SELECT id FROM qftrio_workflows
WHERE id IN (SELECT workflow_id FROM qftrio_jobs WHERE id = ANY($1::uuid[]) AND workflow_id IS NOT NULL)
ORDER BY id
FOR UPDATE
"""


async def _lock_workflows_of_jobs(conn: asyncpg.Connection, job_ids: Sequence[uuid.UUID | None]) -> None:
    """Lock the workflows of *job_ids* before the jobs themselves are locked
    (a job's workflow never changes, so reading it unlocked is safe)."""
    keys = [k for k in job_ids if k is not None]
    if keys:
        await conn.execute(_LOCK_WORKFLOWS_OF_JOBS_SQL, keys)


async def _enqueue_steps(
    conn: asyncpg.Connection, workflow_id: uuid.UUID, tenant: str, names: Sequence[str], context: Any, now: float
) -> None:
    """Give the waiting steps *names* their jobs, carrying *context*."""
    if not names:
        return
    # a CTE with a volatile function is materialised once: both statements
    # see the same new ids
    await conn.execute(
        """WITH ready AS (
            SELECT s.name, s.kind, s.payload, s.max_attempts, s.position, gen_random_uuid() AS job_id
            FROM qftrio_workflow_steps AS s
            WHERE s.workflow_id = $1 AND s.name = ANY($2::text[]) AND s.state = 'waiting'
        ), inserted AS (
            INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts,
                scheduled_at, created_at, updated_at, workflow_id, step, context)
            SELECT job_id, $3, $4, kind, payload, 'pending', 0, 0, max_attempts, $5, $5, $5, $1, name, $6::jsonb
            FROM ready ORDER BY position
            RETURNING 1
        )
        UPDATE qftrio_workflow_steps AS s SET state = 'enqueued', job_id = r.job_id
        FROM ready AS r
        WHERE s.workflow_id = $1 AND s.name = r.name""",
        workflow_id,
        list(names),
        tenant,
        WORKFLOW_QUEUE,
        now,
        context,
    )


async def _step_completed(conn: asyncpg.Connection, workflow_id: uuid.UUID, step: str, result: Any, now: float) -> bool:
    """Record that *step*'s job completed with *result* (the workflow row is
    locked): merge it into the context, unblock the steps waiting for it,
    finish the workflow after its last step. Touches only the steps that
    depend on *step*. Returns whether it enqueued any job."""
    row = await conn.fetchrow(
        """UPDATE qftrio_workflows SET context = context || $2::jsonb, steps_completed = steps_completed + 1,
            updated_at = $3
        WHERE id = $1
        RETURNING tenant, status, context, steps_total, steps_completed""",
        workflow_id,
        result if isinstance(result, dict) else {},
        now,
    )
    if row is None:
        return False
    unblocked = await conn.fetch(
        """UPDATE qftrio_workflow_steps SET remaining = remaining - 1
        WHERE workflow_id = $1
          AND name IN (SELECT dependent FROM qftrio_workflow_edges WHERE workflow_id = $1 AND step = $2)
        RETURNING name, remaining, state""",
        workflow_id,
        step,
    )
    if row["status"] != WorkflowStatus.RUNNING.value:
        # A step of a workflow that is not running cannot complete (its job
        # was cancelled with it); were it to, its dependents wait for a resume.
        return False
    ready = [r["name"] for r in unblocked if r["remaining"] == 0 and r["state"] == "waiting"]
    await _enqueue_steps(conn, workflow_id, row["tenant"], ready, row["context"], now)
    if row["steps_completed"] >= row["steps_total"]:
        await conn.execute("UPDATE qftrio_workflows SET status = 'completed' WHERE id = $1", workflow_id)
    return bool(ready)


async def _end_workflow(conn: asyncpg.Connection, workflow_id: uuid.UUID, status: WorkflowStatus, now: float) -> None:
    """Fail or cancel a running workflow with its unfinished steps (a no-op if
    it is not running; the workflow row is locked)."""
    ended = await conn.fetchval(
        "UPDATE qftrio_workflows SET status = $2, updated_at = $3 WHERE id = $1 AND status = 'running' RETURNING 1",
        workflow_id,
        status.value,
        now,
    )
    if ended is None:
        return
    # The lease token and locked_until stay, as for any cancel: a late
    # heartbeat of a running step is told "cancelled".
    await conn.execute(
        """UPDATE qftrio_jobs SET status = 'cancelled', updated_at = $2
        WHERE workflow_id = $1 AND status IN ('pending', 'running')""",
        workflow_id,
        now,
    )
    await conn.execute(
        "UPDATE qftrio_workflow_steps SET state = 'cancelled' WHERE workflow_id = $1 AND state = 'waiting'",
        workflow_id,
    )


async def _resume_workflow(conn: asyncpg.Connection, workflow_id: uuid.UUID, failed_job: uuid.UUID, now: float) -> None:
    """Run a failed workflow again from its failed step (the workflow row is
    locked): see :meth:`PostgresStore.job_retry`."""
    row = await conn.fetchrow(
        "UPDATE qftrio_workflows SET status = 'running', updated_at = $2 WHERE id = $1 RETURNING tenant, context",
        workflow_id,
        now,
    )
    # The failed step and those cancelled by the failure: their dependencies
    # had completed, so they are ready again at once.
    await conn.execute(
        """UPDATE qftrio_jobs SET status = 'pending', attempt = 0, scheduled_at = $3, updated_at = $3,
            context = $4::jsonb, locked_until = NULL, lease_token = NULL, worker_id = NULL
        WHERE workflow_id = $1 AND (status = 'cancelled' OR id = $2)""",
        workflow_id,
        failed_job,
        now,
        row["context"],
    )
    waiting = await conn.fetch(
        """UPDATE qftrio_workflow_steps SET state = 'waiting' WHERE workflow_id = $1 AND state = 'cancelled'
        RETURNING name, remaining""",
        workflow_id,
    )
    ready = [r["name"] for r in waiting if r["remaining"] == 0]
    await _enqueue_steps(conn, workflow_id, row["tenant"], ready, row["context"], now)
    await _notify(conn, [WORKFLOW_QUEUE])


async def _build_workflows(conn: asyncpg.Connection, rows: Sequence[asyncpg.Record], *, jobs: bool) -> list[Workflow]:
    """Workflows from their rows, with their steps (and jobs), in three
    statements whatever the number of workflows."""
    if not rows:
        return []
    ids = [r["id"] for r in rows]
    steps: dict[uuid.UUID, list[asyncpg.Record]] = {i: [] for i in ids}
    for step_row in await conn.fetch(
        """SELECT workflow_id, name, kind, payload, depends_on, max_attempts, state, job_id
        FROM qftrio_workflow_steps WHERE workflow_id = ANY($1::uuid[]) ORDER BY workflow_id, position""",
        ids,
    ):
        steps[step_row["workflow_id"]].append(step_row)
    full: dict[uuid.UUID, Job] = {}
    job_status: dict[uuid.UUID, str] = {}
    if jobs:
        for job_row in await conn.fetch(
            f"SELECT {_JOB_COLUMNS} FROM qftrio_jobs WHERE workflow_id = ANY($1::uuid[])", ids
        ):
            full[job_row["id"]] = _job(job_row)
            job_status[job_row["id"]] = job_row["status"]
    else:
        for job_row in await conn.fetch("SELECT id, status FROM qftrio_jobs WHERE workflow_id = ANY($1::uuid[])", ids):
            job_status[job_row["id"]] = job_row["status"]
    out = []
    for row in rows:
        built = []
        for s in steps[row["id"]]:
            job_id = s["job_id"]
            if job_id is not None:
                status = StepStatus(job_status.get(job_id, Status.PENDING.value))
            else:
                status = StepStatus(s["state"])
            built.append(
                WorkflowStep(
                    name=s["name"],
                    kind=s["kind"],
                    payload=s["payload"],
                    depends_on=tuple(s["depends_on"]),
                    max_attempts=s["max_attempts"],
                    status=status,
                    job_id=None if job_id is None else str(job_id),
                    job=full.get(job_id) if job_id is not None else None,
                )
            )
        out.append(
            Workflow(
                id=str(row["id"]),
                tenant=row["tenant"],
                name=row["name"],
                status=WorkflowStatus(row["status"]),
                context=row["context"],
                steps=tuple(built),
                created_at=row["created_at"],
                updated_at=row["updated_at"],
            )
        )
    return out


async def _load_workflow(
    conn: asyncpg.Connection, workflow_id: uuid.UUID, *, tenant: str | None = None, jobs: bool = True
) -> Workflow | None:
    row = await conn.fetchrow(f"SELECT {_WORKFLOW_COLUMNS} FROM qftrio_workflows WHERE id = $1", workflow_id)
    if row is None or (tenant is not None and row["tenant"] != tenant):
        return None
    return (await _build_workflows(conn, [row], jobs=jobs))[0]


class PostgresStore(Store):
    """See the module docstring. Open it with :func:`open_postgres_store`.

    Args:
        db: the connection pool.
        url: the database, for the LISTEN connection.
        timeout: client-side network timeout (connecting, waiting for a pooled
            connection, closing); None disables it.
        listener_keepalive_secs: how often an idle LISTEN connection is checked.
    """

    def __init__(
        self,
        db: pgasync.Database,
        *,
        url: str,
        timeout: float | None = 10.0,
        listener_keepalive_secs: float = 30.0,
    ) -> None:
        self._db = db
        self._url = url
        self._timeout = timeout
        self._keepalive = listener_keepalive_secs
        #: Backend pid of the current LISTEN connection (None when there is
        #: none); for operators and tests.
        self.listener_pid: int | None = None

    # -- lifecycle ---------------------------------------------------------

    async def aclose(self) -> None:
        await self._db.aclose()

    async def ping(self) -> None:
        await self._db.fetchval("SELECT 1")

    async def run_listener(
        self,
        on_notify: Callable[[str], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        min_backoff_secs: float = 0.1,
        max_backoff_secs: float = 5.0,
    ) -> None:
        """Call ``on_notify(queue)`` for the queues other servers make work
        ready on, through one dedicated LISTEN connection; runs until cancelled.

        When the connection is lost (a restart, a failover,
        ``pg_terminate_backend``) it reconnects by itself, with exponential
        backoff and jitter. Whatever was notified meanwhile is lost, so after
        every connection but a first one that succeeded at once it calls
        ``on_notify(ALL_QUEUES)`` (``"*"``): wake every queue. Notifications
        are coalesced while ``on_notify`` catches up; a flood of distinct
        queues also collapses into ``"*"``.

        ``task_status.started()`` is called once the first attempt to connect
        is over, successful or not: a server can start while the database is
        down, its long-polls falling back on their safety poll.
        """
        started = False
        missed = False  # whether notifications may have been lost
        backoff = min_backoff_secs
        while True:
            try:
                async with pgasync.open_listener(self._url, CHANNEL, timeout=self._timeout) as listener:
                    self.listener_pid = listener.backend_pid
                    log.debug("listening on %s (backend %s)", CHANNEL, self.listener_pid)
                    if not started:
                        task_status.started()
                        started = True
                    if missed:
                        on_notify(ALL_QUEUES)
                    backoff = min_backoff_secs
                    while True:
                        for queue in sorted(await listener.receive(keepalive_secs=self._keepalive)):
                            on_notify(queue)
            except errors.Unavailable as exc:
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
            finally:
                self.listener_pid = None
            missed = True
            if not started:
                task_status.started()
                started = True
            await trio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(max_backoff_secs, backoff * 2)

    # -- application side --------------------------------------------------

    async def jobs_insert(self, jobs: Sequence[NewJob], *, now: float) -> list[Inserted]:
        if not jobs:
            return []
        # One statement (and, for keys taken already, a read of their jobs):
        # no transaction around it, which would cost two more round trips.
        return await self._db.run(self._inserter(jobs, now), transaction=False)

    async def jobs_insert_claiming(
        self, jobs: Sequence[NewJob], *, now: float, claims: Sequence[ClaimRequest]
    ) -> tuple[list[Inserted], list[list[Lease]]]:
        if (
            jobs
            and len(claims) == 1
            and claims[0].limit > 0
            and all(
                j.queue == claims[0].queue and j.idempotency_key is None and j.workflow_id is None for j in jobs
            )
        ):
            return await self._insert_handing_over(jobs, now=now, claim=claims[0])
        insert = self._inserter(jobs, now) if jobs else None

        async def insert_claiming(conn: asyncpg.Connection) -> tuple[list[Inserted], list[list[Lease]]]:
            inserted = await insert(conn) if insert is not None else []
            claimed = []
            for c in claims:
                rows = await conn.fetch(
                    _CLAIM_SQL, c.queue, now, c.limit, float(c.lease_secs), c.worker_id, LEASE_EXPIRED
                ) if c.limit > 0 else []  # fmt: skip
                claimed.append(_leases(rows))
            return inserted, claimed

        return await self._db.run(insert_claiming)

    async def _insert_handing_over(
        self, jobs: Sequence[NewJob], *, now: float, claim: ClaimRequest
    ) -> tuple[list[Inserted], list[list[Lease]]]:
        """:meth:`jobs_insert_claiming` for one long-poll and jobs of its
        queue, in one statement (one round trip): the due jobs it takes are
        inserted claimed already. Only when nothing else in the queue is
        claimable, which is what a parked poll leaves behind; otherwise the
        jobs are inserted pending and the claim runs after, as a claim."""
        ids = [uuid.uuid4() for _ in jobs]
        rows = await self._db.fetch(
            _INSERT_HANDING_OVER_SQL,
            ids,
            [j.tenant for j in jobs],
            claim.queue,
            now,
            [j.kind for j in jobs],
            [j.payload for j in jobs],
            [j.priority for j in jobs],
            [j.max_attempts for j in jobs],
            [j.scheduled_at for j in jobs],
            claim.limit,
            float(claim.lease_secs),
            claim.worker_id,
            CHANNEL,
        )
        by_id = {row["id"]: row for row in rows}
        inserted = [Inserted(job=_job(by_id[job_id]), created=True) for job_id in ids]
        if rows and rows[0]["older_found"]:
            claimed = await self._db.fetch(
                _CLAIM_SQL, claim.queue, now, claim.limit, float(claim.lease_secs), claim.worker_id, LEASE_EXPIRED
            )
            return inserted, [_leases(claimed)]
        return inserted, [_leases([row for row in rows if row["status"] == Status.RUNNING.value])]

    def _inserter(
        self, jobs: Sequence[NewJob], now: float
    ) -> Callable[[asyncpg.Connection], Awaitable[list[Inserted]]]:
        """The asyncio-flavoured body of :meth:`jobs_insert`, to run in a
        transaction."""
        # Within a batch, a repeated (tenant, key) stands for its first occurrence.
        first_of: dict[tuple[str, str], int] = {}
        alias: dict[int, int] = {}
        fresh: list[int] = []
        for i, new in enumerate(jobs):
            if new.idempotency_key is not None:
                key = (new.tenant, new.idempotency_key)
                if key in first_of:
                    alias[i] = first_of[key]
                    continue
                first_of[key] = i
            fresh.append(i)
        ids = [uuid.uuid4() for _ in fresh]
        rows = [jobs[i] for i in fresh]
        workflow_ids = []
        for new in rows:
            wf = None
            if new.workflow_id is not None:
                wf = _uuid(new.workflow_id)
                if wf is None:
                    raise errors.InvalidInput(f"workflow_id: not a UUID: {new.workflow_id!r}")
            workflow_ids.append(wf)

        async def insert(conn: asyncpg.Connection) -> list[Inserted]:
            # The NOTIFY of the new jobs' queues is part of the statement
            # (delivered when it commits): no round trip of its own.
            created_rows = await conn.fetch(
                f"""WITH inserted AS (
                    INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, priority, max_attempts,
                        scheduled_at, idempotency_key, workflow_id, step, context,
                        status, attempt, created_at, updated_at)
                    SELECT u.*, 'pending', 0, $13::float8, $13::float8
                    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::int[], $7::int[],
                                $8::float8[], $9::text[], $10::uuid[], $11::text[], $12::jsonb[]) AS u
                    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
                    RETURNING {_JOB_COLUMNS}
                ), notified AS (
                    SELECT count(pg_notify($14, q.queue)) FROM (SELECT DISTINCT queue FROM inserted) AS q
                )
                SELECT inserted.* FROM inserted, notified""",
                ids,
                [n.tenant for n in rows],
                [n.queue for n in rows],
                [n.kind for n in rows],
                [n.payload for n in rows],
                [n.priority for n in rows],
                [n.max_attempts for n in rows],
                [n.scheduled_at for n in rows],
                [n.idempotency_key for n in rows],
                workflow_ids,
                [n.step for n in rows],
                [n.context for n in rows],
                now,
                CHANNEL,
            )
            by_id = {row["id"]: _job(row) for row in created_rows}
            existing: dict[tuple[str, str], Job] = {}
            missing = [n for job_id, n in zip(ids, rows) if job_id not in by_id]
            if missing:
                # Their keys were taken (maybe by a transaction that committed
                # while we waited on it): return those jobs.
                found = await conn.fetch(
                    f"""SELECT {_JOB_COLUMNS} FROM qftrio_jobs
                    WHERE (tenant, idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))""",
                    [n.tenant for n in missing],
                    [n.idempotency_key for n in missing],
                )
                for row in found:
                    existing[(row["tenant"], row["idempotency_key"])] = _job(row)
                if len(existing) < len(missing):
                    # the conflicting job vanished before we could read it (pruned)
                    raise errors.Unavailable("an idempotency key changed hands during the insert; try again")
            out_fresh: dict[int, Inserted] = {}
            for i, job_id, new in zip(fresh, ids, rows):
                if job_id in by_id:
                    out_fresh[i] = Inserted(job=by_id[job_id], created=True)
                else:
                    assert new.idempotency_key is not None
                    out_fresh[i] = Inserted(job=existing[(new.tenant, new.idempotency_key)], created=False)
            return [
                out_fresh[i] if i in out_fresh else Inserted(job=out_fresh[alias[i]].job, created=False)
                for i in range(len(jobs))
            ]

        return insert

    async def job_get(self, job_id: str, *, tenant: str | None = None) -> Job | None:
        key = _uuid(job_id)
        if key is None:
            return None
        if tenant is None:
            rows = await self._db.fetch(f"SELECT {_JOB_COLUMNS} FROM qftrio_jobs WHERE id = $1", key)
        else:
            rows = await self._db.fetch(
                f"SELECT {_JOB_COLUMNS} FROM qftrio_jobs WHERE id = $1 AND tenant = $2", key, tenant
            )
        return _job(rows[0]) if rows else None

    async def jobs_list(
        self,
        *,
        tenant: str,
        queue: str | None = None,
        status: Status | None = None,
        kind: str | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
    ) -> list[Job]:
        sql, args = _page_query(
            _JOB_COLUMNS,
            "qftrio_jobs",
            tenant,
            {"queue": queue, "status": Status(status).value if status is not None else None, "kind": kind},
            before,
            limit,
        )
        return [_job(row) for row in await self._db.fetch(sql, *args)]

    async def _owned_transition(
        self,
        job_id: str,
        tenant: str,
        sql: str,
        args: tuple[Any, ...],
        allowed: tuple[Status, ...],
        verb: str,
        *,
        before: _StepRule | None = None,
        after: _StepRule | None = None,
    ) -> Job | None:
        """Lock the job, check its status, apply *sql*. For a workflow step,
        its workflow is locked first, and ``before(conn, job id, workflow id,
        status)`` may take over (returning the job) while ``after`` runs once
        *sql* has."""
        key = _uuid(job_id)
        if key is None:
            return None

        async def transition(conn: asyncpg.Connection) -> Job | None:
            # a step's workflow never changes: reading it unlocked is safe
            workflow_id = await conn.fetchval(
                "SELECT workflow_id FROM qftrio_jobs WHERE id = $1 AND tenant = $2", key, tenant
            )
            if workflow_id is not None:
                await conn.execute("SELECT 1 FROM qftrio_workflows WHERE id = $1 FOR UPDATE", workflow_id)
            row = await conn.fetchrow(
                "SELECT status FROM qftrio_jobs WHERE id = $1 AND tenant = $2 FOR UPDATE", key, tenant
            )
            if row is None:
                return None
            status = Status(row["status"])
            if status not in allowed:
                only = " or ".join(s.value for s in allowed)
                raise errors.Conflict(f"job {job_id} is {row['status']}; only {only} jobs can be {verb}")
            if workflow_id is not None and before is not None:
                taken = await before(conn, key, workflow_id, status)
                if taken is not None:
                    return taken
            job = _job(await conn.fetchrow(sql, key, *args))
            if workflow_id is not None and after is not None:
                await after(conn, key, workflow_id, status)
            if job.status is Status.PENDING:
                await _notify(conn, [job.queue])
            return job

        return await self._db.run(transition)

    async def job_cancel(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        # The lease token and locked_until stay: a late heartbeat of the
        # running attempt must still be told "cancelled", not "conflict".
        return await self._owned_transition(
            job_id,
            tenant,
            f"""UPDATE qftrio_jobs SET status = 'cancelled', updated_at = $2
            WHERE id = $1 RETURNING {_JOB_COLUMNS}""",
            (now,),
            (Status.PENDING, Status.RUNNING),
            "cancelled",
            # a step cancelled by hand cancels its workflow
            after=lambda conn, key, workflow_id, status: _end_workflow(
                conn, workflow_id, WorkflowStatus.CANCELLED, now
            ),
        )

    async def job_retry(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        async def resume(
            conn: asyncpg.Connection, key: uuid.UUID, workflow_id: uuid.UUID, status: Status
        ) -> Job | None:
            workflow_status = await conn.fetchval("SELECT status FROM qftrio_workflows WHERE id = $1", workflow_id)
            if workflow_status == WorkflowStatus.CANCELLED.value:
                raise errors.Conflict(
                    f"job {job_id} is a step of workflow {workflow_id}, which was cancelled; "
                    "a cancelled workflow does not resume"
                )
            if workflow_status != WorkflowStatus.FAILED.value:
                return None
            if status is not Status.FAILED:
                failed = await conn.fetchrow(
                    "SELECT step, id FROM qftrio_jobs WHERE workflow_id = $1 AND status = 'failed' LIMIT 1",
                    workflow_id,
                )
                raise errors.Conflict(
                    f"workflow {workflow_id} failed at step {failed['step']!r}; "
                    f"retry that step's job ({failed['id']}) to resume it"
                )
            await _resume_workflow(conn, workflow_id, key, now)
            return _job(await conn.fetchrow(f"SELECT {_JOB_COLUMNS} FROM qftrio_jobs WHERE id = $1", key))

        return await self._owned_transition(
            job_id,
            tenant,
            f"""UPDATE qftrio_jobs SET status = 'pending', attempt = 0, scheduled_at = $2, updated_at = $2,
                locked_until = NULL, lease_token = NULL, worker_id = NULL
            WHERE id = $1 RETURNING {_JOB_COLUMNS}""",
            (now,),
            (Status.FAILED, Status.CANCELLED),
            "retried",
            before=resume,
        )

    async def queues_stats(self, *, tenant: str, now: float, queue: str | None = None) -> list[QueueStats]:
        sql = """SELECT queue,
                count(*) FILTER (WHERE status = 'pending') AS pending,
                count(*) FILTER (WHERE status = 'running') AS running,
                count(*) FILTER (WHERE status = 'completed') AS completed,
                count(*) FILTER (WHERE status = 'failed') AS failed,
                count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
                min(scheduled_at) FILTER (WHERE status = 'pending' AND scheduled_at <= $2) AS oldest_ready_at,
                least(min(scheduled_at) FILTER (WHERE status = 'pending' AND scheduled_at > $2),
                      min(locked_until) FILTER (WHERE status = 'running')) AS next_available_at
            FROM qftrio_jobs WHERE tenant = $1 {} GROUP BY queue ORDER BY queue COLLATE "C"
        """
        if queue is None:
            rows = await self._db.fetch(sql.format(""), tenant, now)
        else:
            rows = await self._db.fetch(sql.format("AND queue = $3"), tenant, now, queue)
        out = [
            QueueStats(
                queue=row["queue"],
                counts={s.value: row[s.value] for s in Status},
                oldest_ready_at=row["oldest_ready_at"],
                next_available_at=row["next_available_at"],
            )
            for row in rows
        ]
        if queue is not None and not out:
            zero = {s.value: 0 for s in Status}
            out = [QueueStats(queue=queue, counts=zero, oldest_ready_at=None, next_available_at=None)]
        return out

    # -- worker side -------------------------------------------------------

    async def jobs_claim(
        self, queue: str, *, limit: int, lease_secs: float, worker_id: str | None, now: float
    ) -> list[Lease]:
        if limit <= 0:
            return []
        rows = await self._db.fetch(_CLAIM_SQL, queue, now, limit, float(lease_secs), worker_id, LEASE_EXPIRED)
        return _leases(rows)

    async def queue_next_available_at(self, queue: str, *, now: float) -> float | None:
        # A lease counts even if it already ran out: its job is claimable now.
        # A job due later was scheduled ahead of its creation, which keeps
        # this on qftrio_jobs_scheduled_idx (migration 0003).
        return await self._db.fetchval(
            _NEXT_AVAILABLE_SQL,
            queue,
            now,
        )

    async def _current_first(
        self,
        current_sql: str,
        every_sql: str,
        columns: list[list[Any]],
        now: float,
        applied: Callable[[asyncpg.Record], Any],
    ) -> list[Any]:
        """A report batch in at most two statements: *current_sql* changes
        the items whose lease is current without locking them and returns
        their ``ord``; the items it left go through *every_sql*, which reads
        each one's outcome. One row per item, in order (``applied(row)`` for
        the first kind)."""
        rows: list[Any] = [None] * len(columns[0])
        for row in await self._db.fetch(current_sql, *columns, now):
            rows[row["ord"] - 1] = applied(row)
        rest = [k for k, row in enumerate(rows) if row is None]
        if rest:
            others = await self._db.fetch(every_sql, *[[column[k] for k in rest] for column in columns], now)
            for k, row in zip(rest, others, strict=True):
                rows[k] = row
        return rows

    async def jobs_heartbeat(self, items: Sequence[HeartbeatItem], *, now: float) -> list[HeartbeatResult]:
        if not items:
            return []
        # (the same job twice in a batch: one of the two is extended first)
        rows = await self._current_first(
            _HEARTBEAT_CURRENT_SQL,
            _HEARTBEAT_SQL,
            [
                [_uuid_param(i.job_id) for i in items],
                [_uuid_param(i.lease_token) for i in items],
                [float(i.extend_secs) for i in items],
            ],
            now,
            lambda row: {"status": Status.RUNNING.value, "current": True, "locked_until": row["locked_until"]},
        )
        out = []
        for row in rows:
            if row["status"] is None:
                out.append(HeartbeatResult(outcome=Outcome.NOT_FOUND))
            elif not row["current"]:
                out.append(HeartbeatResult(outcome=Outcome.CONFLICT))
            else:
                out.append(
                    HeartbeatResult(outcome=Outcome.OK, status=STATUS_OF[row["status"]], locked_until=row["locked_until"])
                )
        return out

    async def jobs_complete(self, items: Sequence[CompleteItem], *, now: float) -> list[ReportResult]:
        if not items:
            return []
        # A (job, token) pair repeated in one batch is sent once; the repeats
        # are replays of it.
        first: dict[tuple[str, str], int] = {}
        unique: list[CompleteItem] = []
        slot: list[int] = []
        for item in items:
            pair = (item.job_id, item.lease_token)
            if pair not in first:
                first[pair] = len(unique)
                unique.append(item)
            slot.append(first[pair])

        async def complete(
            conn: asyncpg.Connection, steps: list[CompleteItem]
        ) -> tuple[list[asyncpg.Record], set[int]]:
            keys = [_uuid_param(i.job_id) for i in steps]
            await _lock_workflows_of_jobs(conn, keys)
            rows = await conn.fetch(
                _COMPLETE_SQL,
                keys,
                [_uuid_param(i.lease_token) for i in steps],
                [i.result for i in steps],
                now,
            )
            applied = [row for row in rows if row["applied"]]
            unblocked: set[int] = set()
            if applied:
                unblocked = await self._after_complete(conn, applied, now=now)
            return rows, unblocked

        # The jobs of a batch are mostly of one queue: one row (and below,
        # one result) per queue serves them all.
        done_in: dict[str, dict[str, Any]] = {}

        def done(row: asyncpg.Record) -> dict[str, Any]:
            queue = row["queue"]
            if queue not in done_in:
                done_in[queue] = {"status": Status.COMPLETED.value, "queue": queue, "current": True, "applied": True, "step": False}
            return done_in[queue]

        rows = await self._current_first(
            _COMPLETE_CURRENT_SQL,
            _COMPLETE_PLAIN_SQL,
            [[_uuid_param(i.job_id) for i in unique], [_uuid_param(i.lease_token) for i in unique], [i.result for i in unique]],
            now,
            done,
        )
        unblocked: set[int] = set()  # positions in `unique` whose completion enqueued steps
        at = [k for k, row in enumerate(rows) if row["step"]]
        if at:
            step_rows, step_unblocked = await self._db.run(complete, [unique[k] for k in at])
            for k, row in zip(at, step_rows):
                rows[k] = row
                if row["ord"] in step_unblocked:
                    unblocked.add(k)
        results = []
        applied_in: dict[str, ReportResult] = {}
        for k, row in enumerate(rows):
            if row["status"] is None:
                results.append(ReportResult(outcome=Outcome.NOT_FOUND))
            elif not row["current"]:
                results.append(ReportResult(outcome=Outcome.CONFLICT))
            elif row["applied"] and k in unblocked:
                results.append(
                    ReportResult(
                        outcome=Outcome.OK,
                        queue=row["queue"],
                        status=Status.COMPLETED,
                        applied=True,
                        ready_queues=(WORKFLOW_QUEUE,),
                    )
                )
            elif row["applied"]:
                queue = row["queue"]
                result = applied_in.get(queue)
                if result is None:
                    result = applied_in[queue] = ReportResult(
                        outcome=Outcome.OK, queue=queue, status=Status.COMPLETED, applied=True
                    )
                results.append(result)
            elif row["status"] == Status.COMPLETED.value:
                results.append(ReportResult(outcome=Outcome.OK, queue=row["queue"], status=Status.COMPLETED))
            else:
                results.append(ReportResult(outcome=Outcome.CONFLICT))
        out = []
        seen: set[int] = set()
        for index in slot:
            result = results[index]
            if index in seen and result.applied:
                result = ReportResult(outcome=Outcome.OK, queue=result.queue, status=result.status, applied=False)
            seen.add(index)
            out.append(result)
        return out

    async def _after_complete(
        self, conn: asyncpg.Connection, completed: list[asyncpg.Record], *, now: float
    ) -> set[int]:
        """Asyncio-flavoured, run in the completing transaction (the steps'
        workflows already locked) with the rows just completed (columns
        ``ord, workflow_id, step, result``, in batch order): advance their
        workflows. Returns the ``ord`` of the completions that enqueued
        steps."""
        unblocked = set()
        for row in completed:
            if row["workflow_id"] is not None:
                if await _step_completed(conn, row["workflow_id"], row["step"], row["result"], now):
                    unblocked.add(row["ord"])
        if unblocked:
            await _notify(conn, [WORKFLOW_QUEUE])
        return unblocked

    async def jobs_fail(self, items: Sequence[FailItem], *, now: float, retry_at: RetryAt) -> list[ReportResult]:
        if not items:
            return []
        keys = [_uuid(i.job_id) for i in items]
        tokens = [_uuid(i.lease_token) for i in items]

        async def fail(conn: asyncpg.Connection) -> list[ReportResult]:
            await _lock_workflows_of_jobs(conn, keys)
            locked = await conn.fetch(
                """SELECT id, status, lease_token, queue, attempt, max_attempts, workflow_id FROM qftrio_jobs
                WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE""",
                [k for k in keys if k is not None],
            )
            state = {row["id"]: dict(row) for row in locked}
            out: list[ReportResult] = []
            updates: dict[uuid.UUID, tuple[uuid.UUID, str, float | None, str]] = {}
            # Workflows a dead-lettered step fails, in batch order. A later
            # item of one of them finds its job cancelled with the workflow,
            # exactly as if the items had come one call at a time.
            failing: dict[uuid.UUID, None] = {}
            for item, key, token in zip(items, keys, tokens):
                row = state.get(key) if key is not None else None
                if row is None:
                    out.append(ReportResult(outcome=Outcome.NOT_FOUND))
                elif token is None or row["lease_token"] != token:
                    out.append(ReportResult(outcome=Outcome.CONFLICT))
                elif row["status"] == Status.RUNNING.value and row["workflow_id"] in failing:
                    row["status"] = Status.CANCELLED.value
                    out.append(ReportResult(outcome=Outcome.CONFLICT))
                elif row["status"] in (Status.PENDING.value, Status.FAILED.value):
                    out.append(ReportResult(outcome=Outcome.OK, queue=row["queue"], status=Status(row["status"])))
                elif row["status"] != Status.RUNNING.value:
                    out.append(ReportResult(outcome=Outcome.CONFLICT))
                else:
                    when = retry_at(row["attempt"], row["max_attempts"], item.retryable, now)
                    status = Status.FAILED if when is None else Status.PENDING
                    updates[key] = (token, status.value, when, _text(item.error))
                    row["status"] = status.value  # a repeat later in this batch is a replay
                    if status is Status.FAILED and row["workflow_id"] is not None:
                        failing[row["workflow_id"]] = None
                    out.append(ReportResult(outcome=Outcome.OK, queue=row["queue"], status=status, applied=True))
            if updates:
                ids = list(updates)
                changed = await conn.fetch(
                    """UPDATE qftrio_jobs AS j SET
                        status = u.status,
                        scheduled_at = coalesce(u.scheduled_at, j.scheduled_at),
                        locked_until = NULL,
                        error = u.error,
                        errors = j.errors || jsonb_build_array(
                            jsonb_build_object('attempt', j.attempt, 'error', u.error, 'at', $6::float8)),
                        updated_at = $6
                    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::text[])
                        AS u(id, token, status, scheduled_at, error)
                    WHERE j.id = u.id AND j.lease_token = u.token AND j.status = 'running'
                    RETURNING j.id, j.queue, j.status""",
                    ids,
                    [updates[k][0] for k in ids],
                    [updates[k][1] for k in ids],
                    [updates[k][2] for k in ids],
                    [updates[k][3] for k in ids],
                    now,
                )
                # The rows are locked, so this cannot happen; if it did, the
                # transaction must not commit half a batch.
                if len(changed) != len(ids):
                    raise RuntimeError("jobs_fail: a locked row changed under its lock")
                await _notify(conn, {row["queue"] for row in changed if row["status"] == Status.PENDING.value})
            for workflow_id in failing:
                await _end_workflow(conn, workflow_id, WorkflowStatus.FAILED, now)
            return out

        return await self._db.run(fail)

    async def jobs_reap_expired(self, *, now: float, limit: int = 1000) -> list[Reaped]:
        async def reap(conn: asyncpg.Connection) -> list[Reaped]:
            # A step dead-lettered here fails its workflow, whose row must be
            # locked before the step's (the lock order): lock the workflows
            # first, skipping those busy elsewhere; their steps wait for the
            # next round.
            workflows = [
                row["id"]
                for row in await conn.fetch(
                    """SELECT id FROM qftrio_workflows
                    WHERE id IN (SELECT workflow_id FROM qftrio_jobs
                                 WHERE status = 'running' AND locked_until < $1 AND attempt >= max_attempts
                                   AND workflow_id IS NOT NULL)
                    ORDER BY id
                    FOR UPDATE SKIP LOCKED""",
                    now,
                )
            ]
            rows = await conn.fetch(
                """WITH expired AS (
                    SELECT id FROM qftrio_jobs
                    WHERE status = 'running' AND locked_until < $1
                      AND (workflow_id IS NULL OR attempt < max_attempts OR workflow_id = ANY($4::uuid[]))
                    ORDER BY locked_until
                    LIMIT $2
                    FOR UPDATE SKIP LOCKED
                )
                UPDATE qftrio_jobs AS j SET
                    status = CASE WHEN j.attempt < j.max_attempts THEN 'pending' ELSE 'failed' END,
                    locked_until = NULL,
                    lease_token = NULL,
                    worker_id = NULL,
                    error = $3,
                    errors = j.errors || jsonb_build_array(
                        jsonb_build_object('attempt', j.attempt, 'error', $3::text, 'at', $1::float8)),
                    updated_at = $1
                FROM expired AS e
                WHERE j.id = e.id
                RETURNING j.id, j.queue, j.status, j.workflow_id""",
                now,
                limit,
                LEASE_EXPIRED,
                workflows,
            )
            await _notify(conn, {row["queue"] for row in rows if row["status"] == Status.PENDING.value})
            # One failed step per workflow, as if reaped one at a time: the
            # first fails it, the others (running too) are cancelled with it.
            failing: dict[uuid.UUID, None] = {}
            out = []
            for row in sorted(rows, key=lambda r: r["id"]):
                if row["status"] == Status.FAILED.value and row["workflow_id"] is not None:
                    if row["workflow_id"] in failing:
                        await conn.execute("UPDATE qftrio_jobs SET status = 'cancelled' WHERE id = $1", row["id"])
                        continue
                    failing[row["workflow_id"]] = None
                out.append(Reaped(job_id=str(row["id"]), queue=row["queue"], status=Status(row["status"])))
            for workflow_id in failing:
                await _end_workflow(conn, workflow_id, WorkflowStatus.FAILED, now)
            return out

        return await self._db.run(reap)

    async def jobs_prune(self, *, before: float, limit: int = 10000) -> int:
        # A workflow's jobs go only with the whole workflow (completed or
        # cancelled; failed ones stay, like dead letters), so that a
        # workflow never shows a step whose job has vanished.
        count = await self._db.fetchval(
            """WITH doomed AS (
                SELECT id FROM qftrio_jobs
                WHERE status IN ('completed', 'cancelled') AND updated_at < $1 AND workflow_id IS NULL
                ORDER BY updated_at
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            ), deleted AS (
                DELETE FROM qftrio_jobs WHERE id IN (SELECT id FROM doomed) RETURNING 1
            )
            SELECT count(*) FROM deleted""",
            before,
            limit,
        )
        deleted = int(count)
        if deleted >= limit:
            return deleted

        async def prune_workflows(conn: asyncpg.Connection) -> int:
            done = 0
            finished = await conn.fetch(
                """SELECT id FROM qftrio_workflows
                WHERE status IN ('completed', 'cancelled') AND updated_at < $1
                ORDER BY updated_at
                LIMIT 100
                FOR UPDATE SKIP LOCKED""",
                before,
            )
            for row in finished:
                if deleted + done >= limit:
                    break
                jobs = await conn.fetchval(
                    """WITH gone AS (DELETE FROM qftrio_jobs WHERE workflow_id = $1 RETURNING 1)
                    SELECT count(*) FROM gone""",
                    row["id"],
                )
                # its steps and edges go with it (ON DELETE CASCADE)
                await conn.execute("DELETE FROM qftrio_workflows WHERE id = $1", row["id"])
                done += int(jobs)
            return done

        return deleted + await self._db.run(prune_workflows)

    # -- workflows ---------------------------------------------------------

    async def workflow_create(self, workflow: NewWorkflow, *, now: float) -> Workflow:
        workflow_id = uuid.uuid4()
        roots = {s.name: uuid.uuid4() for s in workflow.steps if not s.depends_on}
        steps = workflow.steps

        async def create(conn: asyncpg.Connection) -> Workflow:
            await conn.execute(
                """INSERT INTO qftrio_workflows (id, tenant, name, status, context, steps_total, steps_completed,
                    created_at, updated_at)
                VALUES ($1, $2, $3, 'running', $4::jsonb, $5, 0, $6, $6)""",
                workflow_id,
                workflow.tenant,
                workflow.name,
                workflow.context,
                len(steps),
                now,
            )
            await conn.execute(
                """INSERT INTO qftrio_workflow_steps (workflow_id, name, position, kind, payload, depends_on,
                    max_attempts, state, remaining, job_id)
                SELECT $1, u.name, u.position, u.kind, u.payload, u.depends_on::jsonb, u.max_attempts, u.state,
                       u.remaining, u.job_id
                FROM unnest($2::text[], $3::int[], $4::text[], $5::jsonb[], $6::text[], $7::int[], $8::text[],
                            $9::int[], $10::uuid[])
                    AS u(name, position, kind, payload, depends_on, max_attempts, state, remaining, job_id)""",
                workflow_id,
                [s.name for s in steps],
                list(range(len(steps))),
                [s.kind for s in steps],
                [s.payload for s in steps],
                # JSON text: asyncpg would take a list of lists for a 2-D array
                [_json.dumps_str(list(s.depends_on)) for s in steps],
                [s.max_attempts for s in steps],
                ["enqueued" if s.name in roots else "waiting" for s in steps],
                [len(s.depends_on) for s in steps],
                [roots.get(s.name) for s in steps],
            )
            edges = [(dep, s.name) for s in steps for dep in s.depends_on]
            if edges:
                await conn.execute(
                    """INSERT INTO qftrio_workflow_edges (workflow_id, step, dependent)
                    SELECT $1, u.step, u.dependent FROM unnest($2::text[], $3::text[]) AS u(step, dependent)""",
                    workflow_id,
                    [e[0] for e in edges],
                    [e[1] for e in edges],
                )
            first = [s for s in steps if s.name in roots]
            await conn.execute(
                """INSERT INTO qftrio_jobs (id, tenant, queue, kind, payload, status, priority, attempt,
                    max_attempts, scheduled_at, created_at, updated_at, workflow_id, step, context)
                SELECT u.id, $2, $3, u.kind, u.payload, 'pending', 0, 0, u.max_attempts, $4, $4, $4, $1, u.step,
                       $5::jsonb
                FROM unnest($6::uuid[], $7::text[], $8::jsonb[], $9::int[], $10::text[])
                    AS u(id, kind, payload, max_attempts, step)""",
                workflow_id,
                workflow.tenant,
                WORKFLOW_QUEUE,
                now,
                workflow.context,
                [roots[s.name] for s in first],
                [s.kind for s in first],
                [s.payload for s in first],
                [s.max_attempts for s in first],
                [s.name for s in first],
            )
            await _notify(conn, [WORKFLOW_QUEUE])
            loaded = await _load_workflow(conn, workflow_id)
            assert loaded is not None
            return loaded

        return await self._db.run(create)

    async def workflow_get(self, workflow_id: str, *, tenant: str | None = None, jobs: bool = True) -> Workflow | None:
        key = _uuid(workflow_id)
        if key is None:
            return None

        async def get(conn: asyncpg.Connection) -> Workflow | None:
            # one snapshot for the workflow, its steps and its jobs
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await _load_workflow(conn, key, tenant=tenant, jobs=jobs)

        return await self._db.run(get, transaction=False)

    async def workflows_list(
        self,
        *,
        tenant: str,
        status: WorkflowStatus | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
    ) -> list[Workflow]:
        sql, args = _page_query(
            _WORKFLOW_COLUMNS,
            "qftrio_workflows",
            tenant,
            {"status": WorkflowStatus(status).value if status is not None else None},
            before,
            limit,
        )

        async def list_(conn: asyncpg.Connection) -> list[Workflow]:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await _build_workflows(conn, await conn.fetch(sql, *args), jobs=False)

        return await self._db.run(list_, transaction=False)

    async def workflow_cancel(self, workflow_id: str, *, tenant: str, now: float) -> Workflow | None:
        key = _uuid(workflow_id)
        if key is None:
            return None

        async def cancel(conn: asyncpg.Connection) -> Workflow | None:
            status = await conn.fetchval(
                "SELECT status FROM qftrio_workflows WHERE id = $1 AND tenant = $2 FOR UPDATE", key, tenant
            )
            if status is None:
                return None
            if status != WorkflowStatus.RUNNING.value:
                raise errors.Conflict(f"workflow {workflow_id} is {status}; only running workflows can be cancelled")
            await _end_workflow(conn, key, WorkflowStatus.CANCELLED, now)
            return await _load_workflow(conn, key)

        return await self._db.run(cancel)


@asynccontextmanager
async def open_postgres_store(
    url: str,
    *,
    pool_size: int = 10,
    migrate: bool = True,
    timeout: float | None = 10.0,
    statement_timeout: float | None = 30.0,
) -> AsyncIterator[PostgresStore]:
    """Open the PostgreSQL store on *url*; must run inside
    ``trio_asyncio.open_loop()``.

    Args:
        url: ``postgresql://user:password@host:port/database``.
        pool_size: the most connections this store opens (the LISTEN
            connection of :meth:`~PostgresStore.run_listener` comes on top).
        migrate: apply missing migrations first (under an advisory lock, so
            servers starting together are safe). With False, a schema that is
            not current is a :class:`~qftrio.errors.ConfigError`.
        timeout: client-side network timeout in seconds (connect, wait for a
            pooled connection, close); None disables it, as tests on Trio's
            virtual clock must (see :mod:`.pgasync`).
        statement_timeout: server-side bound on each statement.

    Raises:
        Unavailable: the database cannot be reached.
        ConfigError: no trio-asyncio loop, or an outdated schema with
            ``migrate=False``.
    """
    pgasync.running_loop()
    async with pgasync.open_database(
        url, max_size=pool_size, timeout=timeout, statement_timeout=statement_timeout
    ) as db:
        if migrate:
            await db.run(_migrate_on, transaction=False)
        else:
            missing = await db.run(_pending_on, transaction=False)
            if missing:
                raise errors.ConfigError(
                    f"the database schema is not up to date (missing {', '.join(missing)}): run `qftrio migrate`"
                )
        store = PostgresStore(db, url=url, timeout=timeout)
        try:
            yield store
        finally:
            await store.aclose()
